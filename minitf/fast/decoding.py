"""One decoding step of generation: a new token through the model and its KV cache, eager or
under torch.compile.

Compiled, the step runs on a static KVCache (every shape fixed, so one graph serves every
position) and is compiled once per model and batch size; generate.py chooses which step to take.
On a GPU the compiled step replays CUDA graphs (torch.compile's "reduce-overhead"): batch-1
decoding is launch-bound there, a few dozen small kernels per token.
"""

from __future__ import annotations

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
    step, graphs = _compiled_steps.get(model) or compile_decode(model)
    with torch.compiler.set_stance(skip_guard_eval_unsafe=checked):
        logits = step(model, idx, cache)  # (B, V)
    # a CUDA graph's output lives in its memory pool, which the next token's replay overwrites:
    # the caller gets a copy it may keep (stream_tokens and with_logits hand the logits on)
    return logits.clone() if graphs else logits


def compile_decode(model: torch.nn.Module, cuda_graphs: bool | None = None) -> tuple:
    """Compile `decode_step` for `model`, replacing any compiled before: (the step, whether it
    replays CUDA graphs). compiled_decode_step calls this on first use; a benchmark calls it to
    choose. cuda_graphs: each token's kernels recorded once and replayed as one CUDA graph (what
    torch.compile's mode="reduce-overhead" does), so a small model's step is not a dozen kernel
    launches from Python per layer; None means on a GPU, and never on a CPU, which has no graphs."""
    import torch._inductor.config as inductor_config

    if cuda_graphs is None:
        cuda_graphs = next(model.parameters()).device.type == "cuda"
    # no per-call size and alignment asserts on the ~60 inputs: in Python they cost more than a
    # small model's kernels, and the guards have checked those shapes once per generation
    # already. (Only the switches this torch has: older ones lack alignment_asserts.)
    options = {k: False for k in ("size_asserts", "alignment_asserts") if hasattr(inductor_config, k)}
    if cuda_graphs:
        # torch.compile takes a mode or options, not both; mode="reduce-overhead" is this one
        # option (torch._inductor.list_mode_options("reduce-overhead"))
        options["triton.cudagraphs"] = True
    constant_while_compiling()  # the GPU check inside attention, read once while compiling
    compiled = _compiled_steps[model] = (torch.compile(decode_step, dynamic=False, options=options), cuda_graphs)
    return compiled
