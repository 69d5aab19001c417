"""Head ablation: the model run with some attention heads switched off, and what that changes.

Switching a head off is the first test of what it does: if the prediction or the loss moves, the
head mattered for this text. A head is switched off where `minitf.inspect`'s `heads` sit, its
output before the output projection: replaced by zeros ("zero"), or by its mean output over a
reference text ("mean"), which keeps what the head writes on average and removes only what
depends on this text (zero ablation also removes the average, which the rest of the model may
rely on as a constant). The output projection and its bias still run, so an ablated layer still
adds its bias to the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from ..fast.lm_loss import IGNORE
from ..model import Transformer
from ..system.runtime import eval_mode
from .checks import as_batch, described, head_pairs, refuse
from .memory import pass_bytes, per_pass
from .trace import trace


@dataclass
class Ablation:
    """The model's prediction and loss on ids, with every head and with `heads` switched off
    (B sequences of T tokens, V the vocabulary). The distributions are the next token's after
    the last position; the losses are the mean next-token loss over the sequences (None for T = 1)."""

    heads: list[tuple[int, int]]  # the (layer, head) pairs switched off
    logits_before: torch.Tensor  # (B, T, V)
    logits_after: torch.Tensor  # (B, T, V)
    probs_before: torch.Tensor  # (B, V) softmax of the last position's logits
    probs_after: torch.Tensor  # (B, V)
    loss_before: float | None
    loss_after: float | None


@torch.no_grad()
def mean_head_outputs(model: Transformer, reference, budget: int | None = None) -> torch.Tensor:
    """(n_layer, n_head, D): each head's output before the output projection, averaged over
    every position of the reference ids (T,) or (B, T)."""
    ids = as_batch(model, reference, "reference")  # (B, T)
    size = per_pass(pass_bytes(model, ids.size(1), ("heads",)), ids.size(1), budget, "mean_head_outputs")
    total = 0.0
    with eval_mode(model):
        for part in ids.split(size):  # (b, T)
            heads = trace(model, part, keep=("heads",)).heads  # L x (b, H, T, D)
            total = total + torch.stack([h.float().sum(dim=(0, 2)) for h in heads])  # (L, H, D)
    return total / ids.numel()  # (L, H, D)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> float | None:
    """Mean cross-entropy of logits (B, T, V) at positions 0 .. T - 2 against ids 1 .. T - 1."""
    if ids.size(1) < 2:
        return None
    return float(F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], ignore_index=IGNORE))


@torch.no_grad()
def ablate(
    model: Transformer,
    ids,
    heads,
    mode: Literal["zero", "mean"] = "zero",
    reference=None,
    budget: int | None = None,
) -> Ablation:
    """Run ids (T,) or (B, T) with the (layer, head) pairs in `heads` switched off.

    mode="zero" replaces each head's output with zeros; mode="mean" with its mean output over
    `reference` (token ids; by default ids themselves). "Before" is the model's own forward pass;
    with no heads, "after" is that same pass, so the two are equal exactly. Sequences go in
    passes of at most `budget` bytes (memory.py; default memory.BUDGET).
    """
    ids = as_batch(model, ids)  # (B, T)
    pairs = head_pairs(model, heads)
    if mode not in ("zero", "mean"):
        raise refuse("mode", described(mode), "'zero' or 'mean'")
    means = mean_head_outputs(model, ids if reference is None else reference, budget) if mode == "mean" else None
    off = {layer: [h for lay, h in pairs if lay == layer] for layer, _ in pairs}

    def edit(layer: int, out: torch.Tensor) -> torch.Tensor:  # out (b, H, T, D)
        if layer not in off:
            return out
        out = out.clone()
        for h in off[layer]:
            out[:, h] = 0.0 if means is None else means[layer, h].to(out.dtype)  # (b, T, D) <- (D,)
        return out

    size = per_pass(pass_bytes(model, ids.size(1), ("heads",)), ids.size(1), budget, "ablate")
    before, after = [], []
    with eval_mode(model):
        for part in ids.split(size):  # (b, T)
            before.append(model(part)[0])  # (b, T, V)
            after.append(trace(model, part, edit_heads=edit, keep=()).logits if pairs else before[-1])  # (b, T, V)
    before, after = torch.cat(before), torch.cat(after)  # (B, T, V) each
    return Ablation(
        heads=pairs,
        logits_before=before,
        logits_after=after,
        probs_before=torch.softmax(before[:, -1].float(), dim=-1),  # (B, V)
        probs_after=torch.softmax(after[:, -1].float(), dim=-1),  # (B, V)
        loss_before=next_token_loss(before, ids),
        loss_after=next_token_loss(after, ids),
    )
