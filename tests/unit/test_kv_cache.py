"""Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged."""

import pytest
import torch

from minitf.config import ModelConfig
from minitf.kv_cache import KVCache
from tests.support.models import GQA_IDS as IDS
from tests.support.models import gqa_model as model


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


class OnAGPU(torch.nn.Module):
    """What a KVCache reads of a model on a GPU (its config, its first parameter's dtype and
    device), the parameter a FakeTensor on `cuda`: a GPU's shapes and devices without one."""

    def __init__(self, **kw):
        super().__init__()
        self.config = ModelConfig(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=32, n_kv_head=2, **kw)
        self.w = torch.nn.Parameter(torch.empty(1, device="cuda"))


def static_kind(t: torch.Tensor):
    from torch._dynamo.utils import get_static_address_type

    return get_static_address_type(t)


def test_a_static_cache_on_a_gpu_marks_every_tensor_a_static_address():
    """CUDA graphs capture the cache where it is only if torch.compile knows its tensors stay put
    (unmarked, each replay would copy every layer's cache in and out, or skip the graph)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        gpu = OnAGPU()
        cache = KVCache(gpu, static=True)
        branched = cache.repeat(3)  # new tensors: marked too
        dynamic = KVCache(gpu)
    for c in (cache, branched):
        tensors = [*c.k, *c.v, c.pos]
        assert len(tensors) == 5 and all(t.device.type == "cuda" for t in tensors)
        assert {static_kind(t) for t in tensors} == {"unguarded"}  # no recompilation for a new cache
    assert {static_kind(t) for t in dynamic.k + dynamic.v} == {None}


def test_a_cache_on_the_cpu_is_not_marked():
    cache = KVCache(model(n_kv_head=2), static=True)
    assert {static_kind(t) for t in [*cache.k, *cache.v, cache.pos, *cache.repeat(2).k]} == {None}
