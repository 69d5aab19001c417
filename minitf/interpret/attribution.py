"""Direct logit attribution: how much each part of the model writes, straight into the residual
stream, towards one token's logit.

The residual stream the LM head reads is a sum: the embeddings, then per block each head's output
through its slice of the output projection, the projection's bias, and the feed-forward output.
The final norm is not linear, but only through its scale, 1 / sqrt(var + eps) (LayerNorm) or
1 / sqrt(mean square + eps) (RMSNorm), a single number per position. Held at its value for the
whole stream (as TransformerLens does, freezing the LayerNorm scale), the norm is linear, and so
is the LM head: each part's share of the logit is its vector, centred (LayerNorm), times that
scale, times the norm's weight, dotted with the token's row of the LM head. The shares, plus the
norm's own bias pushed through the head, add up to the logit exactly.

"Direct" means only the path straight to the head: a head whose output a later layer reads has an
indirect effect that this does not count (ablation and patching measure that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..errors import MinitfError
from ..model import Transformer
from ..system.runtime import eval_mode
from .checks import as_batch, index, refuse
from .checks import token as token_id
from .memory import pass_bytes, per_pass
from .trace import trace


@dataclass
class Attribution:
    """The parts of one logit (L layers, H heads). `total()` adds them back up to `logit`.

    With model.logit_softcap set, `logit` is the logit before the soft cap (the cap is not linear)."""

    token: int  # the token whose logit is attributed (or, with `against`, token minus against)
    against: int | None
    position: int  # the position whose next-token logits are read
    logit: float  # the model's logit (difference), before any soft cap
    embedding: float  # the token embedding
    positions: float  # learned or sinusoidal position vectors (0 with rope, which adds none)
    heads: torch.Tensor  # (L, H) each head's output through its slice of the output projection
    attn_bias: torch.Tensor  # (L,) each attention output projection's bias (0 without biases)
    ffn: torch.Tensor  # (L,) each feed-forward network's output, its biases included
    norm_bias: float  # the final LayerNorm's bias through the head (0 for RMSNorm or without biases)

    def total(self) -> float:
        parts = self.embedding + self.positions + self.norm_bias
        return parts + float(self.heads.sum() + self.attn_bias.sum() + self.ffn.sum())


def final_norm_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(..., 1): the final norm's per-position scale, from the whole residual stream x (..., C)."""
    x = x.float()
    if isinstance(norm, nn.LayerNorm):
        return torch.rsqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (..., 1)
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps  # RMSNorm's default
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)


def head_writes(model: Transformer, layer: int, heads: torch.Tensor) -> torch.Tensor:
    """(H, C): what each head's output heads (H, D) writes into the stream through its slice of
    the output projection, without the projection's bias (that is a part of its own)."""
    H, D = heads.shape
    w = model.blocks[layer].attn.c_proj.weight.view(-1, H, D)  # (C, H, D): head h reads columns h*D .. (h+1)*D
    return torch.einsum("hd,chd->hc", heads.float(), w.float())  # (H, C)


@torch.no_grad()
def attribute(
    model: Transformer, ids, token: int, position: int = -1, against: int | None = None, budget: int | None = None
) -> Attribution:
    """Split the logit of `token` at `position` of ids (T,) or (1, T) into the model's parts.

    against: another token; then the logit difference token minus against is split (how much each
    part prefers one over the other, the usual question: "Mary" over "John"). budget: the bytes
    the pass may hold (memory.py; default memory.BUDGET).
    """
    if model.config.sandwich_norm:  # Gemma: each sub-layer's output is normalised before it is added
        raise MinitfError(
            "attribute splits a logit into the heads' and FFNs' shares of the residual stream, which "
            "model.sandwich_norm (Gemma) normalises before adding: those shares no longer sum to the logit; "
            "ablate or patch the heads instead"
        )
    ids = as_batch(model, ids)  # (1, T)
    if ids.size(0) != 1:
        raise refuse("ids", f"a batch of {ids.size(0)} sequences", "one sequence (T,): ids[i]")
    T = ids.size(1)
    p = index(position, "position", -T, T - 1, f" (a position of the {T} tokens, -1 the last)") % T
    token = token_id(model, token, "token")
    against = None if against is None else token_id(model, against, "against")
    per_pass(pass_bytes(model, T, ("heads", "ffn_out")), T, budget, "attribute")
    with eval_mode(model):
        tr = trace(model, ids, keep=("heads", "ffn_out"))
        tok = model.wte(ids)[0, p]  # (C,)
        pos = tr.residuals[0][0, p] - tok  # (C,) the embeddings less the token: positions, zero with rope
        head = model.lm_head(model.ln_f(tr.residuals[-1][0, p])).float()  # (V,) the logits before any soft cap
    unembed = model.lm_head.weight[token].float()  # (C,)
    if against is not None:
        unembed = unembed - model.lm_head.weight[against].float()
    norm = model.ln_f
    layernorm = isinstance(norm, nn.LayerNorm)
    direction = final_norm_scale(norm, tr.residuals[-1][0, p]) * unembed  # (C,) scale frozen from the whole stream
    if norm.weight is not None:
        direction = direction * norm.weight.float()

    def share(v: torch.Tensor) -> torch.Tensor:  # v (..., C) -> (...) its share of the logit
        v = v.float()
        if layernorm:  # LayerNorm subtracts the mean of the whole stream: of each part, by linearity
            v = v - v.mean(dim=-1, keepdim=True)
        return v @ direction

    L = model.config.n_layer
    bias = [model.blocks[i].attn.c_proj.bias for i in range(L)]
    return Attribution(
        token=token,
        against=against,
        position=p,
        logit=float(head[token] - (0 if against is None else head[against])),
        embedding=float(share(tok)),
        positions=float(share(pos)),
        heads=torch.stack([share(head_writes(model, i, tr.heads[i][0, :, p])) for i in range(L)]).cpu(),  # (L, H)
        attn_bias=torch.tensor([0.0 if b is None else float(share(b)) for b in bias]),  # (L,)
        ffn=torch.stack([share(tr.ffn_out[i][0, p]) for i in range(L)]).cpu(),  # (L,)
        norm_bias=0.0 if getattr(norm, "bias", None) is None else float(norm.bias.float() @ unembed),
    )
