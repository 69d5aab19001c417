"""The optimizer and the learning-rate schedule.

make_optimizer gives AdamW (weight decay on the linear layers' matrices only; fast/bf16_adamw.py's
where the weights are held in bfloat16), or Muon (fast/muon.py: orthogonalised momentum, the
blocks' matrices) beside AdamW for the rest. The schedule is a linear
warmup, then a cosine from lr to min_lr over the run's progress (steps, or its time budget); a LoRA
run's rates are train.lora_lr_scale times those."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig
from .fast.bf16_adamw import BF16AdamW
from .fast.muon import Muon, Optimizers
from .system import runtime


def make_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device):
    """AdamW (train.optimizer=adamw), or Muon for the blocks' matrices with AdamW for the rest
    (train.optimizer=muon, returned as one `Optimizers`)."""
    params = [p for p in dict.fromkeys(model.parameters()) if p.requires_grad]  # tied once; frozen (LoRA): no state
    if tc.optimizer == "adamw":
        return _adamw(model, params, tc, device)
    # Muon orthogonalises each update of a 2-D weight matrix. Embeddings, the LM head, norms and
    # biases are not such maps (an embedding row is a lookup, not a matrix product), so AdamW keeps them.
    hidden = {id(p) for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2}
    matrices = [p for p in params if id(p) in hidden]
    ns_dtype = "bfloat16" if runtime.native_bf16(device) else "float32"  # float32 where bf16 is emulated (T4, V100)
    muon = Muon(
        [{"params": matrices, "lr_scale": tc.muon_lr / tc.lr}],
        lr=tc.muon_lr,
        weight_decay=tc.weight_decay,
        momentum=tc.muon_momentum,
        ns_dtype=ns_dtype,
    )
    return Optimizers(adamw=_adamw(model, [p for p in params if id(p) not in hidden], tc, device), muon=muon)


def _adamw(model: nn.Module, params: list, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over params; weight decay only on the matrices of linear layers.

    Decay pulls weights toward zero. That regularises the matrices that mix features, but on a
    norm's gain or a bias it only fights the scale the layer needs, and on embeddings it would
    shrink the rows of rare tokens, which get few gradient updates to push back.
    """
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay -= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}  # tied head
    groups = [
        {"params": [p for p in params if id(p) in decay], "weight_decay": tc.weight_decay},
        {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
    ]
    lr, betas = tc.lr * tc.rate_scale, (tc.beta1, tc.beta2)
    if tc.param_dtype == "bfloat16":  # weights held in bfloat16: updated with stochastic rounding
        return BF16AdamW(groups, lr=lr, betas=betas, in_backward=tc.optimizer_in_backward)
    # the fused kernel updates all tensors in one pass instead of one small kernel per tensor
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device.type in ("cuda", "cpu"))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set this step's learning rate: lr times each group's lr_scale (1 unless the group says)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def lr_at(step: int, progress: float, tc: TrainConfig, expected_steps: int | None) -> float:
    """The learning rate at `step`: a linear warmup, times a cosine from lr to min_lr over progress 0 -> 1.

    progress (schedule_progress) is the fraction of max_steps done, or of max_seconds when that is
    the nearer limit, so a time-budgeted run still anneals to min_lr. The warmup ends after
    warmup_steps steps or once its share of the budget (warmup_share) is spent, whichever comes
    first: a slow machine reaches the peak as early in its budget as a typical one, and a fast or
    typical one warms up over its warmup_steps steps. expected_steps: the steps a time budget buys
    on a typical machine (budget.budget_steps), None without one.
    """
    if not tc.warmup_steps:
        warm = 1.0
    else:
        warm = min(1.0, max((step + 1) / tc.warmup_steps, progress / warmup_share(tc, expected_steps)))
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return warm * (tc.min_lr + (tc.lr - tc.min_lr) * cosine) * tc.rate_scale  # rate_scale: LoRA's, else 1


def warmup_share(tc: TrainConfig, expected_steps: int | None) -> float:
    """The share of the budget the warmup may take: warmup_steps of the steps the budget buys.

    Those are max_steps or, under a time budget, the fewer steps it buys on a typical machine
    (expected_steps); with max_steps alone the step count always ends the warmup first. A time budget
    with no typical_steps lets the warmup take a tenth (or more, when max_steps is that near).
    """
    share = tc.warmup_steps / tc.max_steps
    if tc.max_seconds is None:
        return share
    if not expected_steps:
        return min(1.0, max(share, 0.1))
    return min(1.0, max(share, tc.warmup_steps / expected_steps))


def schedule_progress(step: int, elapsed: float, tc: TrainConfig) -> float:
    """How far through its budget a run is: the fraction of max_steps done, or of max_seconds
    when that is the nearer limit."""
    progress = step / tc.max_steps
    return max(progress, elapsed / tc.max_seconds) if tc.max_seconds else progress
