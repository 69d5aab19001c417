"""What torch.compile makes of minitf's two compiled paths, read from dynamo's own counters: the
training step's compiled regions and compiled decoding trace without a graph break, and compile
once (no recompilation after the first step, nor when decoding slides its window past block_size).
A break or a recompile costs little on a CPU but a GPU's speed. And what compiles for real, which
the unit tier never does: compiled generation gives the eager tokens, and the fused attention's
GPU check is a constant to torch.compile."""

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from minitf.config import ModelConfig, SampleConfig
from minitf.fast.fused_attention import constant_while_compiling, flash_gpu
from minitf.generate import generate_tokens
from minitf.model import Transformer
from tests.support.models import spread_model


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, **kw))


def graphs() -> int:
    """Graphs dynamo has made so far: a recompilation (a guard that failed) adds to it."""
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_the_compiled_training_step_has_no_graph_break_and_compiles_once():
    torch._dynamo.reset()
    counters.clear()
    model = tiny(positions="rope").train()
    model.compile_regions()
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))  # (B, T) each
    for step in range(3):
        _, loss = model(x, y)
        loss.backward()
        if step == 0:
            first = graphs()
    assert first > 0 and graphs() == first
    assert not counters["graph_break"]


@pytest.mark.slow
def test_compiled_decoding_has_no_graph_break_and_no_recompile_across_a_window_slide():
    torch._dynamo.reset()
    counters.clear()
    model = tiny(positions="learned")
    settings = SampleConfig(max_new_tokens=4, temperature=1.0, top_k=10, seed=0)
    list(generate_tokens(model, [1, 2], settings, compile=True))  # compiles the step
    first = graphs()
    settings = SampleConfig(max_new_tokens=40, temperature=1.0, top_k=10, seed=1)  # past block_size 16
    assert len(list(generate_tokens(model, [1, 2], settings, compile=True))) == 40
    assert first > 0 and graphs() == first
    assert not counters["graph_break"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_decoding_on_cuda_replays_cuda_graphs_with_the_eager_tokens_and_logits():
    """On a GPU the compiled step replays one CUDA graph per token (no graph skipped), reading the
    static cache in place: only the token ids are copied in. Its logits, kept across steps (as
    with_logits hands them on), are each step's own, the eager ones, past a window slide too."""
    torch._dynamo.reset()
    counters.clear()
    model = tiny(positions="rope", n_kv_head=1).cuda().eval()
    settings = SampleConfig(max_new_tokens=40, top_k=1, seed=0)  # greedy, past block_size 16
    eager = list(generate_tokens(model, [1, 2], settings, with_logits=True))
    for _ in range(2):  # a second generation: a new cache, recorded again, the same tokens
        graphs = list(generate_tokens(model, [1, 2], settings, compile=True, with_logits=True))
        assert [int(t) for t, _ in graphs] == [int(t) for t, _ in eager]
        kept, expected = torch.stack([g for _, g in graphs]), torch.stack([e for _, e in eager])  # (steps, 1, V)
        torch.testing.assert_close(kept, expected, atol=1e-4, rtol=1e-4)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert not counters["graph_break"]
    # one recording per cache (the allocator may hand the second the first one's addresses), one
    # input copied into each: the token ids. An unmarked cache would add its 5 tensors to each
    recorded = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
    assert 1 <= recorded <= 2, f"{recorded} inputs copied into the CUDA graphs: is the cache a static address?"


# from the unit tier, which compiles nothing: compiled generation gives the eager tokens, and the
# fused attention's GPU check is read while compiling, not a graph break


def test_compiled_generation_gives_the_eager_tokens():
    m = spread_model(positions="rope")
    # seeded samples in a batch, past block_size 16 (the window jumps and the cache is refilled);
    # one compilation, a few seconds
    settings, kw = SampleConfig(temperature=1.0, top_k=20, seed=3, max_new_tokens=24), dict(num_samples=2)
    a = torch.stack(list(generate_tokens(m, [1, 2, 3], settings, compile=True, **kw)), 1)
    b = torch.stack(list(generate_tokens(m, [1, 2, 3], settings, use_cache=False, **kw)), 1)
    assert torch.equal(a, b)


def test_compiled_generation_follows_weights_changed_since_it_compiled():
    """On a CPU the compiled step holds the weights it froze (bfloat16 matrices repacked for
    oneDNN: copies): a step of training, or another state loaded into the same model, must not
    leave it decoding the old ones. After each change the model decodes what a model compiled
    afresh with those weights decodes."""
    m = spread_model(positions="rope").to(torch.bfloat16)
    settings = SampleConfig(temperature=1.0, top_k=20, seed=3, max_new_tokens=8)

    def tokens(model):
        return list(generate_tokens(model, [1, 2, 3], settings, compile=True))

    first = tokens(m)
    with torch.no_grad():
        m.lm_head.weight.mul_(-1)  # in place, as an optimizer step is
    flipped = tokens(m)
    assert flipped == tokens(copy.deepcopy(m)) != first
    other = spread_model(positions="rope")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    m.load_state_dict(other.state_dict())
    assert tokens(m) == tokens(copy.deepcopy(m)) != flipped


def test_the_gpu_check_is_a_constant_to_torch_compile(monkeypatch):
    """flash_gpu inside a compiled block (the training step's) is read while compiling: no graph
    break, and the branch it chose is in the graph. What compiles marks it first (compile_regions,
    compile_decode), as this does."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    constant_while_compiling()

    def step(x):
        return x + 1 if flash_gpu(torch.device("cuda", 0)) else x - 1

    torch._dynamo.reset()
    out = torch.compile(step, fullgraph=True, backend="eager")(torch.zeros(3))  # fullgraph: a break raises
    assert out.tolist() == [1.0, 1.0, 1.0]
