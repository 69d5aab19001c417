"""Scaled dot-product attention as the textbook writes it, one step at a time.

`attention()` spells out every step (scores, scale, mask, softmax, weighted sum) and returns the
weights, so it can be read, inspected and tested against worked examples. The model's multi-head
module (model.CausalSelfAttention) calls it, or by default `F.scaled_dot_product_attention`
(through fast/fused_attention.py), which computes the same thing in one fused kernel (flash attention
on a GPU) without materialising the T x T weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def causal_mask(T: int, S: int | None = None, device=None, window: int | None = None) -> torch.Tensor:
    """Boolean (T, S) mask, True where query i may attend to key j.

    The T queries are the last T of S positions (S > T while decoding with a KV cache), so query i
    sits at absolute position S - T + i and sees keys 0 .. S - T + i; with a window (sliding-window
    attention, Mistral's) only the last `window` of them, S - T + i - window < j.
    """
    S = T if S is None else S
    mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
    return mask if window is None else mask.triu(diagonal=S - T - window + 1)


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
