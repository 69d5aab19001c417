"""How big a model and its samples are, counted from the config alone, and the checks that they fit
this machine's memory: a model of 10**7 layers, or 2,000,000 samples at once, is refused in one
line before a byte is allocated, not by a failed allocation deep in torch (or by swapping).

The widths the model is built with (its padded vocabulary, the feed-forward block's hidden width)
are here too, so that the count and the model read them from one place.
"""

from __future__ import annotations

import math

from ..config import ModelConfig
from ..errors import ConfigError
from .memory import physical_memory, size_words

VOCAB_MULTIPLE = 64  # embedding rows are padded to this for faster matmuls


def padded_vocab(vocab_size: int) -> int:
    return math.ceil(vocab_size / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def swiglu_hidden(n_embd: int) -> int:
    """About 8/3 of the width, so SwiGLU's three matrices cost what GELU's two 4x ones do."""
    return max(64, 64 * round(8 * n_embd / 3 / 64))


def ffn_hidden(cfg: ModelConfig) -> int:
    """The feed-forward block's hidden width: model.ffn_hidden, else 4 x n_embd (swiglu: swiglu_hidden)."""
    if cfg.ffn_hidden is not None:
        return cfg.ffn_hidden
    if cfg.ffn in ("swiglu", "geglu"):
        return swiglu_hidden(cfg.n_embd)
    return 4 * cfg.n_embd


# ---------------------------------------------------------------- the model's weights


def model_floats(cfg: ModelConfig) -> int:
    """How many float32 numbers Transformer(cfg) holds: its parameters (a tied head counted once)
    and its position buffers (sinusoidal table, rotary cos and sin)."""
    C, V, T = cfg.n_embd, padded_vocab(cfg.vocab_size or 0), cfg.block_size
    bias = int(cfg.bias)
    norm = C * (1 + bias) if cfg.norm == "layernorm" else C
    hidden = ffn_hidden(cfg)
    qkv = (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_size
    gated = cfg.ffn in ("swiglu", "geglu")
    block = (
        (4 if cfg.sandwich_norm else 2) * norm
        + C * qkv
        + qkv * int(cfg.has_qkv_bias)  # c_attn
        + cfg.attn_width * C
        + C * bias  # attention's c_proj
        + 2 * cfg.head_size * int(cfg.qk_norm)  # the q and k norms' gains
        + C * hidden * (2 if gated else 1)
        + hidden * (2 if gated else 1) * bias
        + hidden * C
        + C * bias  # the feed-forward's c_proj
    )
    rotary = T * 2 * (cfg.head_size // 2) * (2 if cfg.rope_local_base is not None else 1)  # cos, sin; local ones too
    positions = T * C if cfg.positions in ("learned", "sinusoidal") else rotary
    head = 0 if cfg.tie_embeddings else V * C
    return V * C + positions + cfg.n_layer * block + norm + head


def check_fits_in_memory(cfg: ModelConfig) -> None:
    """Refuse, in one line, a model whose float32 weights alone outgrow this machine's memory.

    Counted from the config (model_floats), so model.block_size=10**15 or model.n_layer=10**7 is
    refused before a byte is allocated, not by a failed allocation deep in torch or after minutes
    spent building layers."""
    need = 4 * model_floats(cfg)
    have = physical_memory()
    if have is not None and need > have:
        raise ConfigError(
            f"this model (n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, block_size={cfg.block_size}, vocabulary "
            f"{cfg.vocab_size}) needs {size_words(need)} for its float32 weights alone, more than this machine's "
            f"{size_words(have)} of memory; choose smaller model.* values"
        )


# ---------------------------------------------------------------- the samples generated at once


# float32 (B, V) tensors a decoding step holds per row at its peak: the step's logits, their
# penalized and shifted copies, the probabilities, the exponential race and its quotient
SAMPLER_COPIES = 6


def sample_row_bytes(model) -> int:
    """The memory one more sample takes while decoding: its row of the KV cache (block_size keys
    and values of every layer) and of the sampler's float32 logits."""
    cfg, p = model.config, next(model.parameters())
    cache = 2 * cfg.n_layer * cfg.kv_heads * cfg.block_size * cfg.head_size * p.element_size()
    return cache + SAMPLER_COPIES * 4 * padded_vocab(cfg.vocab_size)


def check_num_samples(model, num_samples: int, name: str = "num_samples") -> None:
    """Refuse, in one line, a number of samples below 1 or beyond this machine's memory, before a
    byte is allocated: the rows are allocated at once after the prompt's prefill, so
    num_samples=2_000_000 would otherwise fail deep in torch (or swap) after 32 GB.
    name: how the caller's user names it (--num-samples, n)."""
    if num_samples < 1:
        raise ConfigError(f"{name} must be at least 1, got {num_samples}")
    row, have = sample_row_bytes(model), physical_memory()
    if have is not None and num_samples * row > have:
        raise ConfigError(
            f"{name}={num_samples} needs {size_words(num_samples * row)} for the KV cache and logits of that many "
            f"samples, more than this machine's {size_words(have)} of memory; ask for at most {have // row}"
        )
