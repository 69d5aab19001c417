"""Self-attention: the textbook reference path, the fused fast path, and the multi-head module.

The reference `attention()` spells out every step (scores, scale, mask, softmax, weighted sum)
and returns the weights, so it can be read, inspected and tested against worked examples. The
module uses `F.scaled_dot_product_attention` by default, which computes the same thing in one
fused kernel (flash attention on a GPU) without materialising the T x T weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


def causal_mask(T: int, S: int | None = None, device=None) -> torch.Tensor:
    """Boolean (T, S) mask, True where query i may attend to key j.

    The T queries are the last T of S positions (S > T while decoding with a KV cache), so query i
    sits at absolute position S - T + i and sees keys 0 .. S - T + i.
    """
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def _as_tensor(x) -> torch.Tensor:
    x = torch.as_tensor(x) if isinstance(x, np.ndarray) else x
    return x if x.is_floating_point() else x.float()


def attention_steps(q, k, v, causal: bool = False, mask=None, scale: float | None = None) -> dict:
    """Scaled dot-product attention with every textbook step kept, as a dict of tensors.

    scores = q @ k^T (..., T, S); scaled = scores * scale; masked = scaled with -inf where a key
    is hidden; weights = softmax of each masked row (..., T, S); out = weights @ v (..., T, d_v).
    See `attention` for the arguments.
    """
    q, k, v = _as_tensor(q), _as_tensor(k), _as_tensor(v)
    T, S, d_k = q.size(-2), k.size(-2), q.size(-1)
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale

    scores = q @ k.transpose(-2, -1)  # (..., T, S)
    scaled = scores * scale
    masked = scaled
    if causal:
        masked = masked.masked_fill(~causal_mask(T, S, device=scores.device), float("-inf"))
    if mask is not None:
        mask = torch.as_tensor(mask, device=scores.device)
        masked = masked.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else masked + mask
    dead = torch.isneginf(masked).all(dim=-1, keepdim=True)  # (..., T, 1) rows with no visible key
    # keep softmax finite on a dead row, whose weights are then zeroed
    weights = torch.softmax(masked.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)  # (..., T, S)
    out = weights @ v  # (..., T, d_v)
    return dict(scores=scores, scaled=scaled, masked=masked, weights=weights, out=out)


def attention(q, k, v, causal: bool = False, mask=None, scale: float | None = None):
    """Scaled dot-product attention, step by step. Returns (out, weights).

    q, k: (..., T, d_k) and (..., S, d_k); v: (..., S, d_v); torch tensors or numpy arrays.
    scale: None means 1/sqrt(d_k), 1.0 means unscaled.
    mask: boolean (True = may attend) or additive (added to the scores), broadcastable to (..., T, S).
    causal: hide future keys (with S > T the queries are the last T positions, see causal_mask).

    A row whose keys are all masked attends to nothing: its weights are all zero and its output
    is zero. (A plain softmax over all -inf would give NaN.) Every other row of weights sums to 1.
    """
    steps = attention_steps(q, k, v, causal=causal, mask=mask, scale=scale)
    return steps["out"], steps["weights"]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection.

    `forward(x, rope, cache, layer)`: `rope` rotates q and k (rotary positions); `cache` is a
    KVCache whose keys and values this layer appends to (the model advances its position once
    all layers have run). `steps(x, rope)` computes the same output with every step kept, for
    inspection.

    Which path computes attention:
    - `F.scaled_dot_product_attention` (one fused kernel) when model.attention=sdpa;
    - the written-out `attention()` when model.attention=reference, or when decoding with a
      static cache (KVCache(static=True), made for torch.compile, which fuses the written-out
      mask and softmax around the two small matmuls: cheaper than the fused kernel's fixed cost).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.fused = cfg.attention == "sdpa"
        self.qk_norm = cfg.qk_norm

    def qkv(self, x: torch.Tensor, rope=None, offset=0):
        """Queries, keys and values of every head, (B, H, T, D) each; q and k RMS-normalised per
        head when model.qk_norm, then rotated by rope if given."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        if self.qk_norm:  # unit-RMS rows bound every score, so no logit can run away with one head
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        if rope is not None:
            q, k = rope(q, offset), rope(k, offset)
        return q, k, v

    def project(self, heads: torch.Tensor) -> torch.Tensor:
        """(B, H, T, D) head outputs -> (B, T, C): side by side, through the output projection."""
        B, H, T, D = heads.shape
        return self.resid_dropout(self.c_proj(heads.transpose(1, 2).reshape(B, T, H * D)))

    def forward(self, x, rope=None, cache=None, layer: int = 0):
        T = x.size(1)
        q, k, v = self.qkv(x, rope, offset=cache.pos if cache is not None else 0)
        mask = None  # None: query i sees keys 0 .. S - T + i, the plain causal rule
        if cache is not None:
            mask = cache.attn_mask(T)  # (T, S) bool, or None where the causal rule says the same
            k, v = cache.update(layer, k, v)  # (B, H, S, D)

        if self.fused and not (cache is not None and cache.static):
            p = self.dropout if self.training else 0.0
            # is_causal is top-left aligned, right only when S == T; one query (T == 1) sees every key
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None and T > 1
            )  # (B, H, T, D)
        else:
            y, weights = attention(q, k, v, causal=mask is None, mask=mask)  # (B, H, T, D), (B, H, T, S)
            if self.training and self.dropout > 0:
                y = F.dropout(weights, self.dropout) @ v
        return self.project(y)

    def steps(self, x: torch.Tensor, rope=None) -> dict:
        """forward() for a whole sequence (no cache, no dropout), every step kept: q, k, v
        (B, H, T, D), scores/scaled/masked/weights (B, H, T, T), heads (B, H, T, D), out (B, T, C)."""
        q, k, v = self.qkv(x, rope)
        s = attention_steps(q, k, v, causal=True)
        return dict(
            q=q,
            k=k,
            v=v,
            scores=s["scores"],
            scaled=s["scaled"],
            masked=s["masked"],
            weights=s["weights"],
            heads=s["out"],
            out=self.project(s["out"]),
        )
