"""The optimizer and the learning-rate schedule."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig


def make_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on the matrices of linear layers.

    Decay pulls weights toward zero. That regularises the matrices that mix features, but on a
    norm's gain or a bias it only fights the scale the layer needs, and on embeddings it would
    shrink the rows of rare tokens, which get few gradient updates to push back.
    """
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay -= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}  # tied head
    params = list(dict.fromkeys(model.parameters()))  # tied weights once
    groups = [{"params": [p for p in params if id(p) in decay], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}]
    # the fused kernel updates all tensors in one pass instead of one small kernel per tensor
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2),
                             fused=device.type in ("cuda", "cpu"))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set this step's learning rate: lr times each group's lr_scale (1 unless the group says)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def lr_at(step: int, progress: float, tc: TrainConfig) -> float:
    """Linear warmup over warmup_steps, times a cosine from lr to min_lr over progress 0 -> 1.

    progress is the fraction of max_steps done, or of max_seconds when that is the nearer limit,
    so a time-budgeted run still anneals to min_lr.
    """
    warm = min(1.0, (step + 1) / tc.warmup_steps) if tc.warmup_steps else 1.0
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return warm * (tc.min_lr + (tc.lr - tc.min_lr) * cosine)


def schedule_progress(step: int, elapsed: float, tc: TrainConfig) -> float:
    """How far through its budget a run is: the fraction of max_steps done, or of max_seconds
    when that is the nearer limit."""
    progress = step / tc.max_steps
    return max(progress, elapsed / tc.max_seconds) if tc.max_seconds else progress
