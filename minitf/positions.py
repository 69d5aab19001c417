"""Where a token stands: learned, sinusoidal and rotary positions.

Position information: learned or sinusoidal vectors added to the embeddings, or rotary (RoPE)
rotations applied to queries and keys. Each takes an `offset`, the absolute position of the first
token, which KV-cache decoding needs (the new token is not at position 0).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def position_ids(T: int, offset, device=None) -> torch.Tensor:
    """Absolute positions offset .. offset + T - 1, shape (T,).

    offset is an int, or a 0-d tensor when decoding with a static KV cache under torch.compile:
    a tensor keeps the shapes fixed, so one compiled graph serves every position.
    """
    return torch.arange(T, device=device) + offset


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(pos / 10000^(2i/dim))."""
    pos = torch.arange(n_pos, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (ceil(dim/2),)
    angle = pos / 10000.0 ** (two_i / dim)  # (P, ceil(dim/2))
    pe = torch.zeros(n_pos, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return pe.float()


def rotary_angles(n_pos: int, head_dim: int, base: float = 10000.0, scaling=None) -> torch.Tensor:
    """(P, D/2) float64: the angle, in radians, by which rotary positions turn pair i at position
    pos: pos * base^(-2i/D). Low pairs turn fast (a full turn every few tokens), high ones slowly.
    scaling: None, or a function that slows the frequencies down (rope_scaling's)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    if scaling is not None:
        inv_freq = scaling(inv_freq)
    return torch.outer(torch.arange(n_pos, dtype=torch.float64), inv_freq)  # (P, D/2)


# ---- the options: each one a place the default path above does not need


def rope_scaling(cfg):
    """model.rope_scaling as a function of the frequencies (D/2,) -> (D/2,), or None (none).

    A model trained at one context and then stretched to a longer one slows its rotations, so the
    new positions turn through angles it has seen: linear divides every frequency by rope_factor;
    llama3 (Llama 3.1, 3.2, 3.3) divides only the slow ones, whose wavelength is longer than the
    original context / low_freq_factor, keeps the fast ones (shorter than original context /
    high_freq_factor), which tell neighbouring tokens apart, and blends in between."""
    if cfg.rope_scaling == "linear":
        return lambda inv_freq: inv_freq / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        return lambda inv_freq: llama3_frequencies(
            inv_freq,
            cfg.rope_factor,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_original_context,
        )
    return None


def local_rope(cfg):
    """model.rope_local_base's Rotary for the sliding layers (Gemma 3's local layers turn with base
    10000, its global ones with 1000000), or None: every layer turns by the model's own."""
    if cfg.positions != "rope" or cfg.rope_local_base is None:
        return None
    return Rotary(cfg.block_size, cfg.head_size, cfg.rope_local_base)


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, low: float, high: float, context: int) -> torch.Tensor:
    """Llama 3.1's rotary frequencies (D/2,): slow pairs / factor, fast pairs kept, a linear blend between."""
    wavelength = 2 * math.pi / inv_freq  # (D/2,) tokens per full turn
    smooth = ((context / wavelength - low) / (high - low)).clamp(0, 1)  # 0: slow, scaled; 1: fast, kept
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class LearnedPositions(nn.Module):
    """One trained vector per position, up to block_size (GPT-2's `wpe`)."""

    def __init__(self, block_size: int, dim: int):
        super().__init__()
        self.wpe = nn.Embedding(block_size, dim)

    def forward(self, T: int, offset=0) -> torch.Tensor:
        return self.wpe(position_ids(T, offset, self.wpe.weight.device))  # (T, C)


class SinusoidalPositions(nn.Module):
    """The fixed table of "Attention Is All You Need"; nothing to train."""

    def __init__(self, block_size: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(block_size, dim), persistent=False)

    def forward(self, T: int, offset=0) -> torch.Tensor:
        return self.table[position_ids(T, offset, self.table.device)]  # (T, C)


class Rotary(nn.Module):
    """Rotary position embedding (RoPE), rotate-half layout: dimension i is paired with i + D/2.

    Each pair is rotated by the angle pos * base^(-2i/D), so q·k after rotation depends only on
    the distance between the two positions, and vector norms are unchanged.

    `forward(x, offset)` rotates x (..., T, D), positions on the next-to-last dimension;
    `rotate_heads(x, offset)` rotates x (B, T, heads, D), the layout of the attention's fused
    projection, so queries and keys turn in one pass (attention rotates them together).
    """

    def __init__(self, block_size: int, head_dim: int, base: float = 10000.0, scaling=None):
        super().__init__()
        angle = rotary_angles(block_size, head_dim, base, scaling)  # (P, D/2)
        self.register_buffer("cos", angle.cos().float(), persistent=False)
        self.register_buffer("sin", angle.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, offset=0) -> torch.Tensor:
        cos, sin = self.tables(x.size(-2), offset, x.dtype)  # (T, D) each
        return self.turn(x, cos, sin)

    def rotate_heads(self, x: torch.Tensor, offset=0) -> torch.Tensor:
        cos, sin = self.tables(x.size(-3), offset, x.dtype)  # (T, D) each
        return self.turn(x, cos.unsqueeze(1), sin.unsqueeze(1))  # tables (T, 1, D) broadcast over heads

    def tables(self, T: int, offset, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of positions offset .. offset + T - 1, each (T, D): cos repeated for both
        halves, sin with the first half negated, so a rotation is one multiply-add (turn)."""
        pos = position_ids(T, offset, self.cos.device)  # (T,)
        cos, sin = self.cos[pos].to(dtype), self.sin[pos].to(dtype)  # (T, D/2) each
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)  # (T, D) each

    @staticmethod
    def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Each pair (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin): bit for bit what the written-out
        rotation gives ((-s) x == -(s x) and a + -b == a - b in floating point), in four kernels."""
        x1, x2 = x.chunk(2, dim=-1)  # (..., D/2) each
        return x * cos + torch.cat((x2, x1), dim=-1) * sin  # (..., D)
