"""One forward pass, block by block, with a hand on the two places interpretability reaches into.

Every tool of minitf.interpret (head scores, ablation, attribution, patching) needs the same
pass as `minitf.inspect`, on a batch, and some need to change it on the way: a head's output
before the output projection (ablation, head patching) or the residual stream after a block
(activation patching). `trace()` runs inspect's own block loop (`inspection.run_blocks`), which
calls the caller's edits at those two places, and keeps every tensor a tool reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..inspection import run_blocks
from ..model import Transformer
from ..tokenizer import check_ids

# edit_heads(layer, heads (B, H, T, D)) -> heads; edit_resid(point, x (B, T, C)) -> x, point 0 the embeddings
HeadEdit = Callable[[int, torch.Tensor], torch.Tensor]
ResidEdit = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class Trace:
    """What one pass kept (B sequences, T tokens, L layers, H heads, head size D, width C)."""

    weights: list[torch.Tensor]  # L x (B, H, T, T) attention weights, rows sum to 1
    heads: list[torch.Tensor]  # L x (B, H, T, D) each head's output before the output projection (after edits)
    attn_out: list[torch.Tensor]  # L x (B, T, C) what attention added to the residual stream
    ffn_out: list[torch.Tensor]  # L x (B, T, C) what the feed-forward network added
    residuals: list[torch.Tensor]  # (L + 1) x (B, T, C) the stream at the embeddings and after each block
    logits: torch.Tensor  # (B, T, V)


def as_batch(model: Transformer, ids) -> torch.Tensor:
    """Token ids (T,) or (B, T), a tensor or a list, -> (B, T) on the model's device; ids outside
    the vocabulary or longer than the context are refused in one line."""
    ids = torch.as_tensor(ids)
    if ids.dim() == 1:
        ids = ids[None]  # (1, T)
    if ids.dim() != 2 or ids.size(1) == 0 or ids.is_floating_point():
        raise ConfigError(f"ids must be token ids of shape (T,) or (B, T), got {tuple(ids.shape)} {ids.dtype}")
    block = model.config.block_size
    if ids.size(1) > block:
        raise ConfigError(f"ids are {ids.size(1)} tokens, the model sees at most block_size={block}; shorten them")
    check_ids(ids, model.config.vocab_size, "the batch")
    return ids.to(model.wte.weight.device)


@torch.no_grad()
def trace(
    model: Transformer, ids: torch.Tensor, edit_heads: HeadEdit | None = None, edit_resid: ResidEdit | None = None
) -> Trace:
    """Run (B, T) ids through the model's own modules, keeping every tensor a tool reads.

    The caller puts the model in eval mode. edit_heads(layer, heads) may return new head outputs,
    which then go through the output projection; edit_resid(point, x) may return a new residual
    stream at point 0 (the embeddings) or i + 1 (after block i), which the next block reads.
    """
    layers, residuals, logits = run_blocks(model, ids, edit_heads, edit_resid)
    return Trace(
        weights=[steps["weights"] for steps in layers],
        heads=[steps["heads"] for steps in layers],
        attn_out=[steps["attn_out"] for steps in layers],
        ffn_out=[steps["ffn_out"] for steps in layers],
        residuals=residuals,
        logits=logits,
    )
