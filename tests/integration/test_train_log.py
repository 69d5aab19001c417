"""What a run logs (metrics.jsonl, steps.jsonl, TensorBoard), fine-tuning from a local GPT-2
directory (run.init_from), and the note when a time budget bought far fewer steps than usual."""

import json
import math
import re
import shlex
import subprocess

import pytest
import torch

import minitf
from minitf import trainer
from minitf.training.metrics import METRICS, STEPS, read_rows
from tests.support import processes
from tests.support.runs import copy_run, fake_monotonic, slow_clock, tiny_config


def test_steps_are_logged_every_log_every_and_resume_drops_the_future(tmp_path, run_8_steps):
    run = copy_run(run_8_steps, tmp_path / "run")  # 8 steps, log_every 2
    rows = read_rows(run / STEPS)
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    assert all(math.isfinite(r["loss"]) and r["lr"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["lr"] != rows[-1]["lr"]  # the schedule moved
    assert [r["step"] for r in read_rows(run / METRICS)] == [4, 8]  # evaluations stay in metrics.jsonl
    # a resume from step 4 (as after a kill) drops the rows past it, then logs them anew
    (run / STEPS).write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 10, "lo')  # a cut line
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["step"] == 8
    minitf.train(run, resume=True, overrides=["train.max_steps=12"], log=lambda *a: None)
    assert [r["step"] for r in read_rows(run / STEPS)] == [2, 4, 6, 8, 10, 12]


def test_tensorboard_event_files_hold_the_curves(tmp_path, corpus):
    pytest.importorskip("tensorboard", reason="pip install -e '.[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.logger=tensorboard"), log=lambda *a: None)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "eval/val_loss", "eval/val_bpb"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]
    steps = read_rows(run / STEPS)
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([r["lr"] for r in steps])
    evals = read_rows(run / METRICS)
    assert [e.value for e in events.Scalars("eval/val_bpb")] == pytest.approx([r["val_bpb"] for r in evals])


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def as_printed(line: str, cwd) -> subprocess.CompletedProcess:
    """Run a `minitf ...` command line exactly as a user would paste it: split as a shell splits it,
    then the `minitf` entry point's main over the words, in this process (processes.command)."""
    argv = shlex.split(line)
    assert argv[0] == "minitf", line
    return processes.command(*argv[1:], cwd=cwd)


def printed(lines: list[str], prefix: str) -> str:
    """The command that the line containing `prefix` prints after it."""
    line = next(line for text in lines for line in text.splitlines() if prefix in line)
    return line.split(prefix, 1)[1].strip()


def test_the_train_longer_and_sample_commands_work_as_printed(tmp_path, corpus, monkeypatch):
    run_dir = tmp_path / "my runs" / "short"  # a space: the printed command must quote it
    lines = []
    with monkeypatch.context() as m:
        slow_clock(m, seconds_per_step=1.0)  # 4 steps in 4 s, whatever the load on this machine
        minitf.train(
            tiny_config(run_dir, corpus, "train.max_seconds=4", "train.max_steps=100000", "train.typical_steps=10000"),
            log=lines.append,
        )
    steps = torch.load(run_dir / "state.pt", weights_only=True)["step"]
    command = printed(lines, "To train longer: ")
    assert command == f"minitf train --resume '{run_dir}' train.max_seconds=8"
    with monkeypatch.context() as m:
        slow_clock(m, seconds_per_step=1.0)  # 4 more seconds: 4 more steps
        r = as_printed(command, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"resuming {run_dir} at step {steps}" in r.stdout
    assert "resume: train.max_seconds 4.0 -> 8.0" in r.stdout
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] > steps

    command = printed([r.stdout], "sample from it: ")
    assert command == f"minitf generate --run '{run_dir}'"
    r = as_printed(command + " --max-new-tokens 5 --seed 0", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-1500:]


def test_an_already_finished_run_prints_a_command_that_goes_on(tmp_path, run_4_steps):
    run_dir = copy_run(run_4_steps, tmp_path / "run")
    lines = []
    minitf.train(run_dir, resume=True, log=lines.append)
    command = printed(lines, "to train longer: ")
    assert command == f"minitf train --resume {run_dir} train.max_steps=8"
    r = as_printed(command, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] == 8


def test_resume_with_a_missing_directory_is_one_line(tmp_path):
    r = as_printed(f"minitf train --resume {tmp_path / 'nope'} train.max_steps=8", cwd=tmp_path)
    assert r.returncode == 2
    assert (
        r.stderr == f"error: {tmp_path / 'nope'} has no checkpoint to resume; drop --resume to start a new run, "
        "or name the run with run.out_dir=DIR\n"
    )


def test_training_into_a_log_is_line_based_and_says_what_it_does_at_the_end(tmp_path, corpus, monkeypatch, capsys):
    fake_monotonic(monkeypatch, 6.0)
    minitf.train(tiny_config(tmp_path / "run", corpus), log=print)
    out, err = capsys.readouterr()
    assert "\r" not in out + err
    assert re.search(r"^training: \d+% \d/8 \[.*, step=\d, loss=[\d.]+, lr=", err, re.M), err
    lines = out.splitlines()
    end = lines.index("final evaluation (2 batches of train and val)...")
    assert lines[end + 1].startswith("step 8: train ")
    assert lines[end + 2] == f"saving the checkpoint of step 8 in {tmp_path / 'run'}..."
    assert lines[end + 3].startswith("stopped at step 8 (max_steps)")
    # how to go on, with twice what ended it (a run the time budget ended doubles train.max_seconds)
    assert f"to train longer: minitf train --resume {tmp_path / 'run'} train.max_steps=16" in lines[end + 4 :]


def test_the_end_line_says_when_the_latest_weights_are_worse_than_the_best(tmp_path, corpus, monkeypatch):
    """Val loss 4.38 at step 4, 4.81 at step 8 (scripted): the closing lines say by how much the
    latest weights are worse, where the best are, and --best; a resume that gets worse still
    names the best's step from the checkpoint."""
    vals = iter([4.38, 4.81, 5.0])
    monkeypatch.setattr(trainer, "evaluate", lambda *a: {"train": 4.0, "val": next(vals), "val_bpb": 2.0})
    lines = []
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus), log=lines.append)
    assert (
        "note: the latest weights (step 8, val loss 4.8100) are 0.4300 worse than the best at step 4 (val loss "
        "4.3800, in best.safetensors); generate, serve and export use the latest: give them --best for the best"
    ) in lines
    lines.clear()
    minitf.train(run_dir, resume=True, log=lines.append, overrides=["train.max_steps=10"])
    assert any(
        x.startswith("note: the latest weights (step 10, val loss 5.0000) are 0.6200 worse than the best at step 4 ")
        for x in lines
    )


def test_no_worse_than_best_note_when_the_latest_are_the_best(tmp_path, corpus, monkeypatch):
    vals = iter([4.81, 4.38])
    monkeypatch.setattr(trainer, "evaluate", lambda *a: {"train": 4.0, "val": next(vals), "val_bpb": 2.0})
    lines = []
    minitf.train(tiny_config(tmp_path / "run", corpus), log=lines.append)
    assert not [x for x in lines if "worse than the best" in x]


def test_own_text_gets_its_own_prompt_and_the_run_the_name_of_its_directory(tmp_path, corpus):
    lines = []
    run_dir = minitf.train(tiny_config(tmp_path / "novel", corpus), log=lines.append)
    cfg = minitf.load_config(run_dir / "config.yaml")
    assert cfg.run.name == "novel"  # not the recipe's "tiny"
    val_text = (corpus / "play3.txt").read_text().lstrip("\n")  # 4 plays: the last is val
    first_line = val_text.split("\n", 1)[0]
    assert cfg.sample.prompt == (first_line + "\n" if len(first_line) <= 40 else cfg.sample.prompt)
    assert 0 < len(cfg.sample.prompt) <= 41 and val_text.startswith(cfg.sample.prompt)
    assert f"sample.prompt: {cfg.sample.prompt!r}, the start of a validation document" in "\n".join(lines)
    # what the user set stays
    kept = minitf.train(
        tiny_config(tmp_path / "b", corpus, "run.name=mine", "sample.prompt=ROMEO:"), log=lambda *a: None
    )
    cfg = minitf.load_config(kept / "config.yaml")
    assert (cfg.run.name, cfg.sample.prompt) == ("mine", "ROMEO:")


def test_a_one_step_run_still_ends_with_its_evaluation(tmp_path, corpus):
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=1"), log=lambda *a: None)
    assert [row["step"] for row in read_rows(run_dir / METRICS)] == [1]
