"""Training stopped from outside: signals save and exit 0, a second signal aborts, and a kill
between any two writes resumes exactly."""

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import minitf
import minitf.system.files
from minitf.errors import MinitfError
from minitf.plots import figures
from minitf.training import checkpoint as ckpt
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.processes import command, default_sigint
from tests.support.runs import QUIET, tiny_args, tiny_config, tiny_train_args

# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def same_weights(a, b):
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


EVAL_EVERY = 20  # a long run's evaluations: the first one's line says the loop is running


def _start_long_run(run, corpus):
    proc = subprocess.Popen(
        [
            sys.executable,
            *tiny_args(
                run, corpus, "train.max_steps=100000", "train.ckpt_every=1000", f"train.eval_every={EVAL_EVERY}"
            ),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    # wait for the first evaluation's line: the loop, and its signal handlers, are running (the
    # progress line in a pipe comes only after 10 s)
    out, deadline = b"", time.time() + 120
    while f"step {EVAL_EVERY}:".encode() not in out:
        assert time.time() < deadline and proc.poll() is None, out[-500:]
        if select.select([proc.stdout], [], [], 0.5)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGUSR1"])
def test_stop_signals_save_and_exit_0_and_the_run_is_locked_meanwhile(tmp_path, corpus, sig):
    run = tmp_path / "run"
    proc = _start_long_run(run, corpus)
    second = command("train", *tiny_args(run, corpus, "train.max_steps=8")[1:])  # the script's arguments, here
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f"error: {run} is in use by pid {proc.pid}; wait for that training to end or choose another run.out_dir"
    )
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-1500:]
    assert f"received {sig}: finishing this step, saving a checkpoint" in out
    assert f"(interrupted by {sig})" in out
    assert re.search(r"to go on from step \d+: minitf train --resume \S+", out)  # as a normal stop says how to go on
    step = torch.load(run / "state.pt", weights_only=True)["step"]
    assert step > 0 and ckpt.weights_step(run / "model.safetensors") == step
    # the stop evaluates, unless the step before it was an evaluation step
    assert read_rows(run / METRICS)[-1]["step"] == (step - 1 if (step - 1) % EVAL_EVERY == 0 else step)


@pytest.mark.slow
def test_a_second_signal_aborts(tmp_path, corpus):
    proc = _start_long_run(tmp_path / "run", corpus)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two presses; sent together, Python would run the handler once for both
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    # a tiny run may finish its last step within the 0.1 s: the second signal then lands while the
    # interpreter shuts down, where Python has put SIGINT's default action back and the process
    # dies of it (-2, which a shell reports as 130, as for the 'interrupted' exit)
    assert ("interrupted" in err and proc.returncode == 130) or proc.returncode == -signal.SIGINT, (
        proc.returncode,
        err[-500:],
    )


def killed_after(n: int, run, corpus) -> int:
    """A child forked from this process (torch imported, its threads, the session's token cache:
    no interpreter to start) trains tiny_config(run, corpus) and ends as a kill -9 would right after
    its nth write is moved into place (os._exit(9)); its pid. What it prints goes to run.log."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: it never returns into pytest
        log = open(f"{run}.log", "w")  # os._exit closes it
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        real, count = minitf.system.files.atomic_write, 0

        def write_then_maybe_die(path, write):
            nonlocal count
            real(path, write)
            count += 1
            if count == n:
                os._exit(9)  # as a kill -9 right after this file was moved into place

        ckpt.atomic_write = figures.atomic_write = write_then_maybe_die
        minitf.train(tiny_config(run, corpus), log=lambda *a: None)
        print(f"trained to the end: fewer than {n} writes")
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        os._exit(1)


def exit_code(pid: int, seconds: float = 120) -> int:
    """The exit code of child pid; one still running after `seconds` (hung) is killed and fails the test."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} still running after {seconds} s")


@pytest.mark.slow
def test_a_kill_between_any_two_writes_resumes_bit_identically(tmp_path, corpus, run_8_steps):
    # the writes of an 8-step run, checkpoints at 4 and 8: config.yaml, tokenizer.json, then per
    # checkpoint loss.png, best.safetensors, state.pt (the commit), model.safetensors; forked, the
    # killed runs use as many torch threads as this process, which trained the straight run and
    # resumes them: on another number a step's sums may round differently (tests/conftest.py sets one)
    straight = run_8_steps  # the same 8 steps, never killed
    runs = [tmp_path / f"killed-after-{n}" for n in range(1, 11)]
    codes = []
    for pair in (range(1, 3), range(3, 5), range(5, 7), range(7, 9), range(9, 11)):  # two at a time
        codes += [exit_code(pid) for pid in [killed_after(n, runs[n - 1], corpus) for n in pair]]
    for n, (run, code) in enumerate(zip(runs, codes), 1):
        assert code == 9, Path(f"{run}.log").read_text()[-1500:]
        if not (run / "state.pt").is_file():  # killed before the first commit: nothing to resume, said clearly
            with pytest.raises(MinitfError, match="cannot be resumed|no checkpoint to resume"):
                minitf.train(tiny_config(run, corpus), resume=True, **QUIET)
            continue
        minitf.train(tiny_config(run, corpus), resume=True, **QUIET)
        assert same_weights(run / "model.safetensors", straight / "model.safetensors"), n
        assert [m["step"] for m in read_rows(run / METRICS)] == [4, 8], n


# Training: optimizer groups, schedule, exact resume, crash safety and bad input.


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path, corpus):
    run = tmp_path / "run"
    args = [
        "scripts/train.py",
        *tiny_train_args(run, corpus),
        "train.max_steps=100000",
        "train.ckpt_every=5",
        "train.eval_every=1000",
        "train.eval_batches=1",
    ]
    env = {**os.environ, "MINITF_CACHE": os.environ["MINITF_CACHE"]}
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if (run / "state.pt").is_file() and torch.load(run / "state.pt", weights_only=True)["step"] >= 10:
            break
        time.sleep(0.2)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    killed_at = torch.load(run / "state.pt", weights_only=True)["step"]
    assert killed_at >= 10 and killed_at % 5 == 0
    minitf.load_run(run)  # the last complete checkpoint reads
    r = command(
        "train",
        *args[1:-4],
        f"train.max_steps={killed_at + 5}",
        "train.ckpt_every=5",
        "train.eval_every=5",
        "train.eval_batches=1",
        "--resume",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming {run} at step {killed_at}" in r.stdout
    assert torch.load(run / "state.pt", weights_only=True)["step"] == killed_at + 5
