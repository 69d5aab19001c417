"""Grouped-query heads through PyTorch's fused kernels: as they are where the kernel takes them (a
CPU; flash attention on a GPU), repeated to every query head where a GPU's kernel would refuse
them and fall to the math kernel. The GPU's inputs are FakeTensors on `cuda` (shapes, dtypes and
devices without a GPU) and its capability a stand-in: what each case hands the kernel is checked."""

import pytest
import torch
import torch.nn.functional as F

from minitf.attention import attention, causal_mask
from minitf.fast.fused_attention import fused_attention, repeat_heads


class SDPACalls:
    """F.scaled_dot_product_attention, recording the key heads and enable_gqa of each call."""

    def __init__(self, monkeypatch):
        self.calls, self.real = [], F.scaled_dot_product_attention
        monkeypatch.setattr(F, "scaled_dot_product_attention", self)

    def __call__(self, q, k, v, **kw):
        self.calls.append((k.size(1), v.size(1), kw["enable_gqa"]))
        if q.device.type == "cuda":  # FakeTensors: shapes only, no kernel to run
            return torch.empty_like(q)
        return self.real(q, k, v, **kw)


def fake_gpu_qkv(dtype, head_dim=16, H=4, KV=2):
    """q (1, H, 5, D), k and v (1, KV, 5, D) as FakeTensors on `cuda`: a GPU's inputs without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (torch.empty(1, n, 5, head_dim, dtype=dtype, device="cuda") for n in (H, KV, KV))
        return q, k, v


FLASH = dict(dtype=torch.bfloat16, mask=False, head_dim=64, sm=(9, 0))


@pytest.mark.parametrize(
    "case, native",
    [
        ({}, True),  # flash takes grouped heads: no copies
        ({"dtype": torch.float16, "sm": (8, 0)}, True),
        ({"mask": True}, False),  # a mask: no flash
        ({"dtype": torch.float32}, False),
        ({"dtype": torch.float16, "sm": (7, 5)}, False),  # a T4
        ({"head_dim": 512}, False),
    ],
    ids=["flash", "fp16-sm80", "mask", "float32", "below-sm80", "head-512"],
)
def test_grouped_heads_on_a_gpu_are_repeated_where_flash_cannot_run(monkeypatch, case, native):
    """Outside flash attention, PyTorch's CUDA kernels refuse enable_gqa and leave the math kernel
    (the (T, S) scores in float32): there k and v reach the kernel with all H heads, as plain attention."""
    c = {**FLASH, **case}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: c["sm"])
    sdpa = SDPACalls(monkeypatch)
    q, k, v = fake_gpu_qkv(c["dtype"], c["head_dim"])
    mask = torch.ones(5, 5, dtype=torch.bool).tril() if c["mask"] else None
    out = fused_attention(q, k, v, mask)
    assert out.shape == q.shape and out.device.type == "cuda"
    assert sdpa.calls == ([(2, 2, True)] if native else [(4, 4, False)])


def test_plain_heads_on_a_gpu_go_through_as_they_are(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    sdpa = SDPACalls(monkeypatch)
    fused_attention(*fake_gpu_qkv(torch.float32, KV=4))
    assert sdpa.calls == [(4, 4, False)]


def test_a_cpu_takes_grouped_heads_as_they_are(monkeypatch):
    """The CPU's kernels take enable_gqa, faster than repeating the heads (docs/performance.md)."""
    sdpa = SDPACalls(monkeypatch)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    fused_attention(q, k, v, is_causal=True)
    fused_attention(q, k, v, causal_mask(6, 6))
    assert sdpa.calls == [(2, 2, True), (2, 2, True)]


@pytest.mark.parametrize("masked", [False, True])
def test_repeated_heads_give_the_grouped_kernels_output(masked):
    """The repetition a GPU takes outside flash computes what enable_gqa computes: key/value head
    j serves query heads 2j and 2j+1 (`repeat` instead of `repeat_interleave` would not), the
    written-out formula's answer."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = causal_mask(6, 6) if masked else None
    grouped = fused_attention(q, k, v, mask, is_causal=not masked)
    k4, v4 = repeat_heads(k, 4), repeat_heads(v, 4)
    assert k4.shape == (2, 4, 6, 8) and torch.equal(k4[:, 1], k[:, 0]) and torch.equal(k4[:, 2], k[:, 1])
    repeated = fused_attention(q, k4, v4, mask, is_causal=not masked)
    torch.testing.assert_close(repeated, grouped)
    reference, _ = attention(q, k4, v4, causal=True)
    torch.testing.assert_close(repeated, reference, atol=1e-5, rtol=1e-5)
