"""One forward pass, block by block, with a hand on the two places interpretability reaches into.

Every tool of minitf.interpret (head scores, ablation, attribution, patching) needs the same
pass as `minitf.inspect`, on a batch, and some need to change it on the way: a head's output
before the output projection (ablation, head patching) or the residual stream after a block
(activation patching). `trace()` runs inspect's own block loop (`inspection.run_blocks`), which
calls the caller's edits at those two places, and keeps of every block only the steps a tool
reads (`keep`): the T x T steps of a block a tool does not read are let go before the next block.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from ..inspection import run_blocks
from ..model import Transformer

# edit_heads(layer, heads (B, H, T, D)) -> heads; edit_resid(point, x (B, T, C)) -> x, point 0 the embeddings
HeadEdit = Callable[[int, torch.Tensor], torch.Tensor]
ResidEdit = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class Trace:
    """What one pass kept (B sequences, T tokens, L layers, H heads, head size D, width C)."""

    weights: list[torch.Tensor]  # L x (B, H, T, T) attention weights, rows sum to 1 ([] unless kept)
    heads: list[torch.Tensor]  # L x (B, H, T, D) each head's output before the output projection (after edits)
    attn_out: list[torch.Tensor]  # L x (B, T, C) what attention added to the residual stream
    ffn_out: list[torch.Tensor]  # L x (B, T, C) what the feed-forward network added
    residuals: list[torch.Tensor]  # (L + 1) x (B, T, C) the stream at the embeddings and after each block
    logits: torch.Tensor  # (B, T, V)


KEPT = ("weights", "heads", "attn_out", "ffn_out")  # the steps a Trace has a field for


@torch.no_grad()
def trace(
    model: Transformer,
    ids: torch.Tensor,
    edit_heads: HeadEdit | None = None,
    edit_resid: ResidEdit | None = None,
    keep: Collection[str] | Callable[[int, dict], dict] = KEPT,
) -> Trace:
    """Run (B, T) ids through the model's own modules, keeping of every block the steps in `keep`.

    The caller puts the model in eval mode. edit_heads(layer, heads) may return new head outputs,
    which then go through the output projection; edit_resid(point, x) may return a new residual
    stream at point 0 (the embeddings) or i + 1 (after block i), which the next block reads. keep:
    the names of the steps to keep (a Trace field left out is []), or keep(layer, steps), which
    reads a block's steps as they are made and returns what to keep of them.
    """
    if not callable(keep):
        names = set(keep)

        def keep(layer: int, steps: dict) -> dict:  # the same for every block
            return {name: t for name, t in steps.items() if name in names}

    layers, residuals, logits = run_blocks(model, ids, edit_heads, edit_resid, keep)
    return Trace(
        **{name: [steps[name] for steps in layers if name in steps] for name in KEPT},
        residuals=residuals,
        logits=logits,
    )
