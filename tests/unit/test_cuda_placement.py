"""The CUDA path's device placement, checked without a GPU: the model on the `meta` device stands
for a GPU, and every tensor an operation makes is recorded with its device. A mask, a position
table, the KV cache or a step counter made on the CPU (a `torch.arange(T)` without device=) would
show up as a CPU tensor here, as it would be a host tensor, a copy or an error on a GPU."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minitf.config import ModelConfig
from minitf.decoding import decode_step
from minitf.kv_cache import KVCache
from minitf.model import Transformer


class Devices(TorchDispatchMode):
    """Records (operation, device) of every tensor each operation returns while it is active."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [(str(func), t.device.type) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return out

    def off_device(self, device: str) -> set:
        return {made for made in self.made if made[1] != device}


def meta_model(**kw) -> Transformer:
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, **kw)
    with torch.device("meta"):
        return Transformer(cfg)


def ids(B: int, T: int) -> torch.Tensor:
    return torch.zeros(B, T, dtype=torch.long, device="meta")  # (B, T)


def test_the_recorder_catches_a_tensor_made_on_the_cpu():
    with Devices() as d:
        torch.zeros(2, device="meta") + 1
        torch.arange(3)  # no device=: the CPU
    assert d.off_device("meta") == {("aten.arange.default", "cpu")}


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
@pytest.mark.parametrize(
    "arch",
    [{"positions": "learned"}, {"positions": "sinusoidal"}, {"positions": "rope", "n_kv_head": 1, "qk_norm": True}],
    ids=["learned", "sinusoidal", "rope-gqa-qknorm"],
)
def test_a_cached_decode_makes_every_tensor_on_the_model_device(static, arch):
    model = meta_model(**arch).eval()
    with Devices() as d, torch.no_grad():
        cache = KVCache(model, 2, static=static)
        model(ids(2, 3), cache=cache)  # the prompt
        for _ in range(2):
            logits = decode_step(model, ids(2, 1), cache)  # (B, V)
    assert logits.shape == (2, 32) and logits.device.type == "meta"
    assert all(k.device.type == "meta" for k in cache.k + cache.v)
    assert len(d.made) > 100 and not d.off_device("meta")


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_a_training_step_makes_every_tensor_on_the_model_device(positions):
    model = meta_model(positions=positions).train()
    with Devices() as d:
        _, loss = model(ids(2, 8), ids(2, 8))
        loss.backward()
    assert loss.device.type == "meta" and all(p.grad.device.type == "meta" for p in model.parameters())
    assert len(d.made) > 100 and not d.off_device("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("static", [False, True], ids=["dynamic-cache", "static-cache"])
def test_a_cached_decode_on_cuda_gives_the_cpu_logits(static):
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, positions="rope")
    model = Transformer(cfg).eval()
    prompt, steps = torch.randint(0, 64, (2, 5)), torch.randint(0, 64, (2, 6))  # (B, T) each
    out = {}
    with torch.no_grad():
        for device in ("cpu", "cuda"):
            model.to(device)
            cache = KVCache(model, 2, static=static)
            rows = [model(prompt.to(device), cache=cache)[0][:, -1]]  # (B, V)
            rows += [decode_step(model, steps[:, i : i + 1].to(device), cache) for i in range(steps.size(1))]
            out[device] = torch.stack(rows).cpu()  # (steps + 1, B, V)
    torch.testing.assert_close(out["cuda"], out["cpu"], atol=1e-4, rtol=1e-4)
