"""What one pass of minitf.interpret holds in memory, and how many sequences fit in a budget.

Interpretability runs the textbook attention (trace.py), which makes every block's T x T steps
(q.kᵀ, scaled, masked, softmaxed: about five (H, T, T) tensors at once), so a sequence costs T²
bytes where the model's own fused attention costs T. A tool runs its sequences (or its patched
copies) in batches of as many as BUDGET bytes hold, counting everything a pass holds at its peak:
what the tool keeps of each block, the residual stream, the block being computed and the logits.
When one sequence alone is over the budget the tool refuses, naming the budget and what the
sequence would need: pass shorter ids, or a larger `budget`.
"""

from __future__ import annotations

from collections.abc import Collection

from ..model import Transformer
from ..system.sizes import ffn_hidden, padded_vocab
from .checks import at_least, refuse

BUDGET = 2**30  # bytes a tool's pass may hold at once, unless the call passes budget=


def kept_bytes(model: Transformer, T: int, keep: Collection[str] = ()) -> int:
    """Bytes one sequence of T tokens holds after a trace() that keeps `keep` of every block's steps
    (names of CausalSelfAttention.steps, or attn_out and ffn_out), the residual stream and logits included."""
    c, e = model.config, model.lm_head.weight.element_size()
    square, heads, stream = c.n_head * T * T * e, c.n_head * T * c.head_size * e, T * c.n_embd * e
    per_block = dict(scores=square, scaled=square, masked=square, weights=square, attn_out=stream, ffn_out=stream)
    per_block.update(q=heads, k=heads, v=heads, heads=heads)
    logits = T * padded_vocab(c.vocab_size) * e
    return c.n_layer * sum(per_block[name] for name in keep) + (c.n_layer + 1) * stream + logits


def pass_bytes(model: Transformer, T: int, keep: Collection[str] = ()) -> int:
    """Bytes one sequence of T tokens holds at the peak of a trace() that keeps `keep`: what it
    keeps, and the widest moment on the way, one block's attention steps, its FFN or the logits."""
    c, e = model.config, model.lm_head.weight.element_size()
    square, heads, stream = c.n_head * T * T * e, c.n_head * T * c.head_size * e, T * c.n_embd * e
    working = max(5 * square + 5 * heads, 3 * T * ffn_hidden(c) * e, 2 * T * padded_vocab(c.vocab_size) * e)
    return kept_bytes(model, T, keep) + working + 3 * stream


def forward_bytes(model: Transformer, T: int) -> int:
    """Bytes one sequence of T tokens holds at the peak of the model's own forward and a loss on
    its logits: the fused attention makes no T x T step, the reference one makes trace()'s."""
    c, e = model.config, model.lm_head.weight.element_size()
    if c.attention == "reference":
        return pass_bytes(model, T)
    logits = T * padded_vocab(c.vocab_size) * e
    return 4 * T * c.n_embd * e + max(3 * T * ffn_hidden(c) * e, 3 * logits)


def per_pass(per_sequence: int, T: int, budget: int | None, what: str) -> int:
    """How many sequences (or copies) of `per_sequence` bytes one pass of `what` may hold; refused
    in one line, naming the budget, when even one is over it."""
    budget = BUDGET if budget is None else at_least(budget, "budget", 1)
    if per_sequence > budget:
        raise refuse(
            "budget",
            f"{mib(budget)}, and {what} on one sequence of {T} tokens holds about {mib(per_sequence)} at once",
            f"shorter ids, or budget={per_sequence} (bytes) or more",
        )
    return budget // per_sequence


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"
