"""What training prints is right: the commands it suggests run as printed, the LR schedule it
follows reaches its peak and floor on any machine speed, and its notes compare with the budget."""

import itertools
import json
import math
import re
import shlex
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import minitf
from minitf import optim, trainer
from minitf.budget import budget_steps
from minitf.cli.train import _resume_dir
from minitf.config import TrainConfig
from minitf.corpus.prepare import prepare_data
from minitf.plots import figures as plotting
from minitf.system import progress
from minitf.training import naming, session
from minitf.training.metrics import METRICS, STEPS, read_rows
from minitf.web.explore import api as explore_api

from .helpers import make_play, tiny_config


def as_printed(command: str, cwd) -> subprocess.CompletedProcess:
    """Run a `minitf ...` command line exactly as a user would paste it (the `minitf` entry point is
    `python -m minitf`, with this tree on PYTHONPATH)."""
    argv = shlex.split(command)
    assert argv[0] == "minitf", command
    return subprocess.run(
        [sys.executable, "-m", "minitf", *argv[1:]], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def printed(lines: list[str], prefix: str) -> str:
    """The command that the line containing `prefix` prints after it."""
    line = next(line for text in lines for line in text.splitlines() if prefix in line)
    return line.split(prefix, 1)[1].strip()


class FakeClock:
    """time.time() for training: `now` moves only when a test moves it."""

    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def slow_clock(monkeypatch, seconds_per_step: float) -> FakeClock:
    """Make training's clock advance seconds_per_step per optimizer step, and not otherwise: a
    machine of that speed, with evaluations and checkpoints taking no time."""
    clock = FakeClock()
    monkeypatch.setattr(session, "time", clock)
    monkeypatch.setattr(trainer, "time", clock)
    real = trainer.forward_backward

    def step(*args, **kw):
        clock.now += seconds_per_step
        return real(*args, **kw)

    monkeypatch.setattr(trainer, "forward_backward", step)
    return clock


# ------------------------------------------------------------------ the commands it prints


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
    r = as_printed(command, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"resuming {run_dir} at step {steps}" in r.stdout
    assert "resume: train.max_seconds 4.0 -> 8.0" in r.stdout  # 4 more seconds, on the real clock
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] > steps

    command = printed([r.stdout], "sample from it: ")
    assert command == f"minitf generate --run '{run_dir}'"
    r = as_printed(command + " --max-new-tokens 5 --seed 0", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-1500:]


def test_an_already_finished_run_prints_a_command_that_goes_on(tmp_path, corpus):
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), log=lambda *a: None)
    lines = []
    minitf.train(run_dir, resume=True, log=lines.append)
    command = printed(lines, "to train longer: ")
    assert command == f"minitf train --resume {run_dir} train.max_steps=8"
    r = as_printed(command, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] == 8


def test_resume_takes_the_run_directory_or_an_override_after_it(tmp_path):
    assert _resume_dir(False, ["train.max_steps=8"]) == ["train.max_steps=8"]
    assert _resume_dir(True, ["train.max_steps=8"]) == ["train.max_steps=8"]  # --resume alone: run.out_dir
    assert _resume_dir("runs/x", ["train.max_steps=8"]) == ["run.out_dir=runs/x", "train.max_steps=8"]
    # an override right after --resume stays an override
    assert _resume_dir("run.out_dir=runs/x", ["train.max_steps=8"]) == ["run.out_dir=runs/x", "train.max_steps=8"]
    assert _resume_dir("train.max_steps=8", []) == ["train.max_steps=8"]
    odd = tmp_path / "a=b"  # unless a directory has that name
    odd.mkdir()
    assert _resume_dir(str(odd), []) == [f"run.out_dir={odd}"]
    assert _resume_dir("runs/x", ["run.out_dir=runs/x/"]) == ["run.out_dir=runs/x", "run.out_dir=runs/x/"]
    with pytest.raises(minitf.MinitfError, match=r"^--resume runs/x and run.out_dir=runs/y name two runs"):
        _resume_dir("runs/x", ["run.out_dir=runs/y"])


def test_resume_with_a_missing_directory_is_one_line(tmp_path):
    r = as_printed(f"minitf train --resume {tmp_path / 'nope'} train.max_steps=8", cwd=tmp_path)
    assert r.returncode == 2
    assert (
        r.stderr == f"error: {tmp_path / 'nope'} has no checkpoint to resume; drop --resume to start a new run, "
        "or name the run with run.out_dir=DIR\n"
    )


# ------------------------------------------------------------------ the LR schedule


def old_lr(step: int, progress: float, tc: TrainConfig) -> float:
    """The schedule before the warmup could end by progress: warmup in steps, cosine over progress."""
    warm = min(1.0, (step + 1) / tc.warmup_steps)
    return warm * (tc.min_lr + (tc.lr - tc.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def test_the_schedule_is_unchanged_for_step_budgets_and_a_typical_machine():
    steps = TrainConfig(max_seconds=None, max_steps=2000)
    assert [optim.lr_at(s, s / 2000, steps, budget_steps(steps)) for s in range(2000)] == [
        old_lr(s, s / 2000, steps) for s in range(2000)
    ]
    timed = TrainConfig()  # 210 s, which buys typical_steps=1100 steps on a typical machine
    typical = [optim.lr_at(s, s / 1100, timed, budget_steps(timed)) for s in range(1100)]
    assert typical == [old_lr(s, s / 1100, timed) for s in range(1100)]
    assert max(typical) == typical[49] > 0.995 * timed.lr  # the peak, at the end of the warmup
    shorter = TrainConfig(max_steps=200)  # a max_steps nearer than the time budget keeps its warmup too
    assert [optim.lr_at(s, s / 200, shorter, budget_steps(shorter)) for s in range(200)] == [
        old_lr(s, s / 200, shorter) for s in range(200)
    ]


@pytest.mark.parametrize("steps_in_budget", [1100, 100, 20])
def test_the_lr_reaches_its_peak_and_ends_at_min_lr_on_any_machine(steps_in_budget):
    tc = TrainConfig()
    lrs = [optim.lr_at(s, s / steps_in_budget, tc, budget_steps(tc)) for s in range(steps_in_budget)]
    peak = lrs.index(max(lrs))
    assert max(lrs) >= 0.99 * tc.lr
    assert min(lrs[peak:]) >= tc.min_lr
    assert lrs[-1] == pytest.approx(tc.min_lr, rel=0.2 if steps_in_budget == 20 else 0.01)
    before = [old_lr(s, s / steps_in_budget, tc) for s in range(steps_in_budget)]
    if steps_in_budget < 200:  # what a slow machine got before: about half the peak
        assert max(before) < 0.6 * tc.lr
    if steps_in_budget < tc.warmup_steps:  # and a warmup that never ended, below min_lr at the end
        assert before[-1] < tc.min_lr


def test_a_slow_machine_trains_on_the_whole_schedule(tmp_path, corpus, monkeypatch):
    """The default recipe's schedule on a machine that does 105 steps in its 210 s: a fake clock
    advances 2 s per step, and the LRs the trainer logged reach train.lr and end at min_lr."""
    slow_clock(monkeypatch, seconds_per_step=2.0)
    cfg = tiny_config(
        tmp_path / "slow",
        corpus,
        *("train.max_seconds=210", "train.max_steps=100000", "train.typical_steps=1100"),
        *("train.warmup_steps=50", "train.lr=4e-3", "train.min_lr=4e-4", "train.log_every=1"),
        *("train.eval_every=1000", "train.ckpt_every=1000", "train.optimizer=adamw"),
    )
    run_dir = minitf.train(cfg, log=lambda *a: None)
    lrs = [row["lr"] for row in read_rows(run_dir / STEPS)]
    assert len(lrs) == 105
    assert max(lrs) >= 0.99 * 4e-3
    assert min(lrs[lrs.index(max(lrs)) :]) >= 4e-4
    assert lrs[-1] == pytest.approx(4e-4, rel=0.01)


# ------------------------------------------------------------------ the short-budget note


def test_the_short_run_note_compares_with_what_the_budget_buys(tmp_path, corpus, monkeypatch):
    assert budget_steps(TrainConfig()) == 1100
    assert budget_steps(TrainConfig(max_seconds=420)) == 2200
    assert budget_steps(TrainConfig(max_seconds=60)) == 314
    assert budget_steps(TrainConfig(max_seconds=None)) is None
    assert budget_steps(TrainConfig(typical_steps=None)) is None

    def notes(name: str, seconds_per_step: float) -> list[str]:
        """2 s of the 210 s recipe (1100 steps): a typical machine does 10 steps in them."""
        lines = []
        with monkeypatch.context() as m:
            slow_clock(m, seconds_per_step)
            budget = ("train.max_seconds=2", "train.max_steps=100000", "train.typical_steps=1100")
            minitf.train(tiny_config(tmp_path / name, corpus, *budget), log=lines.append)
        return [line for line in lines if line.startswith("note:")]

    assert notes("enough", 0.125) == []  # 16 steps: more than half of 10, though far under half of 1100
    (note,) = notes("slow", 1.0)
    assert note.startswith("note: this machine did 2 steps in train.max_seconds=2, under half the ~10 this recipe ")


# ------------------------------------------------------------------ output to a file or a pipe


def fake_monotonic(monkeypatch, seconds_per_call: float) -> None:
    """Progress lines' clock: seconds_per_call more at each reading."""
    ticks = itertools.count(step=seconds_per_call)
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))


def test_a_log_gets_a_progress_line_every_few_seconds_never_a_carriage_return(monkeypatch, capsys):
    fake_monotonic(monkeypatch, 4.0)  # every update() reads the clock once: a line every 3rd update
    with progress.progress_bar(1_000_000, "tokenizing", unit="B", every=10.0, unit_scale=True) as bar:
        for _ in range(7):
            bar.update(100_000)
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    assert err.splitlines() == [
        "tokenizing: 30% 300k/1.00M [00:12<00:28, 25.0kB/s]",
        "tokenizing: 60% 600k/1.00M [00:24<00:16, 25.0kB/s]",
        "tokenizing: 70% 700k/1.00M [00:32<00:13, 21.9kB/s]",  # close(): where it ended
    ]
    with progress.progress_bar(None, "reading", unit="B", every=10.0) as bar:  # nothing printed: no line at close
        bar.update(5)
    assert capsys.readouterr().err == ""


def test_tokenizing_into_a_log_shows_life(tmp_path, monkeypatch, capsys):
    for i in range(12):
        (tmp_path / f"part{i}.txt").write_text(make_play(100 + i, lines=60))
    fake_monotonic(monkeypatch, 6.0)
    prepare_data(minitf.DataConfig(source=f"file:{tmp_path}", vocab_size=300, num_proc=1), log=print)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert any(line.startswith("training BPE: ") for line in err.splitlines())
    assert any(re.match(r"tokenizing: \d+% [\d.]+k/[\d.]+k \[", line) for line in err.splitlines())


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


def test_no_second_evaluation_right_after_one_that_used_up_the_budget(tmp_path, corpus, monkeypatch):
    """Step 4 evaluates, and that evaluation uses up the time budget: step 5 is the last, and it
    checkpoints without evaluating the same weights again."""
    clock = slow_clock(monkeypatch, seconds_per_step=2.0)
    real_eval = trainer.record_eval

    def slow_eval(run, *args):
        clock.now += 3.0
        return real_eval(run, *args)

    monkeypatch.setattr(trainer, "record_eval", slow_eval)
    budget = ("train.max_seconds=10", "train.max_steps=100000", "train.eval_every=4", "train.ckpt_every=1000")
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus, *budget), log=lambda *a: None)
    assert [row["step"] for row in read_rows(run_dir / METRICS)] == [4]
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] == 5


def test_a_larger_budget_resumes_a_run_that_overran_its_own(tmp_path, corpus, monkeypatch):
    """An 8 s budget whose closing evaluation took 12 s more records 20 s. Resuming with 16 s adds
    8 s (the overrun is not charged) instead of saying "already finished"; the same 8 s adds none."""
    clock = slow_clock(monkeypatch, seconds_per_step=2.0)
    real_eval = trainer.record_eval

    def slow_eval(run, *args):
        clock.now += 12.0
        return real_eval(run, *args)

    monkeypatch.setattr(trainer, "record_eval", slow_eval)
    budget = ("train.max_steps=100000", "train.eval_every=1000", "train.ckpt_every=1000")
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus, *budget, "train.max_seconds=8"), log=lambda *a: None)
    assert torch.load(run_dir / "state.pt", weights_only=True)["elapsed"] == pytest.approx(20.0)
    lines = []
    minitf.train(run_dir, resume=True, log=lines.append, overrides=["train.max_seconds=8"])
    assert any(
        "already finished (step 4 of train.max_steps=100000; it has used 20.0s, and train.max_seconds=8 adds none)"
        f"; to train longer: minitf train --resume {run_dir} train.max_seconds=16" in x
        for x in lines
    )
    lines.clear()
    minitf.train(run_dir, resume=True, log=lines.append, overrides=["train.max_seconds=16"])
    assert (
        "resume: the run has used 20.0s (12.0s of them past train.max_seconds=8, not charged to the new budget); "
        "train.max_seconds=16 adds 8.0s"
    ) in lines
    assert torch.load(run_dir / "state.pt", weights_only=True)["step"] == 8  # 4 more steps of 2 s


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


# ------------------------------------------------------------------ the run's name and prompt, the explorer, charts


class Chars:
    """TokenData's face for fitting_prompt: one token per character, id 0 the end of a document."""

    def __init__(self, val: str, one_document: bool):
        self.ids = np.array([ord(c) for c in val], dtype=np.int64)
        self.tokenizer = types.SimpleNamespace(eot_id=0, decode=lambda ids: "".join(map(chr, ids)))
        n = 1 if one_document else 5
        self.meta = {"splits": {"train": {"documents": n}, "val": {"documents": 1}}}

    def tokens(self, split):
        return self.ids


def test_a_fitting_prompt_is_a_line_or_the_first_words_of_the_validation_text():
    assert naming.fitting_prompt(Chars("CHAPTER ONE\nIt was a dark night.\x00next", False)) == "CHAPTER ONE\n"
    # one document cut mid-line: its first whole line
    assert naming.fitting_prompt(Chars("ter of it.\nMARY:\nNo.", True)) == "MARY:\n"
    long = "It was the best of times, it was the worst of times, it was the age of wisdom\n"
    assert naming.fitting_prompt(Chars(long, False)) == "It was the best of"
    assert (
        naming.fitting_prompt(Chars("ACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGT", False))
        == "ACGTACGTACGTACGTACGT"
    )
    assert naming.fitting_prompt(Chars("\x00", False)) == ""


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


def test_the_explorer_names_the_budget_that_ends_the_run():
    assert explore_api.budget_words(TrainConfig()) == "210 s budget"
    assert explore_api.budget_words(TrainConfig(max_seconds=60)) == "60 s budget"
    assert explore_api.budget_words(TrainConfig(max_steps=200)) == "210 s or 200 steps budget"
    assert explore_api.budget_words(TrainConfig(max_seconds=None, max_steps=2000)) == "2000 steps"


def test_explorer_run_info_says_the_budget(explore_server, tiny_run):
    import urllib.request

    with urllib.request.urlopen(explore_server.url + "api/run", timeout=30) as r:
        assert json.loads(r.read())["budget"] == "30 steps"


@pytest.mark.parametrize("evals", [1, 2])
def test_a_one_or_two_point_chart_shows_its_points_at_whole_steps(tmp_path, monkeypatch, evals):
    rows = [
        {"step": 4 * (i + 1), "train_loss": 5.0 - i, "val_loss": 5.1 - i, "val_bpb": 2.5, "lr": 1e-3}
        for i in range(evals)
    ]
    (tmp_path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, out, **kw: figures.append(fig))
    plotting.plot_loss(tmp_path)
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_marker() == "o" and list(line.get_xdata()) == [r["step"] for r in rows]
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
        assert all(r["step"] in ticks or ax.get_xlim()[0] < r["step"] < ax.get_xlim()[1] for r in rows)


def test_a_one_step_run_still_ends_with_its_evaluation(tmp_path, corpus):
    run_dir = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=1"), log=lambda *a: None)
    assert [row["step"] for row in read_rows(run_dir / METRICS)] == [1]
