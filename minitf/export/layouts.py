"""How another format stores one minitf tensor: whole, transposed, split into parts, regrouped.

A layout's `split` turns minitf's tensor into the format's tensors, in the order of the names the
weight map (minitf.export.weights) gives them; its `join` turns the format's tensors back into
minitf's (the Hugging Face import; GGUF files are only written, so a GGUF-only layout has none).

What minitf keeps, and the layouts start from:
- every projection as nn.Linear keeps it, (out, in);
- q|k|v fused in one matrix: q's rows (n_head heads), then k's and v's (n_kv_head heads each);
- SwiGLU's gate|up fused in another, gate's rows first;
- rotary pairs dimension i with i + D/2 inside each head (HF's rotate_half);
- the embedding and the head padded to a multiple of 64 rows.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..system.sizes import padded_vocab


class Whole:
    """Stored as minitf stores it."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return [t]

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor | None:
        return parts[0]


class VocabRows(Whole):
    """The embedding or the head: only the tokenizer's rows leave minitf, so no padding id can
    ever be generated. An imported file may hold more rows: the first vocab_size are kept, in
    minitf's rows padded to a multiple of 64 (the padding zero), made in one copy in dtype
    (float32, or a frozen LoRA embedding's 16 bits when the file holds them so), or none where
    the tensor as read is that already."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return [t[: cfg.vocab_size]]

    def join(
        self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        t = parts[0]
        rows = padded_vocab(cfg.vocab_size)
        if t.shape[0] == rows == cfg.vocab_size and t.dtype == dtype and t.is_contiguous():
            return t  # already minitf's rows (a Llama 3's 128,256 are 64 x 2,004): no second copy
        out = torch.zeros(rows, t.shape[1], dtype=dtype)  # (padded V, C)
        out[: cfg.vocab_size] = t[: cfg.vocab_size]  # converted from the file's dtype as it is copied
        return out


class Transposed(Whole):
    """GPT-2's Conv1D, which keeps a projection as (in, out) where nn.Linear keeps (out, in)."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return [t.t()]

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor:
        return parts[0].t()


class HeadByHead(Whole):
    """GPT-NeoX's fused q|k|v, whose rows go head by head (q_0 k_0 v_0 q_1 ...) where minitf's
    hold every q head, then every k head, then every v head. The same for the bias."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return [t.reshape(3, cfg.n_head, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)]

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor:
        w = parts[0]
        return w.reshape(cfg.n_head, 3, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


class QKV:
    """q, k and v as three tensors (Llama's q_proj, k_proj, v_proj; llama.cpp's attn_q, attn_k, attn_v)."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        sizes = (cfg.n_head * cfg.head_size, cfg.kv_heads * cfg.head_size, cfg.kv_heads * cfg.head_size)
        if t.shape[0] != sum(sizes):  # the model's own shape: only a changed model could break it
            raise RuntimeError(f"attn.c_attn has {t.shape[0]} rows, expected (n_head + 2 n_kv_head) * head_dim")
        return list(t.split(sizes))

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor:
        return torch.cat(parts)


class QKVAdjacentPairs(QKV):
    """q, k and v for llama.cpp's llama graph, which rotates consecutive pairs (2i, 2i + 1) where
    minitf rotates (i, i + D/2): each head's q and k rows (and biases) are reordered to 0, D/2, 1,
    D/2 + 1, ..., as llama.cpp's own converter does for HF checkpoints. q @ k^T is unchanged,
    because both sides move alike. Written only (GGUF): there is no join."""

    join = None

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        q, k, v = super().split(t, cfg)
        return [rope_pairs_to_interleaved(q, cfg.n_head), rope_pairs_to_interleaved(k, cfg.kv_heads), v]


def rope_pairs_to_interleaved(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of a q or k projection (n_head * D, ...) or its bias (n_head * D,), reordered inside
    each head from minitf's rotate-half pairing (i, i + D/2) to llama.cpp's consecutive pairs
    (2i, 2i + 1): new row 2i + s is old row s * D/2 + i."""
    rest = w.shape[1:]
    d = w.shape[0] // n_head
    return w.reshape(n_head, 2, d // 2, *rest).transpose(1, 2).reshape(w.shape)


class GateUp:
    """SwiGLU's silu(x W_gate) * (x W_up) as two tensors (gate_proj and up_proj; ffn_gate and ffn_up)."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return list(t.chunk(2))

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor:
        return torch.cat(parts)


class PlusOne(Whole):
    """Gemma's RMSNorm gains, stored as w where the norm multiplies by 1 + w (so a fresh norm's zeros
    are ones): minitf keeps the 1 + w it multiplies by, computed once, as Gemma computes it in float32."""

    def split(self, t: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
        return [t - 1]

    def join(self, parts: list[torch.Tensor], names: tuple[str, ...], cfg: ModelConfig) -> torch.Tensor:
        return parts[0].float() + 1


WHOLE, VOCAB_ROWS, TRANSPOSED, HEAD_BY_HEAD, PLUS_ONE = Whole(), VocabRows(), Transposed(), HeadByHead(), PlusOne()
QKV_SPLIT, QKV_ADJACENT_PAIRS, GATE_UP = QKV(), QKVAdjacentPairs(), GateUp()

Layout = Whole | QKV | GateUp  # VocabRows, Transposed, HeadByHead and PlusOne are a Whole, QKVAdjacentPairs a QKV
