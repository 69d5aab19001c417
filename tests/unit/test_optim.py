"""minitf.optim: the parameter groups, the betas, fine-tuning rates, and the LR schedule (warmup,
cosine, its peak and floor on any machine)."""

import math

import pytest
import torch

import minitf
import minitf.system.files
from minitf import optim
from minitf.budget import budget_steps
from minitf.config import TrainConfig
from minitf.fast import bf16_adamw
from minitf.optim import make_optimizer
from minitf.training import setup
from tests.support.models import model_and_batch

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_betas_reach_the_optimizer():
    model = model_and_batch()[0]
    opt = make_optimizer(model, TrainConfig(optimizer="adamw", beta1=0.8, beta2=0.99), torch.device("cpu"))
    assert {g["betas"] for g in opt.param_groups} == {(0.8, 0.99)}


# What a run logs (metrics.jsonl, steps.jsonl, TensorBoard), fine-tuning from a local GPT-2
# directory (run.init_from), and the note when a time budget bought far fewer steps than usual.


@pytest.mark.parametrize(
    "overrides, rates",
    [
        ((), (1e-4, 1e-5, 5e-4)),  # every group lowered alike: Muon keeps the recipe's 5x lr
        (("train.lr=2e-4",), (2e-4, 2e-5, 1e-3)),  # the docs' command sets lr alone: muon_lr follows it
        (("train.lr=2e-4", "train.muon_lr=0.001", "train.min_lr=0"), (2e-4, 0.0, 1e-3)),  # the user's, kept
    ],
)
def test_a_fine_tune_gets_fine_tuning_rates_for_every_group(overrides, rates):
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", *overrides])
    line = setup.finetune_rates(cfg.train, cfg.given)
    assert (cfg.train.lr, cfg.train.min_lr, cfg.train.muon_lr) == pytest.approx(rates)
    assert line.startswith(f"fine-tune rates: lr {rates[0]:.3g}, min_lr {rates[1]:.3g}, muon_lr {rates[2]:.3g} (")
    assert ("as set" in line) == bool(overrides)
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", "train.optimizer=adamw", *overrides])
    line = setup.finetune_rates(cfg.train, cfg.given)  # AdamW reads no muon_lr: the line leaves it out
    assert line.startswith(f"fine-tune rates: lr {rates[0]:.3g}, min_lr {rates[1]:.3g} (") and "muon" not in line


@pytest.mark.parametrize(
    "overrides, chosen",
    [((), "adamw"), (("train.optimizer=muon",), None), (("train.optimizer=adamw",), None)],
    ids=["default", "muon-asked", "adamw-asked"],
)
def test_a_download_fine_tunes_with_adamw_unless_the_optimizer_is_set(overrides, chosen):
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", *overrides])
    asked = cfg.train.optimizer
    line = setup.adamw_for_a_download(cfg.train, cfg.given)
    assert cfg.train.optimizer == (chosen or asked) and (line is None) == (chosen is None)
    if chosen:
        assert line.endswith("train.optimizer=muon to choose Muon") and cfg.train.typical_steps is None


def test_a_recipe_floor_above_the_fine_tune_rate_is_one_line():
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", "train.min_lr=3e-4"])
    with pytest.raises(minitf.ConfigError, match=r"train.min_lr=0.0003 is above a fine-tune's train.lr=0.0001; set"):
        setup.finetune_rates(cfg.train, cfg.given)


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


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


# Training: optimizer groups, schedule, exact resume, crash safety and bad input.


def test_optimizer_groups_decay_only_linear_matrices():
    m = minitf.Transformer(minitf.ModelConfig(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=32))
    opt = optim.make_optimizer(m, TrainConfig(optimizer="adamw", weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    # 4 linear matrices per block; not the tied embedding/head, positions, norms or biases
    assert decayed == sorted(
        f"blocks.{i}.{w}.weight" for i in range(2) for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def test_lr_schedule_warmup_then_cosine():
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100)
    assert optim.lr_at(0, 0.0, tc, budget_steps(tc)) == pytest.approx(0.1)  # (0+1)/10 of the peak
    assert optim.lr_at(9, 0.09, tc, budget_steps(tc)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.09)))
    assert optim.lr_at(50, 0.5, tc, budget_steps(tc)) == pytest.approx(0.55)
    assert optim.lr_at(100, 1.0, tc, budget_steps(tc)) == pytest.approx(0.1)
    assert optim.lr_at(100, 1.7, tc, budget_steps(tc)) == pytest.approx(0.1)  # past a time budget it stays at min_lr


def test_a_lora_run_steps_at_its_rates_times_lora_lr_scale():
    # low-rank factors learn slower than whole matrices at one rate: from a small base run, the chat
    # recipe's lr 1e-3 left LoRA at 45% exact answers against full fine-tuning's 82% (docs/chat.md)
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, optimizer="adamw", lora_rank=8)
    assert tc.lora_lr_scale == 5.0  # the default
    assert optim.lr_at(50, 0.5, tc, budget_steps(tc)) == pytest.approx(5 * 0.55)
    assert optim.lr_at(100, 1.0, tc, budget_steps(tc)) == pytest.approx(5 * 0.1)
    tc = TrainConfig(
        lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, optimizer="adamw", lora_rank=8, lora_lr_scale=2
    )
    assert optim.lr_at(50, 0.5, tc, budget_steps(tc)) == pytest.approx(2 * 0.55)
    opt = make_optimizer(model_and_batch()[0], tc, torch.device("cpu"))
    assert {g["lr"] for g in opt.param_groups} == {2.0}


def test_optimizer_in_backward_refuses_ddp_in_one_line(monkeypatch):
    """Each weight would be updated from its own process's gradient before DDP averaged it."""
    model, _, _ = model_and_batch()
    tc = TrainConfig(
        optimizer="adamw", param_dtype="bfloat16", dtype="bfloat16", optimizer_in_backward=True, grad_clip=0
    )
    make_optimizer(model, tc, torch.device("cpu"))  # one process: taken
    monkeypatch.setattr(bf16_adamw.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(bf16_adamw.dist, "get_world_size", lambda: 2)
    with pytest.raises(minitf.ConfigError) as e:
        make_optimizer(model, tc, torch.device("cpu"))
    assert str(e.value) == (
        "train.optimizer_in_backward updates each weight from this process's gradient before DDP averages it over "
        "the processes; train on one process, or remove train.optimizer_in_backward"
    )
