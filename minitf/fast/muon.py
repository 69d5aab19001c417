"""Muon: momentum whose update of each 2-D weight matrix is orthogonalised (Newton-Schulz), for the
blocks' matrices (train.optimizer=muon), and `Optimizers`, which steps it and AdamW as one.

Machinery beside optim.py: a learner reads make_optimizer there and comes here for how the
orthogonalisation is computed fast.
"""

from __future__ import annotations

import torch


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
    torch.optim.Muon (tests/unit/fast/test_muon.py checks that the steps are equal). Two differences make it
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
