"""One decoding step of generation: a new token through the model and its KV cache, eager or
under torch.compile.

Compiled, the step runs on a static KVCache (every shape fixed, so one graph serves every
position) and is compiled once per model and batch size; generate.py chooses which step to take.
"""

from __future__ import annotations

import weakref

import torch

from .kv_cache import KVCache


def decode_step(model: torch.nn.Module, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """idx (B, 1), the token sampled last -> the logits (B, V) of the position after it."""
    return model(idx, cache=cache)[0][:, -1]  # (B, V): the logits of the one new position


# one compiled decode step per model, dropped with the model; made on first use, since importing
# the compiler takes seconds
_compiled_steps: weakref.WeakKeyDictionary[torch.nn.Module, object] = weakref.WeakKeyDictionary()


def compiled_decode_step(model: torch.nn.Module, idx: torch.Tensor, cache: KVCache, checked: bool) -> torch.Tensor:
    """`decode_step` under torch.compile, compiled once per model and batch size: a static
    KVCache keeps every shape fixed. checked: a step of this generation has already run with
    torch.compile's guards checked; the next ones see the same model and cache, so checking
    again on every token (a real cost next to a small model's step on a CPU) is skipped."""
    step = _compiled_steps.get(model)
    if step is None:
        import torch._inductor.config as inductor_config

        # no per-call size and alignment asserts on the ~60 inputs: in Python they cost more than a
        # small model's kernels, and the guards have checked those shapes once per generation
        # already. (Only the switches this torch has: older ones lack alignment_asserts.)
        off = {k: False for k in ("size_asserts", "alignment_asserts") if hasattr(inductor_config, k)}
        step = _compiled_steps[model] = torch.compile(decode_step, dynamic=False, options=off)
    with torch.compiler.set_stance(skip_guard_eval_unsafe=checked):
        return step(model, idx, cache)
