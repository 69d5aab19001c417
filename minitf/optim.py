"""The optimizer and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import TrainConfig
from .system import runtime


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
    ns_dtype = "bfloat16" if device.type == "cuda" or runtime.cpu_has_native_bf16() else "float32"
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
    # the fused kernel updates all tensors in one pass instead of one small kernel per tensor
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=device.type in ("cuda", "cpu"))


def orthogonalise(g: torch.Tensor, dtype: torch.dtype, steps: int = 5) -> torch.Tensor:
    """Newton-Schulz iteration: g's singular vectors, with its singular values pushed toward 1.

    The quintic's coefficients (Keller Jordan's) make small values grow fast, at the price of
    landing in about 0.5 .. 1.5 instead of exactly 1, which trains as well. g is one matrix (r, c)
    or a stack of same-shape matrices (n, r, c), each orthogonalised on its own: a stack runs every
    iteration as one batched matmul instead of n small ones.
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(dtype)
    one = x.dim() == 2
    if one:
        x = x.unsqueeze(0)  # (1, r, c)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide form, so the Gram matrix is the smaller one
        x = x.mT
    # spectral norm <= Frobenius norm = 1: inside the iteration's range
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-7)  # (n, r, c)
    for _ in range(steps):
        gram = x @ x.mT  # (n, r, r), r = the smaller side
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b*G + c*G^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a*x + (b*G + c*G^2) @ x
    if tall:
        x = x.mT
    return x[0] if one else x


class Muon(torch.optim.Optimizer):
    """Muon: Nesterov momentum whose update of each 2-D matrix is orthogonalised (all directions move alike).

    The update is scaled by sqrt(max(1, rows / cols)), with decoupled weight decay: the rule of
    torch.optim.Muon (tests/test_optim.py checks that the steps are equal). Two differences make it
    faster on a CPU. The Newton-Schulz matmuls run in ns_dtype: torch's always uses bfloat16, which
    a CPU without native bfloat16 multiplies several times slower than float32. And matrices of one
    shape (the same weight in every block) are orthogonalised together, one batched matmul per
    iteration: a small model's step otherwise spends much of its optimizer time on the calls.
    """

    def __init__(
        self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.95, ns_dtype: str = "bfloat16"
    ):
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "ns_dtype": ns_dtype})

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, beta = group["lr"], group["momentum"]
            by_shape: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                self.state[p]["momentum_buffer"].lerp_(p.grad, 1 - beta)  # buf = beta * buf + (1 - beta) * grad
                by_shape.setdefault((tuple(p.shape), p.device), []).append(p)
            for ps in by_shape.values():
                nesterov = torch.stack([p.grad.lerp(self.state[p]["momentum_buffer"], beta) for p in ps])  # (n, r, c)
                updates = orthogonalise(nesterov, getattr(torch, group["ns_dtype"]))  # (n, r, c)
                scale = -lr * max(1.0, ps[0].size(0) / ps[0].size(1)) ** 0.5
                for p, update in zip(ps, updates):
                    p.mul_(1 - lr * group["weight_decay"])
                    p.add_(update.to(p.dtype), alpha=scale)


class Optimizers:
    """Several optimizers stepped as one, each over its own parameters.

    It offers what training uses of an optimizer: param_groups (all of them, so one LR schedule
    drives every group), step, zero_grad, and a state_dict holding each optimizer's state under its
    name.
    """

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
    return warm * (tc.min_lr + (tc.lr - tc.min_lr) * cosine)


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
