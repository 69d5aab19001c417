"""Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged."""

import pytest
import torch

from minitf.kv_cache import KVCache
from tests.helpers import GQA_IDS as IDS
from tests.helpers import gqa_model as model


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
