"""Attention: the seed tutorials' worked examples (their numbers copied here), masks, and fast vs reference paths."""

import numpy as np
import pytest
import torch

from minitf.attention import attention, causal_mask
from minitf.config import ModelConfig
from minitf.model import CausalSelfAttention
from tests.support.models import gqa_model as model


def test_example1_i_love_ai_unscaled():
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # I, love, AI
    W_Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    W_K = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    W_V = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    torch.testing.assert_close(Q @ K.T, torch.tensor([[1.0, 0, 1], [1, 1, 2], [2, 1, 3]]))
    out, w = attention(Q, K, V, scale=1.0)
    exact_w = torch.tensor([[0.4223, 0.1554, 0.4223], [0.2119, 0.2119, 0.5761], [0.2447, 0.0900, 0.6652]])
    exact_out = torch.tensor([[2.0000, 2.2670], [2.3642, 2.3642], [2.4205, 2.5752]])
    torch.testing.assert_close(w, exact_w, atol=1e-3, rtol=0)
    torch.testing.assert_close(out, exact_out, atol=1e-3, rtol=0)
    tutorial_out = torch.tensor([[2.000, 2.265], [2.364, 2.364], [2.420, 2.575]])
    torch.testing.assert_close(out, tutorial_out, atol=5e-3, rtol=0)
    # position-wise FFN: relu(out W1 + b1) W2 + b2 with W2 = identity
    W1 = torch.tensor([[1.0, -1.0], [1.0, 1.0]])
    ffn = torch.relu(out @ W1) @ torch.eye(2)
    torch.testing.assert_close(
        ffn, torch.tensor([[4.2670, 0.2670], [4.7284, 0.0], [4.9957, 0.1547]]), atol=1e-3, rtol=0
    )
    torch.testing.assert_close(ffn, torch.tensor([[4.265, 0.265], [4.728, 0.0], [5.000, 0.155]]), atol=5e-3, rtol=0)


def test_example2_identity_scaled_and_causal():
    X = np.eye(2)  # numpy input is accepted
    V = X @ np.array([[1.0, 2.0], [3.0, 4.0]])
    out, w = attention(X, X, V)  # scale None = 1/sqrt(2)
    assert out.dtype == torch.float64  # numpy float64 keeps its precision
    out, w = out.float(), w.float()
    torch.testing.assert_close(w, torch.tensor([[0.6698, 0.3302], [0.3302, 0.6698]]), atol=1e-3, rtol=0)
    torch.testing.assert_close(out, torch.tensor([[1.6605, 2.6605], [2.3395, 3.3395]]), atol=1e-3, rtol=0)
    torch.testing.assert_close(out, torch.tensor([[1.6602, 2.6602], [2.3398, 3.3398]]), atol=5e-3, rtol=0)
    out_c, w_c = (t.float() for t in attention(X, X, V, causal=True))
    torch.testing.assert_close(w_c[0], torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(out_c[0], torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(out_c[1], out[1])  # the last row sees everything either way


def test_batched_heads_rows_sum_to_one_and_match_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    for causal in (False, True):
        out, w = attention(q, k, v, causal=causal)
        assert out.shape == (2, 3, 5, 4) and w.shape == (2, 3, 5, 5)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    _, w = attention(q, k, v, causal=True)
    assert torch.all(w.triu(diagonal=1) == 0)  # no weight on the future


def test_boolean_and_additive_masks_agree():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 3, generator=g) for _ in range(3))
    keep = torch.tensor([[1, 0, 1, 1]] * 4, dtype=torch.bool)
    additive = torch.zeros(4, 4).masked_fill(~keep, float("-inf"))
    out_b, w_b = attention(q, k, v, mask=keep)
    out_a, w_a = attention(q, k, v, mask=additive)
    torch.testing.assert_close(out_b, out_a)
    assert torch.all(w_b[:, 1] == 0)


def test_fully_masked_row_is_zero_not_nan():
    q = torch.randn(3, 2, requires_grad=True)
    k, v = torch.randn(3, 2), torch.randn(3, 2)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    out, w = attention(q, k, v, mask=mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert torch.all(w[1] == 0) and torch.all(out[1] == 0)
    torch.testing.assert_close(w[[0, 2]].sum(-1), torch.ones(2))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_causal_mask_with_offset():
    # 2 new queries after 3 cached keys: positions 3 and 4
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_module_sdpa_and_reference_agree_outputs_and_grads(positions):
    cfg = ModelConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32, positions=positions)
    torch.manual_seed(0)
    fast = CausalSelfAttention(cfg)
    ref = CausalSelfAttention(ModelConfig(**{**cfg.__dict__, "attention": "reference"}))
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 10, 32)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = fast(x1), ref(x2)
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=1e-5)
    y1.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    for p1, p2 in zip(fast.parameters(), ref.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, atol=1e-5, rtol=1e-5)
    steps = fast.steps(x)  # what inspection shows: the written-out steps give the fused path's output
    torch.testing.assert_close(steps["out"], y1.detach(), atol=1e-5, rtol=1e-5)
    assert steps["weights"].shape == (2, 4, 10, 10)


# Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
# values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged.


@pytest.mark.parametrize("attn", ["sdpa", "reference"])
def test_grouped_attention_is_reference_attention_with_repeated_kv_heads(attn):
    m = model(n_kv_head=2, attention=attn)
    layer = m.blocks[0].attn
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        c = layer.c_attn(x)  # (B, T, (4 + 2 + 2) * 8)
        q = c[..., :32].view(2, 10, 4, 8).transpose(1, 2)  # (B, 4, T, 8)
        k = c[..., 32:48].view(2, 10, 2, 8).transpose(1, 2)  # (B, 2, T, 8)
        v = c[..., 48:].view(2, 10, 2, 8).transpose(1, 2)
        q, k = m.rope(q), m.rope(k)
        # query heads 0, 1 read key/value head 0; heads 2, 3 read head 1
        k4, v4 = k[:, [0, 0, 1, 1]], v[:, [0, 0, 1, 1]]
        y, _ = attention(q, k4, v4, causal=True)  # (B, 4, T, 8)
        expected = layer.c_proj(y.transpose(1, 2).reshape(2, 10, 32))
        torch.testing.assert_close(layer(x, rope=m.rope), expected, atol=1e-5, rtol=1e-5)
    assert layer.c_attn.weight.shape == (64, 32)  # q: 4 heads, k and v: 2 heads each, of 8
