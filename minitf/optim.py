"""The optimizer and the learning-rate schedule."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig


def make_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device):
    """AdamW (train.optimizer=adamw), or Muon for the blocks' matrices with AdamW for the rest
    (train.optimizer=muon, returned as one `Optimizers`)."""
    params = list(dict.fromkeys(model.parameters()))  # tied weights once
    if tc.optimizer == "adamw":
        return _adamw(model, params, tc, device)
    # Muon orthogonalises each update of a 2-D weight matrix. Embeddings, the LM head, norms and
    # biases are not such maps (an embedding row is a lookup, not a matrix product), so AdamW keeps them.
    hidden = {id(p) for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2}
    matrices = [p for p in params if id(p) in hidden]
    muon = torch.optim.Muon([{"params": matrices, "lr_scale": tc.muon_lr / tc.lr}], lr=tc.muon_lr,
                            weight_decay=tc.weight_decay, momentum=tc.muon_momentum)
    return Optimizers(adamw=_adamw(model, [p for p in params if id(p) not in hidden], tc, device), muon=muon)


def _adamw(model: nn.Module, params: list, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over params; weight decay only on the matrices of linear layers.

    Decay pulls weights toward zero. That regularises the matrices that mix features, but on a
    norm's gain or a bias it only fights the scale the layer needs, and on embeddings it would
    shrink the rows of rare tokens, which get few gradient updates to push back.
    """
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay -= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}  # tied head
    groups = [{"params": [p for p in params if id(p) in decay], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}]
    # the fused kernel updates all tensors in one pass instead of one small kernel per tensor
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2),
                             fused=device.type in ("cuda", "cpu"))


class Optimizers:
    """Several optimizers stepped as one, each over its own parameters. It offers what training
    uses of an optimizer: param_groups (all of them, so one LR schedule drives every group),
    step, zero_grad, and a state_dict holding each optimizer's state under its name."""

    def __init__(self, **named: torch.optim.Optimizer):
        self.named = named

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.named.values() for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.named.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.named.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.named.items()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or set(state) != set(self.named):
            raise ValueError(f"expected the states of {', '.join(self.named)}")
        for name, opt in self.named.items():
            opt.load_state_dict(state[name])


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
