"""The commands end to end: one-line errors with exit code 2, Ctrl-C and a closed pipe (in their own
processes), mistakes in a config or a device (in this one, as the scripts run them)."""

import os
import subprocess
import sys

import pytest
import torch

from minitf.errors import ConfigError
from minitf.system.runtime import resolve_device
from tests.support import ROOT
from tests.support.processes import command, one_line, script

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_run_main_handles_ctrl_c_and_a_closed_pipe(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import sys\nfrom minitf.cli.common import run_main\n"
        "def main():\n"
        "    if sys.argv[1] == 'int':\n        raise KeyboardInterrupt\n"
        "    if sys.argv[1] == 'exec':\n        exec('raise KeyboardInterrupt')\n"
        "    for i in range(10**6):\n        print('line', i)\n"
        "run_main(main)\n"
    )
    r = script(str(prog), "int")
    assert r.returncode == 130 and r.stderr.strip() == "interrupted"
    # Ctrl-C landing in source run by exec (dataclasses build their methods so, while a command
    # imports fastapi): CPython marks that interrupt unhandled, and a process run as `python -m`
    # (as `python -m minitf` is) would end by SIGINT (-2) after run_main caught it, not with 130
    r = subprocess.run(
        [sys.executable, "-m", "prog", "exec"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert r.returncode == 130 and r.stderr.strip() == "interrupted", (r.returncode, r.stderr)
    p = subprocess.Popen(
        f"{sys.executable} {prog} pipe | head -n 2",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out, err = p.communicate(timeout=60)
    assert out.splitlines() == ["line 0", "line 1"] and "Traceback" not in err and "Error" not in err


# The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors.


def test_errors_are_one_line_and_exit_2_through_python_m(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "minitf", "train", "--config", "tinny"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: no config file or recipe named 'tinny'")
    assert r.stderr.count("\n") == 1


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_config_mistakes_through_the_command(tmp_path):
    (tmp_path / "keys.yaml").write_text("model:\n  1: 2\n")
    line = one_line(command("train", "--config", str(tmp_path / "keys.yaml")))
    assert line == (
        f"error: {tmp_path / 'keys.yaml'}: a key of section 'model' is 1, a number, not a word; "
        f"keys are words, e.g. model.attention"
    )
    line = one_line(command("train", "--config", str(tmp_path)))
    assert line == f"error: config {str(tmp_path)!r} is a directory; pass a YAML file"
    line = one_line(command("train", "--config", "tiny", "run.seed=18446744073709551616"))
    assert line == "error: run.seed must be an integer in [0, 2**63 - 1], got 18446744073709551616"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: cuda:0 is fine")
def test_a_device_this_machine_lacks_is_one_line_in_every_command(tiny_run):
    without = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
    want = {
        "cuda:0": f"error: --device cuda:0 but {without}; use --device cpu (or auto)",
        "vulkan:0": "error: --device 'vulkan:0' is not one of auto, cpu, cuda, cuda:N, mps",
    }
    for name in ("generate", "evaluate", "explore", "serve"):
        for device, line in want.items():
            assert one_line(command(name, "--run", tiny_run, "--device", device)) == line, name
    with pytest.raises(ConfigError, match="^run.device=cuda but "):
        resolve_device("cuda")


def test_plot_draws_rows_without_val_bpb(tmp_path, tiny_run):
    import json

    run = tmp_path / "old"
    run.mkdir()
    rows = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "val_bpb"}) + "\n" for r in rows)
    )
    r = command("plot", "--run", run, "--out", tmp_path / "loss.png")
    assert r.returncode == 0, r.stderr[-1500:]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_script_mistakes_after_training(tiny_run, tmp_path):
    line = one_line(command("generate", "--run", tiny_run, "--seed", 2**64))
    assert line == f"error: sample.seed must be an integer in [0, 2**63 - 1], got {2**64}"
    line = one_line(command("generate", "--run", tiny_run, "--seed", "-1"))
    assert line == "error: sample.seed must be an integer in [0, 2**63 - 1], got -1"
    (tmp_path / "notes.txt").write_text("mine")
    line = one_line(command("export", "--run", tiny_run, "--out", tmp_path / "notes.txt"))
    assert line == f"error: --out {tmp_path / 'notes.txt'} is a file; --out names a directory to create"
    assert (tmp_path / "notes.txt").read_text() == "mine"
