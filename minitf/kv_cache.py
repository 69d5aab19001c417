"""The KV cache: keys and values of every layer, kept between decoding steps.

The model reads and extends it in `forward(idx, cache=...)`; sampling (generate.py) creates it and
decides when to reset it. It lives below the model because attention writes into it.
"""

from __future__ import annotations

import copy

import torch

from .attention import causal_mask
from .config import ModelConfig


class KVCache:
    """Keys and values of every layer, preallocated to block_size: L tensors (B, KV, block_size, D)
    each, KV = model.n_kv_head (grouped-query attention stores n_head / n_kv_head times less).

    `pos` is how many positions are filled; a layer appends its new keys with `update`, and the
    model calls `advance` once all layers have seen the same new tokens.

    static=True keeps every shape fixed, for torch.compile: `pos` is a 0-d tensor, new keys are
    written at tensor positions, and attention reads all block_size slots behind a mask, so one
    compiled graph serves every step. The default slices to the filled part instead, which is
    cheaper without compilation. On a GPU its tensors are static addresses (mark_static).
    """

    def __init__(self, model: torch.nn.Module, batch_size: int = 1, static: bool = False):
        cfg: ModelConfig = model.config
        p = next(model.parameters())  # the cache takes the model's dtype and device
        shape = (batch_size, cfg.kv_heads, cfg.block_size, cfg.head_size)
        # one tensor per layer: under torch.compile a write into a slice of one big buffer
        # would copy the whole buffer every step
        self.k = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in range(cfg.n_layer)]
        self.static = static
        self.pos = torch.zeros((), dtype=torch.long, device=p.device) if static else 0
        self.mark_static()

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, KV, T, D) at positions pos .. pos+T; return the keys and values to attend to."""
        if self.static:
            idx = self.pos + torch.arange(k.size(2), device=k.device)  # (T,)
            self.k[layer].index_copy_(2, idx, k)
            self.v[layer].index_copy_(2, idx, v)
            return self.k[layer], self.v[layer]  # (B, KV, block_size, D): attn_mask hides the empty slots
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # (B, KV, end, D) each

    def attn_mask(self, T: int, window: int | None = None) -> torch.Tensor | None:
        """Which stored keys each of T new queries may see, (T, S) bool; None where the plain causal
        rule (query i sees keys 0 .. S - T + i) says the same. window: model.sliding_window."""
        if self.static:
            block = self.k[0].size(2)
            q_pos = self.pos + torch.arange(T, device=self.pos.device)  # (T,)
            k_pos = torch.arange(block, device=q_pos.device)  # (block_size,)
            mask = k_pos <= q_pos[:, None]  # (T, block_size)
            return mask if window is None else mask & (k_pos > q_pos[:, None] - window)
        S = self.pos + T
        if window is not None and S > window:
            return causal_mask(T, S, device=self.k[0].device, window=window)
        return None if T == 1 or self.pos == 0 else causal_mask(T, S, device=self.k[0].device)

    def advance(self, n: int) -> None:
        self.pos += n  # in place when pos is a tensor

    def reset(self) -> None:
        self.pos = self.pos.zero_() if self.static else 0

    def repeat(self, n: int) -> KVCache:
        """A batch-n copy of a batch-1 cache: prefill a shared prompt once, then sample n ways."""
        out = copy.copy(self)  # same settings; new tensors below, so the two never share storage
        out.k = [k.repeat(n, 1, 1, 1) for k in self.k]  # (n, KV, block_size, D) each
        out.v = [v.repeat(n, 1, 1, 1) for v in self.v]
        out.pos = self.pos.clone() if self.static else self.pos
        out.mark_static()
        return out

    def mark_static(self) -> None:
        """On a GPU, tell torch.compile a static cache's tensors keep their addresses: the decode
        step's CUDA graph (fast/decoding.py) then reads and writes them in place, not copying every
        layer's cache in and out per token. Unguarded: a new cache records the graph again, with
        no recompilation. (A CPU has no graphs; its compiled step stays as it is.)"""
        if self.static and self.pos.device.type == "cuda":
            from torch._dynamo import mark_static_address  # the compiler, imported only where used

            for t in (*self.k, *self.v, self.pos):
                mark_static_address(t, guard=False)
