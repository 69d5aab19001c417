"""Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged."""

import pytest
import torch

import minitf
from minitf.attention import attention
from minitf.kv_cache import KVCache


def model(seed=0, **kw) -> minitf.Transformer:
    torch.manual_seed(seed)
    base = dict(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=32, positions="rope")
    m = minitf.Transformer(minitf.ModelConfig(**{**base, **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # off the initial values: zero biases and head hide mistakes
    return m.eval()


IDS = torch.tensor([[5, 17, 42, 9, 3, 77, 12, 8, 61, 2]])


@pytest.mark.parametrize("attn", ["sdpa", "reference"])
@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("static", [False, True])
def test_cache_gives_the_logits_of_the_whole_sequence(attn, kv, static):
    m = model(n_kv_head=kv, attention=attn, qk_norm=True, tie_embeddings=False)
    with torch.no_grad():
        full = m(IDS)[0][0]  # (T, V)
        cache = KVCache(m, static=static)
        steps = [m(IDS[:, :4], cache=cache)[0][0]]  # a prefill of 4, then one token at a time
        steps += [m(IDS[:, t : t + 1], cache=cache)[0][0] for t in range(4, IDS.size(1))]
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=1e-5)
    assert full.std() > 0.1


def test_the_cache_stores_n_kv_head_heads():
    full, grouped = KVCache(model()), KVCache(model(n_kv_head=1), batch_size=3)
    assert full.k[0].shape == (1, 4, 32, 8)
    assert grouped.k[0].shape == grouped.v[1].shape == (3, 1, 32, 8)
    assert len(grouped.k) == 2 and grouped.repeat(2).k[0].shape == (6, 1, 32, 8)


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


def test_n_kv_head_equal_to_n_head_is_the_model_as_before():
    a, b = model(), model(n_kv_head=4)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    assert a.blocks[0].attn.c_attn.weight.shape == (96, 32)
    with torch.no_grad():
        assert torch.equal(a(IDS)[0], b(IDS)[0])


def test_inspect_gives_each_query_head_its_groups_keys_and_values():
    tok = minitf.Tokenizer.train(["the cat sat on the mat " * 20], vocab_size=300)
    m = model(vocab_size=tok.vocab_size, n_kv_head=2)
    ins = minitf.inspect(m, tok, "the cat sat")
    s = ins.layers[0]
    assert ins.n_head == 4 and s.k.shape == s.v.shape == s.q.shape
    assert torch.equal(s.k[0], s.k[1]) and torch.equal(s.v[2], s.v[3]) and not torch.equal(s.k[1], s.k[2])
    with torch.no_grad():
        torch.testing.assert_close(ins.logits, m(torch.tensor([tok.encode("the cat sat")]))[0][0], atol=1e-5, rtol=0)
