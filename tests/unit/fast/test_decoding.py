"""The compiled decode step's settings, read off torch.compile's arguments without compiling: on a
CPU with the weights frozen in (and their version kept, to compile again when they change), on a
GPU with CUDA graphs (torch.compile's "reduce-overhead"), whose logits the caller may keep.
tests/integration/test_compiled_graphs.py compiles for real."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from minitf.config import ModelConfig
from minitf.fast import decoding
from minitf.model import Transformer

CPU_OPTIONS = {"size_asserts": False, "alignment_asserts": False}


class OnAGPU(torch.nn.Module):
    """A model as compile_decode sees it on a GPU: its first parameter a FakeTensor on `cuda`."""

    def __init__(self):
        super().__init__()
        with FakeTensorMode(allow_non_fake_inputs=True):
            self.w = torch.nn.Parameter(torch.empty(1, device="cuda"))


class Compiles:
    """torch.compile, recording its arguments and returning `step` instead of compiling."""

    def __init__(self, monkeypatch, step=None):
        self.calls, self.step = [], step or (lambda model, idx, cache: None)
        monkeypatch.setattr(torch, "compile", self)

    def __call__(self, fn, **kw):
        assert fn is not decoding.decode_step and fn.__code__ == decoding.decode_step.__code__  # its own copy
        self.calls.append((decoding.decode_step, kw))
        return self.step


def cpu_model() -> Transformer:
    return Transformer(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))


def test_a_cpu_model_compiles_decoding_with_its_weights_frozen(monkeypatch):
    import torch._inductor.config as inductor_config

    seen = []  # inductor's freezing switch while the step runs (and compiles, on its first call)
    compiles = Compiles(monkeypatch, step=lambda model, idx, cache: seen.append(inductor_config.freezing))
    model = cpu_model()
    step, graphs, weights = decoding.compile_decode(model)
    assert compiles.calls == [(decoding.decode_step, {"dynamic": False, "options": CPU_OPTIONS})]
    assert graphs is False and step is compiles.step
    assert weights == decoding.weights_version(model)
    with torch.no_grad():
        model.lm_head.weight.add_(1)
    assert weights != decoding.weights_version(model)  # an in-place change is seen
    decoding.compiled_decode_step(model, torch.zeros(1, 1, dtype=torch.long), None, checked=True)
    assert len(compiles.calls) == 1  # within a generation: not checked again
    decoding.compiled_decode_step(model, torch.zeros(1, 1, dtype=torch.long), None, checked=False)
    assert len(compiles.calls) == 2  # a new generation compiles the changed weights in
    assert seen == [True, True] and inductor_config.freezing is False  # on for the step only


def test_a_gpu_model_compiles_decoding_with_cuda_graphs(monkeypatch):
    """mode="reduce-overhead" is torch.compile's name for these options (it takes one or the other)."""
    compiles = Compiles(monkeypatch)
    _, graphs, _ = decoding.compile_decode(OnAGPU())
    reduce_overhead = torch._inductor.list_mode_options("reduce-overhead")
    assert reduce_overhead == {"triton.cudagraphs": True}
    assert compiles.calls == [(decoding.decode_step, {"dynamic": False, "options": CPU_OPTIONS | reduce_overhead})]
    assert graphs is True


def test_a_benchmark_can_compile_a_gpu_model_without_cuda_graphs(monkeypatch):
    compiles = Compiles(monkeypatch)
    model = OnAGPU()
    assert decoding.compile_decode(model, cuda_graphs=False)[1] is False
    assert compiles.calls[-1][1]["options"] == CPU_OPTIONS
    assert decoding._compiled_steps[model][1] is False  # what compiled_decode_step will take


@pytest.mark.parametrize("graphs", [False, True], ids=["cpu", "cuda-graphs"])
def test_the_logits_of_a_cuda_graph_are_the_callers_copy(monkeypatch, graphs):
    """A CUDA graph's output is overwritten by the next replay: the caller gets a copy of it (and
    on a CPU, with no graph, the step's own tensor, as before)."""
    out = torch.arange(6.0).view(2, 3)  # (B, V): what the graph's pool holds
    Compiles(monkeypatch, step=lambda model, idx, cache: out)
    model = cpu_model()
    decoding.compile_decode(model, cuda_graphs=graphs)
    logits = decoding.compiled_decode_step(model, torch.zeros(2, 1, dtype=torch.long), None, checked=False)
    assert torch.equal(logits, out)
    assert (logits.data_ptr() != out.data_ptr()) is graphs
