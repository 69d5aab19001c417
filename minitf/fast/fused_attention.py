"""Attention through PyTorch's fused kernels (F.scaled_dot_product_attention), with grouped-query
heads given to each kernel the way it takes them.

attention.py writes the formula out; the model computes the same thing here by default, without
materialising the T x T weights. With grouped heads (model.n_kv_head < n_head) the kernel may take
the n_kv_head keys and values as they are (enable_gqa): flash attention on a GPU and the CPU's
kernels do. PyTorch's other CUDA kernels (the memory-efficient one, used with a mask, in float32
or below sm80) refuse it and leave the math kernel, which holds the (T, S) scores in float32;
there the keys and values are repeated to all n_head heads first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_attention(q, k, v, mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None) -> torch.Tensor:
    """softmax(q kᵀ / √D) v, (B, H, T, D), as attention.attention computes it. q (B, H, T, D); k, v
    (B, KV, S, D) with KV dividing H: key/value head j serves query heads j*H/KV .. (j+1)*H/KV - 1
    (KV = H: plain multi-head). mask (T, S) bool or None; is_causal: hide future keys (with S == T:
    the kernel's causal rule is top-left aligned); scale: the scores' scale, None for 1/√D."""
    grouped = k.size(1) != q.size(1)
    if grouped and q.is_cuda and not flash_inputs(q, mask):  # a CPU's kernels take grouped heads
        k, v, grouped = repeat_heads(k, q.size(1)), repeat_heads(v, q.size(1)), False  # (B, H, S, D) each
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=grouped
    )  # (B, H, T, D)


def repeat_heads(kv: torch.Tensor, H: int) -> torch.Tensor:
    """Keys or values (B, KV, S, D) -> (B, H, S, D): each key/value head repeated for its group of
    H / KV query heads (kv itself without grouping, KV = H)."""
    return kv if kv.size(1) == H else kv.repeat_interleave(H // kv.size(1), dim=1)


def flash_inputs(q: torch.Tensor, mask) -> bool:
    """Whether a GPU runs flash attention on these inputs, the one CUDA kernel that takes grouped
    heads: float16 or bfloat16, no mask, a head size of at most 256, an sm80 or newer GPU."""
    return mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) <= 256 and flash_gpu(q.device)


def flash_gpu(device: torch.device) -> bool:
    """An sm80 or newer GPU (A100, H100, RTX 30xx and later), where PyTorch's flash attention runs."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def constant_while_compiling() -> None:
    """Mark flash_gpu a constant to torch.compile: read once while compiling, so no graph break, and
    a GPU stays what it is. What compiles calls this (Transformer.compile_regions, compile_decode)
    rather than a decorator at import, which imports torch._dynamo: about 1.5 s of every process
    that imports minitf, most of which never compile."""
    torch.compiler.assume_constant_result(flash_gpu)  # marks the function itself: every caller sees it
