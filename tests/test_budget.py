"""A short time budget trains the default model with 2 layers at 1.5x the learning rates
(minitf/training/budget.py): the rule, when it applies, and a run that took it."""

import pytest
import torch

import minitf
from minitf.config import load_config
from minitf.training import budget
from minitf.training.checkpoint import load_run


def default(*overrides: str) -> minitf.Config:
    return load_config(overrides=["model.vocab_size=300", *overrides])


def test_a_budget_of_few_steps_trains_two_layers_at_higher_rates():
    cfg = default("train.max_seconds=100")
    line = budget.fit(cfg, step_seconds=0.2)  # 500 steps
    assert line == (
        "budget: train.max_seconds=100 buys ~500 steps of 3 layers here, under 1,300: training 2 layers at "
        "1.5x the learning rates (lr 0.006, muon_lr 0.03), which learn more in a short budget; "
        "train.fit_budget=false keeps 3"
    )
    assert cfg.model.n_layer == 2
    assert (cfg.train.lr, cfg.train.min_lr, cfg.train.muon_lr) == (6e-3, 6e-4, 0.03)  # as config.yaml shows them


def test_a_budget_of_many_steps_keeps_the_model():
    cfg = default("train.max_seconds=210")
    assert budget.fit(cfg, step_seconds=0.12) == (
        "budget: train.max_seconds=210 buys ~1,750 steps of 3 layers here: keeping 3 layers"
    )
    assert cfg == default("train.max_seconds=210")


def test_max_steps_caps_what_the_budget_buys():
    cfg = default("train.max_seconds=210", "train.max_steps=400")
    assert "buys ~400 steps" in budget.fit(cfg, step_seconds=0.01)
    assert cfg.model.n_layer == 2


@pytest.mark.parametrize(
    "overrides, resuming, world, applies",
    [
        ((), False, 1, True),
        (("data.vocab_size=8000", "model.vocab_size=8000"), False, 1, True),  # any vocabulary
        (("train.fit_budget=false",), False, 1, False),
        (("train.max_seconds=null",), False, 1, False),  # max_steps alone: the step count is known
        ((), True, 1, False),  # a resume keeps its depth
        ((), False, 2, False),  # torchrun: the ranks would each time their own steps
        (("train.compile=true",), False, 1, False),  # the first steps would time the compiler
        (("model.n_layer=4",), False, 1, False),  # measured for the default model alone
        (("model.n_embd=256",), False, 1, False),
        (("run.init_from=gpt2",), False, 1, False),
    ],
)
def test_it_applies_to_a_new_run_of_the_default_model_alone(overrides, resuming, world, applies):
    assert budget.applies(default(*overrides), resuming, world) is applies


def test_the_timing_calls_the_step_and_leaves_the_rng_alone():
    calls = []
    before = torch.get_rng_state()
    seconds = budget.seconds_per_step(lambda: calls.append(torch.rand(1)), torch.device("cpu"))
    assert len(calls) == budget.WARMUP_STEPS + budget.TIMED_STEPS
    assert seconds >= 0
    assert torch.equal(torch.get_rng_state(), before)


def test_a_short_run_trains_and_resumes_the_model_it_chose(tmp_path, corpus):
    """max_steps=3 under a time budget: the budget buys 3 steps, so the run trains 2 layers,
    config.yaml says so, and a resume goes on with them."""
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
    assert line.startswith("budget: train.max_seconds=600 buys ~3 steps of 3 layers here, under 1,300: training 2 ")
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
