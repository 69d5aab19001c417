"""minitf.interpret.memory: each tool's passes hold what its budget says (measured: the peak of
torch's CPU allocations, from the profiler's allocation events), and one sequence over the
budget is refused naming it."""

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import minitf
from minitf.interpret import (
    ablate,
    attribute,
    head_scores,
    in_context_score,
    mean_head_outputs,
    memory,
    patch_heads,
    patch_residual,
    patching,
)


def peak_bytes(fn) -> int:
    """The most bytes torch held on the CPU at once while fn() ran, counted from zero at its start."""
    event_type = pytest.importorskip("torch._C._profiler")._EventType
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    tree = getattr(prof.profiler.kineto_results, "experimental_event_tree", None)
    if tree is None:
        pytest.skip(f"torch {torch.__version__}'s profiler has no event tree to read allocations from")
    sizes, nodes = [], list(tree())
    while nodes:
        node = nodes.pop()
        if node.tag == event_type.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))  # a free is a negative size
        nodes.extend(node.children)
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return peak


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=256, block_size=256, n_layer=2, n_head=4, n_embd=64, positions="rope")
    return minitf.Transformer(cfg).eval()


T = 96
IDS = torch.randint(1, 256, (8, T), generator=torch.Generator().manual_seed(0))  # (8, T)
CLEAN, CORRUPTED = IDS[0, :32], IDS[1, :32]  # patching runs a copy per position and layer: shorter prompts
BUDGET = 3 * 2**20  # a few sequences (or a few dozen patched copies) a pass: every tool runs several passes

# tool -> (call with a budget, what one sequence (or copy) is counted at, sequences the call runs)
TOOLS = {
    "head_scores": (lambda m, b: head_scores(m, IDS, budget=b), lambda m: memory.pass_bytes(m, T) + 15 * T * T, 8),
    "ablate": (lambda m, b: ablate(m, IDS, [(0, 1)], budget=b), lambda m: memory.pass_bytes(m, T, ("heads",)), 8),
    "mean_head_outputs": (
        lambda m, b: mean_head_outputs(m, IDS, budget=b),
        lambda m: memory.pass_bytes(m, T, ("heads",)),
        8,
    ),
    "in_context_score": (
        lambda m, b: in_context_score(m, IDS, budget=b // 8),
        lambda m: memory.forward_bytes(m, T),
        8,
    ),
    "attribute": (
        lambda m, b: attribute(m, IDS[0], 5, budget=b),
        lambda m: memory.pass_bytes(m, T, ("heads", "ffn_out")),
        1,
    ),
    "patch_residual": (
        lambda m, b: patch_residual(m, CLEAN, CORRUPTED, 5, 6, budget=b),
        lambda m: patching.copy_bytes(m, 32, ()),
        3 * 32,
    ),
    "patch_heads": (
        lambda m, b: patch_heads(m, CLEAN, CORRUPTED, 5, 6, by_position=True, budget=b),
        lambda m: patching.copy_bytes(m, 32, ("heads",)),
        2 * 4 * 32,
    ),
}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_holds_what_its_budget_counts(model, tool):
    call, per_sequence, n = TOOLS[tool]
    budget = BUDGET // 8 if tool == "in_context_score" else BUDGET  # the fused forward holds no T x T step
    fit = min(n, budget // per_sequence(model))  # sequences in the widest pass
    assert fit >= 1 and (n == 1 or fit < n)  # the call runs in several passes, or is one sequence
    peak = peak_bytes(lambda: call(model, BUDGET))
    assert peak <= 1.5 * budget, f"{tool} held {peak / 2**20:.1f} MiB on a budget of {budget / 2**20:.1f} MiB"
    counted = fit * per_sequence(model)
    assert counted <= 1.5 * peak, f"{tool} counts {counted / 2**20:.1f} MiB a pass and held {peak / 2**20:.1f} MiB"


def test_one_sequence_over_the_budget_is_refused_naming_the_budget(model):
    need = memory.pass_bytes(model, T) + 15 * T * T
    with pytest.raises(minitf.ConfigError) as e:
        head_scores(model, IDS, budget=2**20)
    assert str(e.value) == (
        f"budget is 1.0 MiB, and head_scores on one sequence of {T} tokens holds about {need / 2**20:.1f} MiB at "
        f"once; pass shorter ids, or budget={need} (bytes) or more"
    )
    once = head_scores(model, IDS[:2], budget=need)  # exactly one sequence a pass: the same scores
    both = head_scores(model, IDS[:2])
    assert all(torch.allclose(once[k], both[k], atol=1e-6) for k in both)
    with pytest.raises(minitf.ConfigError, match=r"^budget is 1.0 MiB, and patch_heads on one sequence of 96 tokens"):
        patch_heads(model, IDS[0], IDS[1], 5, 6, by_position=True, budget=2**20)
    with pytest.raises(minitf.ConfigError, match=r"^budget is 1.0 MiB, and attribute on one sequence of 96 tokens"):
        attribute(model, IDS[0], 5, budget=2**20)


def test_the_refusal_docs_interpret_md_shows_is_the_one_a_user_meets():
    cfg = minitf.ModelConfig(vocab_size=512, block_size=4096, n_layer=2, n_head=4, n_embd=64)
    docs = (Path(__file__).parents[3] / "docs" / "interpret.md").read_text(encoding="utf-8")
    with pytest.raises(minitf.ConfigError) as e:
        head_scores(minitf.Transformer(cfg), torch.ones(1, 4096, dtype=torch.long))
    assert str(
        e.value
    ) == "budget is 1.00 GiB, and head_scores on one sequence of 4096 tokens holds about 1.50 GiB at " + (
        "once; pass shorter ids, or budget=1613758464 (bytes) or more"
    )
    assert f"`{e.value}`" in " ".join(docs.split())  # the page wraps it over lines
