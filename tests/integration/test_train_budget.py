"""Training under a time budget: the depth it fits, the schedule it follows on a slow machine, its
notes, and a larger budget resuming."""

import time

import pytest
import torch

import minitf
from minitf import trainer
from minitf.budget import budget_steps
from minitf.config import TrainConfig, load_config
from minitf.run_dir import load_run
from minitf.training.metrics import METRICS, STEPS, read_rows
from tests.support.runs import slow_clock, tiny_config

# A short time budget trains the default model with 2 layers at 1.5x the learning rates
# (minitf/budget.py): the rule, when it applies, and a run that took it.


def test_a_short_run_trains_and_resumes_the_model_it_chose(tmp_path, corpus, monkeypatch):
    """A machine where the time budget buys 2 steps (max_steps=3 keeps the test short): the run
    trains 2 layers, config.yaml says so, and a resume goes on with them."""
    monkeypatch.setattr(trainer, "time_steps", lambda *a: (300.0, True))
    out = tmp_path / "short"
    cfg = load_config(
        overrides=[
            f"run.out_dir={out}",
            f"data.source=file:{corpus}",
            "data.vocab_size=300",
            "train.max_seconds=600",
            "train.max_steps=3",
            "train.eval_batches=1",
        ]
    )
    lines = []
    minitf.train(cfg, log=lines.append)
    (line,) = [x for x in lines if x.startswith("budget:")]
    assert line.startswith("budget: train.max_seconds=600 buys ~2 steps of 3 layers here, under 1,300: training 2 ")
    assert lines.index(line) < next(i for i, x in enumerate(lines) if x.startswith("model:"))
    model, _, saved = load_run(out)
    assert (saved.model.n_layer, len(model.blocks)) == (2, 2)
    assert (saved.train.lr, saved.train.muon_lr) == pytest.approx((6e-3, 0.03))
    assert cfg.model.n_layer == 3  # the caller's config is left as it was

    lines.clear()
    minitf.train(out, resume=True, log=lines.append, overrides=["train.max_steps=5"])
    assert not [x for x in lines if x.startswith("budget:")]
    model, _, saved = load_run(out)
    assert (saved.train.max_steps, saved.model.n_layer, len(model.blocks)) == (5, 2, 2)


def test_fit_budget_false_keeps_three_layers(tmp_path, corpus):
    out = tmp_path / "kept"
    overrides = [f"run.out_dir={out}", f"data.source=file:{corpus}", "data.vocab_size=300"]
    budgeted = ["train.max_seconds=600", "train.max_steps=2", "train.eval_batches=1", "train.fit_budget=false"]
    lines = []
    minitf.train(load_config(overrides=overrides + budgeted), log=lines.append)
    assert not [x for x in lines if x.startswith("budget:")]
    assert len(load_run(out)[0].blocks) == 3


def test_a_run_that_max_steps_ends_says_so_and_trains_three_layers(tmp_path, corpus):
    """train.max_seconds=1e9 train.max_steps=3: the steps end the run, whatever this machine's speed."""
    out = tmp_path / "steps"
    overrides = [f"run.out_dir={out}", f"data.source=file:{corpus}", "data.vocab_size=300"]
    lines = []
    minitf.train(load_config(overrides=[*overrides, "train.max_seconds=1e9", "train.max_steps=3"]), log=lines.append)
    (line,) = [x for x in lines if x.startswith("budget:")]
    assert line.startswith("budget: train.max_steps=3 ends this run before train.max_seconds=1e+09 (~")
    assert line.endswith("keeping 3 layers, as fewer would not train more steps")
    assert len(load_run(out)[0].blocks) == 3


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_time_budget_stops_anneals_and_a_resume_does_not_step(tmp_path, corpus, monkeypatch):
    clock = iter(range(10**6))
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))  # one second per reading
    logs = []
    cfg = tiny_config(
        tmp_path / "run",
        corpus,
        "train.max_seconds=60",
        "train.max_steps=100000",
        "train.eval_every=100000",
        "train.ckpt_every=100000",
    )
    run = minitf.train(cfg, log=logs.append)
    assert any("(time budget)" in line for line in logs)
    last = read_rows(run / METRICS)[-1]
    tc = cfg.train
    assert tc.min_lr <= last["lr"] < tc.min_lr + 0.02 * (tc.lr - tc.min_lr)  # annealed to the end
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["elapsed"] >= 60
    logs.clear()
    minitf.train(cfg, resume=True, log=logs.append)
    assert any("already finished" in line for line in logs)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == state["step"]


# What a run logs (metrics.jsonl, steps.jsonl, TensorBoard), fine-tuning from a local GPT-2
# directory (run.init_from), and the note when a time budget bought far fewer steps than usual.


def test_a_short_budget_says_so(tmp_path, corpus):
    lines = []
    minitf.train(
        tiny_config(
            tmp_path / "run", corpus, "train.max_seconds=0.5", "train.max_steps=100000", "train.typical_steps=1000000"
        ),
        log=lines.append,
    )
    note = next(line for line in lines if line.startswith("note:"))
    assert (
        "under half the ~2381" in note
    )  # the 1000000 steps of 210 s, scaled to 0.5 s and "train.max_seconds=1" in note and "--resume" in note
    lines.clear()
    minitf.train(tiny_config(tmp_path / "b", corpus, "train.typical_steps=8"), log=lines.append)  # max_steps ends it
    assert not any(line.startswith("note:") for line in lines)


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


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
