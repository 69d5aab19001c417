"""The CUDA path's device placement, checked without a GPU: the model on the `meta` device stands
for a GPU, and every tensor an operation makes is recorded with its device. A mask, a position
table, the KV cache or a step counter made on the CPU (a `torch.arange(T)` without device=) would
show up as a CPU tensor here, as it would be a host tensor, a copy or an error on a GPU."""

import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minitf.config import DataConfig, ModelConfig, SampleConfig, TrainConfig
from minitf.corpus.prepare import prepare_data
from minitf.fast.decoding import decode_step
from minitf.generate import generate_tokens
from minitf.kv_cache import KVCache
from minitf.model import Transformer
from minitf.optim import make_optimizer
from tests.support.corpus import Log, write_docs


class Devices(TorchDispatchMode):
    """Records (operation, device) of every tensor each operation returns while it is active, and
    of every tensor it is given (an in-place update, such as a fused optimizer's, returns none)."""

    def __init__(self):
        super().__init__()
        self.made, self.given = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [(str(func), t.device.type) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.given += [
            (str(func), t.device.type) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        ]
        return out

    def off_device(self, device: str) -> set:
        return {made for made in self.made + self.given if made[1] != device}


def tensors(tree) -> list:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


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
    [
        {"positions": "learned"},
        {"positions": "sinusoidal"},
        {"positions": "rope", "n_kv_head": 1, "qk_norm": True},
        {"positions": "rope", "n_kv_head": 1, "attention": "reference"},
    ],
    ids=["learned", "sinusoidal", "rope-gqa-qknorm", "rope-gqa-reference"],
)
def test_a_cached_decode_makes_every_tensor_on_the_model_device(static, arch):
    """The prompt, two tokens, then two at once into the filled cache: the one place a dynamic
    cache builds a mask (causal_mask of the new queries against every cached key)."""
    model = meta_model(**arch).eval()
    with Devices() as d, torch.no_grad():
        cache = KVCache(model, 2, static=static)
        model(ids(2, 3), cache=cache)  # the prompt
        for _ in range(2):
            logits = decode_step(model, ids(2, 1), cache)  # (B, V)
        model(ids(2, 2), cache=cache)
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


class Generators:
    """torch.Generator, recording the device each is made for (a meta device has no generator of
    its own: the recorded ones stand in, and the draw takes the default stream)."""

    def __init__(self, monkeypatch):
        self.devices = []
        monkeypatch.setattr(torch, "Generator", self)

    def __call__(self, device="cpu"):
        self.devices.append(torch.device(device).type)
        return self

    def manual_seed(self, seed):
        return None


def test_sampling_draws_on_the_model_device_with_a_generator_made_there(monkeypatch):
    """Generation end to end (the prompt, the cache, the penalty's history, top-k and top-p, the
    draw): every tensor on the model's device, and the seeded generator made for that device (a
    CPU generator cannot draw on a GPU's tensors)."""
    model = meta_model(positions="rope").eval()
    generators = Generators(monkeypatch)
    settings = SampleConfig(max_new_tokens=4, temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.3, seed=1)
    with Devices() as d:
        drawn = list(generate_tokens(model, [1, 2, 3], settings, num_samples=2))
    assert len(drawn) == 4 and all(t.shape == (2,) and t.device.type == "meta" for t in drawn)
    assert generators.devices == ["meta"]
    assert len(d.made) > 100 and not d.off_device("meta")


def test_a_batch_for_a_gpu_is_pinned_then_copied_there_without_waiting(tmp_path, monkeypatch):
    """The training batch goes to the GPU from pinned host memory with non_blocking=True, so the
    copy overlaps the step. (A CPU build can neither pin nor copy to `cuda`: both are stand-ins
    that record what they are asked, and the copy hands back the pinned batch.)"""
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    write_docs(tmp_path / "c", 10)
    data = prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300), log=Log())
    pinned, copies = [], []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned.append(t) or t)
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *args, **kw: copies.append((t, args, kw)) or t)
    x, y = data.get_batch("train", 4, 16, torch.Generator().manual_seed(3), device="cuda")
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert len(copies) == len(pinned) == 2  # each of x and y copied from its own pinned pages
    assert all(c is p is t for (c, _, _), p, t in zip(copies, pinned, (x, y)))
    assert [(args, kw) for _, args, kw in copies] == [((torch.device("cuda"),), {"non_blocking": True})] * 2


RESUMED = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32, tie_embeddings=False)


def cpu_optimizer_state(name: str) -> dict:
    """train.optimizer=NAME's state after one step of a CPU run, as a resume reads it back
    (torch.save, then training/checkpoint.py's torch.load with map_location="cpu")."""
    torch.manual_seed(0)
    cpu = Transformer(ModelConfig(**RESUMED))
    opt = make_optimizer(cpu, TrainConfig(optimizer=name), torch.device("cpu"))
    _, loss = cpu(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8)))
    loss.backward()
    opt.step()
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)
    saved.seek(0)
    return torch.load(saved, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_optimizer_state_resumed_on_a_gpu_lives_there_and_steps_there(name):
    """Resumed on a GPU (its parameters FakeTensors on `cuda`, each with a gradient): moments,
    momentum and step counters (the fused AdamW's too) on the GPU, and the next step makes no
    tensor elsewhere."""
    state = cpu_optimizer_state(name)
    with torch.device("meta"):
        model = Transformer(ModelConfig(**RESUMED))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        gpu = make_optimizer(model, TrainConfig(optimizer=name), torch.device("cuda"))
        gpu.load_state_dict(state)
        with Devices() as d:
            gpu.step()
    opts = gpu.named.values() if name == "muon" else [gpu]
    moved = [(k, t) for o in opts for s in o.state.values() for k, t in s.items() if isinstance(t, torch.Tensor)]
    keys = {"exp_avg", "exp_avg_sq", "step"} | ({"momentum_buffer"} if name == "muon" else set())
    assert {k for k, _ in moved} == keys
    assert {t.device.type for _, t in moved} == {"cuda"}
    assert len(d.given) > 10 and not d.off_device("cuda")


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
