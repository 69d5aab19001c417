"""A short time budget trains the default model with 2 layers at 1.5x the learning rates
(minitf/budget.py): the rule, when it applies, and a run that took it."""

import time

import pytest
import torch

import minitf
from minitf import budget, trainer
from minitf.config import TrainConfig, load_config
from minitf.corpus.prepare import prepare_data
from minitf.optim import make_optimizer
from minitf.training.session import Session
from tests.support.runs import tiny_config


def timed_steps(step, tc: TrainConfig, clock=time.perf_counter) -> tuple[float, bool]:
    """Time step() as the trainer times its own (trainer.time_steps); a fake clock makes any machine speed."""
    seconds = []
    while budget.keep_timing(tc, seconds):
        t0 = clock()
        step()
        seconds.append(clock() - t0)
    return budget.step_seconds(seconds)


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


def test_a_run_that_max_steps_ends_keeps_its_depth():
    """Fewer layers buy more steps in the same time, which a run that max_steps ends cannot take:
    the line names max_steps as what ends it, and the model and its rates are kept."""
    cfg = default("train.max_seconds=1e9", "train.max_steps=5")
    assert budget.fit(cfg, step_seconds=0.2) == (
        "budget: train.max_steps=5 ends this run before train.max_seconds=1e+09 (~5,000,000,000 steps here): "
        "keeping 3 layers, as fewer would not train more steps"
    )
    assert cfg == default("train.max_seconds=1e9", "train.max_steps=5")
    cfg = default("train.max_seconds=210", "train.max_steps=400")  # 21,000 steps of time: 400 end it
    assert "train.max_steps=400 ends this run" in budget.fit(cfg, step_seconds=0.01)
    assert cfg.model.n_layer == 3


def test_a_budget_too_short_to_time_keeps_the_model():
    """train.max_seconds=8 at 1.3 s a step: the 7 timed steps would cost more than the run, so the
    timing stops after the first and the line says why the depth is kept."""
    clock = iter(x * 1.3 for x in range(100))
    calls = []
    cfg = default("train.max_seconds=8")
    seconds, timed = timed_steps(lambda: calls.append(1), cfg.train, clock=lambda: next(clock))
    assert (len(calls), seconds, timed) == (1, pytest.approx(1.3), False)
    assert budget.fit(cfg, seconds, timed) == (
        "budget: train.max_seconds=8 is too short to time this machine in (~1.3s a step; timing takes 7): "
        "keeping 3 layers without fitting the depth"
    )
    assert cfg == default("train.max_seconds=8")


def test_a_slow_first_step_does_not_call_off_the_timing():
    """A loaded machine's first (warm-up) step took 4 s, the others 0.15 s: at train.max_seconds=210
    the timing goes on, as the steps left are not projected from the warm-up."""
    times = [0.0, 4.0]  # each call reads the clock before and after
    for _ in range(6):
        times += [times[-1], times[-1] + 0.15]
    ticks = iter(times)
    calls = []
    seconds, timed = timed_steps(lambda: calls.append(1), default().train, clock=lambda: next(ticks))
    assert (len(calls), seconds, timed) == (7, pytest.approx(0.15), True)


def test_a_rate_the_user_set_is_kept_when_the_depth_is_fitted():
    cfg = default("train.max_seconds=100", "train.lr=0.005")
    assert "1.5x the learning rates (train.lr as set) (lr 0.005, muon_lr 0.03)" in budget.fit(cfg, 0.2)
    assert (cfg.model.n_layer, cfg.train.lr, cfg.train.min_lr) == (2, 0.005, 7.5e-4)


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
        (("model.n_layer=3",), False, 1, False),  # the default's depth, set by the user: their choice
        (("model.n_embd=256",), False, 1, False),
        (("run.init_from=gpt2",), False, 1, False),
    ],
)
def test_it_applies_to_a_new_run_of_the_default_model_alone(overrides, resuming, world, applies):
    assert budget.applies(default(*overrides), resuming, world) is applies


def test_an_n_layer_the_user_set_is_kept_from_a_recipe_dict_or_the_command_line(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("model:\n  n_layer: 3\n")
    for cfg in (
        load_config(recipe, ["model.vocab_size=300"]),
        load_config({"model": {"n_layer": 3, "vocab_size": 300}}),
        default("model.n_layer=3"),
    ):
        assert cfg == default() and not budget.applies(cfg, resuming=False, world=1)
    assert budget.applies(default(), resuming=False, world=1)


def test_the_timing_calls_the_step_and_leaves_the_rng_alone(monkeypatch, tmp_path, corpus):
    calls = []
    real = trainer.train_step
    monkeypatch.setattr(trainer, "train_step", lambda *a: calls.append(torch.rand(1)) or real(*a))
    cfg = tiny_config(tmp_path / "probe", corpus, "train.max_seconds=600", "train.max_steps=100000")
    data = prepare_data(cfg.data, log=lambda *a: None)
    cfg.model.vocab_size = data.tokenizer.vocab_size
    model = minitf.Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    probe = Session.create(cfg, model, optimizer, data, torch.device("cpu"), run_dir=tmp_path / "probe")
    before = torch.get_rng_state()
    seconds, timed = trainer.time_steps(probe)
    assert len(calls) == budget.WARMUP_STEPS + budget.TIMED_STEPS
    assert seconds >= 0 and timed
    assert torch.equal(torch.get_rng_state(), before)


def test_the_chat_recipe_is_compared_with_chat_runs():
    """The short-run note's ~N steps for --config chat is what SFT does in its 180 s on a 2-core CPU
    (1,716 to 1,955 measured), not pretraining's 943, which would never warn."""
    from minitf.budget import budget_steps

    assert 1700 <= budget_steps(minitf.load_config("chat").train) <= 1960
