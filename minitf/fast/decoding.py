"""One decoding step of generation: a new token through the model and its KV cache, eager or
under torch.compile.

Compiled, the step runs on a static KVCache (every shape fixed, so one graph serves every
position) and is compiled once per model and batch size; generate.py chooses which step to take.
On a GPU the compiled step replays CUDA graphs (torch.compile's "reduce-overhead"): batch-1
decoding is launch-bound there, a few dozen small kernels per token. On a CPU it is compiled with
the weights frozen into it as constants (inductor's "freezing"), which lets oneDNN lay each matrix
out for its matrix-vector products once, not at every token: SmolLM2-135M's shape decodes 1.2-1.35
times as fast in bfloat16, for a second copy of the weights. Since the compiled step then holds its
own copy, it is compiled again when the model's weights have changed since (a step of training,
load_state_dict: the weights' version counters tell).
"""

from __future__ import annotations

import contextlib
import types
import weakref

import torch

from ..kv_cache import KVCache
from .fused_attention import constant_while_compiling


def decode_step(model: torch.nn.Module, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """idx (B, 1), the token sampled last -> the logits (B, V) of the position after it."""
    return model(idx, cache=cache)[0][:, -1]  # (B, V): the logits of the one new position


# one compiled decode step per model, dropped with the model, and whether it replays CUDA graphs;
# made on first use, since importing the compiler takes seconds
_compiled_steps: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()


def compiled_decode_step(model: torch.nn.Module, idx: torch.Tensor, cache: KVCache, checked: bool) -> torch.Tensor:
    """`decode_step` under torch.compile, compiled once per model and batch size: a static
    KVCache keeps every shape fixed. checked: a step of this generation has already run with
    torch.compile's guards checked; the next ones see the same model and cache, so checking
    again on every token (a real cost next to a small model's step on a CPU) is skipped."""
    step, graphs, weights = _compiled_steps.get(model) or compile_decode(model)
    if not checked and weights is not None and weights != weights_version(model):  # frozen weights went stale
        step, graphs, weights = compile_decode(model)
    with torch.compiler.set_stance(skip_guard_eval_unsafe=checked), _freezing(weights is not None):
        logits = step(model, idx, cache)  # (B, V)
    # a CUDA graph's output lives in its memory pool, which the next token's replay overwrites:
    # the caller gets a copy it may keep (stream_tokens and with_logits hand the logits on)
    return logits.clone() if graphs else logits


def _own_copy(fn):
    """fn as a function with a code object of its own: torch.compile keeps its graphs per code
    object, so compiling again for changed weights must not find the graph that froze the old."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def _freezing(on: bool):
    """Inductor's freezing switch, on for this call only: torch.compile compiles at the first call,
    and reads the switch then, not from its options (a library call leaves the process's own as
    it was)."""
    if not on:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config  # loaded by compile_decode already

    return inductor_config.patch(freezing=True)


def weights_version(model: torch.nn.Module) -> tuple:
    """What changes when any weight of model does: each tensor's storage and in-place version."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def compile_decode(model: torch.nn.Module, cuda_graphs: bool | None = None) -> tuple:
    """Compile `decode_step` for `model`, replacing any compiled before: (the step, whether it
    replays CUDA graphs, the weights_version it froze, or None). compiled_decode_step calls this on
    first use; a benchmark calls it to choose. cuda_graphs: each token's kernels recorded once and
    replayed as one CUDA graph (what torch.compile's mode="reduce-overhead" does), so a small
    model's step is not a dozen kernel launches from Python per layer; None means on a GPU, and
    never on a CPU, which has no graphs."""
    import torch._inductor.config as inductor_config

    device = next(model.parameters()).device.type
    if cuda_graphs is None:
        cuda_graphs = device == "cuda"
    # no per-call size and alignment asserts on the ~60 inputs: in Python they cost more than a
    # small model's kernels, and the guards have checked those shapes once per generation
    # already. (Only the switches this torch has: older ones lack alignment_asserts.)
    options = {k: False for k in ("size_asserts", "alignment_asserts") if hasattr(inductor_config, k)}
    if cuda_graphs:
        # torch.compile takes a mode or options, not both; mode="reduce-overhead" is this one
        # option (torch._inductor.list_mode_options("reduce-overhead"))
        options["triton.cudagraphs"] = True
    frozen = device == "cpu"  # the weights as constants, each matrix laid out once for oneDNN (_freezing)
    constant_while_compiling()  # the GPU check inside attention, read once while compiling
    step = torch.compile(_own_copy(decode_step), dynamic=False, options=options)
    compiled = _compiled_steps[model] = (step, cuda_graphs, weights_version(model) if frozen else None)
    return compiled
