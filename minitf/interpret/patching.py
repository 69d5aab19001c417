"""Activation patching: which places of the model carry the difference between two prompts.

Run a clean prompt ("When Mary and John went to the store, John gave a drink to") and a corrupted
one of the same length that changes the answer ("... Mary gave a drink to"); then run the corrupted
one again with one activation taken from the clean run. Where that one activation brings the clean
answer back, the information that decides it sits there. Recovery is measured on the logit
difference answer - wrong at the last position, normalised so that 1 is the clean run's and 0
the corrupted run's:

    recovered = (patched - corrupted) / (clean - corrupted)

`patch_residual` patches the residual stream at one layer boundary and one position: (n_layer + 1, T),
row 0 the embeddings, row i + 1 the stream after block i. `patch_heads` patches one head's output
(before the output projection) at every position: (n_layer, n_head), or at one position at a time:
(n_layer, n_head, T). Each patch is one copy of the corrupted prompt; the copies run in batches.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..model import Transformer
from ..system.runtime import eval_mode
from .checks import as_batch, refuse, token
from .memory import kept_bytes, pass_bytes, per_pass
from .trace import Trace, trace


def check_pair(
    model: Transformer, clean, corrupted, answer: int, wrong: int
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Both prompts as (1, T) ids of the same length, and the two tokens: in the vocabulary, and two."""
    clean, corrupted = as_batch(model, clean, "clean"), as_batch(model, corrupted, "corrupted")  # (1, T) each
    for name, ids in (("clean", clean), ("corrupted", corrupted)):
        if ids.size(0) != 1:
            raise refuse(name, f"a batch of {ids.size(0)} sequences", "one prompt's ids, of shape (T,)")
    if clean.shape != corrupted.shape:
        raise refuse(
            "corrupted",
            f"{corrupted.size(1)} tokens long and clean {clean.size(1)}",
            "prompts of the same length: change words that are one token each",
        )
    answer, wrong = token(model, answer, "the answer token"), token(model, wrong, "the wrong token")
    if answer == wrong:
        raise refuse(
            "the wrong token",
            f"{wrong}, the answer token too",
            "another token: patching recovers the logit difference answer - wrong, which is 0 for one token",
        )
    return clean, corrupted, answer, wrong


def logit_diff(t: Trace, answer: int, wrong: int) -> torch.Tensor:
    """(B,): logit of answer minus logit of wrong at the last position of each sequence."""
    last = t.logits[:, -1].float()  # (B, V)
    return last[:, answer] - last[:, wrong]


class Recovery:
    """The normalisation (patched - corrupted) / (clean - corrupted) of a clean/corrupted pair.

    The clean and corrupted runs are batches of the same shape as the patched runs (copies of one
    prompt): a matmul's rounding can depend on the batch's shape, and a small logit difference
    would magnify that noise into a recovered share that is not 0 where nothing changed."""

    def __init__(self, model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, answer: int, wrong: int, keep):
        self.answer, self.wrong, self.size = answer, wrong, clean.size(0)
        self.clean_run = trace(model, clean, keep=keep)  # the patches' source: its residual stream, and `keep`
        self.clean = logit_diff(self.clean_run, answer, wrong)  # (B,)
        self.corrupted = logit_diff(trace(model, corrupted), answer, wrong)  # (B,)
        if float(self.clean[0]) == float(self.corrupted[0]):
            raise ConfigError(
                f"the clean and corrupted prompts give the same logit difference ({float(self.clean[0]):.4g}): "
                f"nothing to recover; choose prompts whose answers differ"
            )

    def __call__(self, patched: Trace) -> torch.Tensor:
        """(B,) recovered share of each patched run."""
        return (logit_diff(patched, self.answer, self.wrong) - self.corrupted) / (self.clean - self.corrupted)


def copy_bytes(model: Transformer, T: int, keep: tuple[str, ...]) -> int:
    """What one patched copy holds at once: what the clean run keeps for it (the patches' source)
    and a pass of its own (memory.py)."""
    return kept_bytes(model, T, keep) + pass_bytes(model, T)


def run_patched(
    model: Transformer, clean, corrupted, answer: int, wrong: int, n: int, edits, keep=(), budget=None, what=""
) -> torch.Tensor:
    """(n,): the recovered share of n patched copies of the corrupted prompt, run in batches.

    edits(copies, clean_run) -> trace's edit keywords patching each copy (copies: its indices
    0 .. n - 1) from clean_run, a batch of the clean prompt as big as the copies, which keeps its
    residual stream and the steps in `keep`. Each batch size gets its own clean and corrupted
    baselines (Recovery: the same shape, so the same rounding); a batch holds at most `budget` bytes."""
    T = clean.size(1)
    size = per_pass(copy_bytes(model, T, keep), T, budget, what)
    baseline, out = None, []
    for lo in range(0, n, size):
        copies = torch.arange(lo, min(lo + size, n))
        b = len(copies)
        if baseline is None or baseline.size != b:
            baseline = None  # the last batch is smaller: its baselines replace, not join, the others
            baseline = Recovery(model, clean.expand(b, -1), corrupted.expand(b, -1), answer, wrong, keep)
        patched = trace(model, corrupted.expand(b, -1), keep=(), **edits(copies, baseline.clean_run))
        out.append(baseline(patched))
    return torch.cat(out).cpu()  # (n,)


@torch.no_grad()
def patch_residual(
    model: Transformer, clean, corrupted, answer: int, wrong: int, budget: int | None = None
) -> torch.Tensor:
    """(n_layer + 1, T): the logit difference recovered by patching the clean residual stream into
    the corrupted run at each layer boundary (row 0 the embeddings, row i + 1 after block i) and
    each position. Patching the last row at the last position recovers exactly 1; a row's earlier
    positions recover 0 there (nothing after the last block mixes positions). The copies go in
    batches of at most `budget` bytes (memory.py; default memory.BUDGET)."""
    clean, corrupted, answer, wrong = check_pair(model, clean, corrupted, answer, wrong)
    T, points = clean.size(1), model.config.n_layer + 1

    def edits(copies: torch.Tensor, clean_run: Trace) -> dict:  # copy k: point k // T, position k % T
        rows = torch.arange(len(copies), device=clean.device)

        def edit(at: int, x: torch.Tensor) -> torch.Tensor:  # x (b, T, C)
            mine = (copies // T == at).to(x.device)  # (b,) the copies that patch this point
            if not mine.any():
                return x
            x, pos = x.clone(), (copies % T).to(x.device)
            x[rows[mine], pos[mine]] = clean_run.residuals[at][rows[mine], pos[mine]]  # (m, C) <- the clean stream
            return x

        return {"edit_resid": edit}

    with eval_mode(model):
        recovered = run_patched(model, clean, corrupted, answer, wrong, points * T, edits, (), budget, "patch_residual")
    return recovered.view(points, T)


@torch.no_grad()
def patch_heads(
    model: Transformer, clean, corrupted, answer: int, wrong: int, by_position: bool = False, budget: int | None = None
) -> torch.Tensor:
    """(n_layer, n_head): the logit difference recovered by patching one head's clean output
    (before the output projection, at every position) into the corrupted run. by_position=True:
    (n_layer, n_head, T), one head at one position at a time. budget: as patch_residual's."""
    clean, corrupted, answer, wrong = check_pair(model, clean, corrupted, answer, wrong)
    L, H, T = model.config.n_layer, model.config.n_head, clean.size(1)
    P = T if by_position else 1  # copies per head: one per position, or one for all positions

    def edits(
        copies: torch.Tensor, clean_run: Trace
    ) -> dict:  # copy k: layer k // (H P), head k // P % H, position k % P
        take = torch.zeros(len(copies), H, T, dtype=torch.bool)  # (b, H, T): where each copy takes the clean output
        rows, head = torch.arange(len(copies)), copies // P % H
        if by_position:
            take[rows, head, copies % P] = True
        else:
            take[rows, head] = True
        layer = copies // (H * P)

        def edit(at: int, out: torch.Tensor) -> torch.Tensor:  # out (b, H, T, D)
            mask = (take & (layer == at)[:, None, None]).to(out.device)[..., None]  # (b, H, T, 1)
            return torch.where(mask, clean_run.heads[at], out) if mask.any() else out

        return {"edit_heads": edit}

    with eval_mode(model):
        got = run_patched(model, clean, corrupted, answer, wrong, L * H * P, edits, ("heads",), budget, "patch_heads")
    got = got.view(L, H, P)
    return got if by_position else got[..., 0]  # (L, H, T) or (L, H)
