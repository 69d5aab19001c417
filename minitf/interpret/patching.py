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
(before the output projection) at every position: (n_layer, n_head).
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..model import Transformer
from ..system.runtime import eval_mode
from .trace import Trace, as_batch, trace


def check_pair(model: Transformer, clean, corrupted, answer: int, wrong: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Both prompts as (1, T) ids of the same length, and the two tokens in the vocabulary."""
    clean, corrupted = as_batch(model, clean), as_batch(model, corrupted)  # (1, T) each
    if clean.size(0) != 1 or corrupted.size(0) != 1:
        raise ConfigError("patching reads one clean and one corrupted prompt: pass ids of shape (T,)")
    if clean.shape != corrupted.shape:
        raise ConfigError(
            f"the corrupted prompt is {corrupted.size(1)} tokens and the clean one {clean.size(1)}: "
            f"patching needs the same length; change words that are one token each"
        )
    V = model.config.vocab_size
    for name, t in (("answer", answer), ("wrong", wrong)):
        if not 0 <= t < V:
            raise ConfigError(f"{name} token {t} is not in the vocabulary; pass 0..{V - 1}")
    return clean, corrupted


def logit_diff(t: Trace, answer: int, wrong: int) -> torch.Tensor:
    """(B,): logit of answer minus logit of wrong at the last position of each sequence."""
    last = t.logits[:, -1].float()  # (B, V)
    return last[:, answer] - last[:, wrong]


class Recovery:
    """The normalisation (patched - corrupted) / (clean - corrupted) of a clean/corrupted pair.

    The clean and corrupted runs are batches of the same shape as the patched runs (copies of one
    prompt): a matmul's rounding can depend on the batch's shape, and a small logit difference
    would magnify that noise into a recovered share that is not 0 where nothing changed."""

    def __init__(self, model: Transformer, clean: torch.Tensor, corrupted: torch.Tensor, answer: int, wrong: int):
        self.answer, self.wrong = answer, wrong
        self.clean_run = trace(model, clean)  # the patches' source
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


@torch.no_grad()
def patch_residual(model: Transformer, clean, corrupted, answer: int, wrong: int) -> torch.Tensor:
    """(n_layer + 1, T): the logit difference recovered by patching the clean residual stream into
    the corrupted run at each layer boundary (row 0 the embeddings, row i + 1 after block i) and
    each position. Patching the last row at the last position recovers exactly 1; a row's earlier
    positions recover 0 there (nothing after the last block mixes positions)."""
    clean, corrupted = check_pair(model, clean, corrupted, answer, wrong)
    T = clean.size(1)
    rows = []
    with eval_mode(model):
        batch = corrupted.expand(T, T)  # (T, T): copy b patches position b
        recovered = Recovery(model, clean.expand(T, T), batch, answer, wrong)
        for point in range(model.config.n_layer + 1):
            source = recovered.clean_run.residuals[point][0]  # (T, C)

            def edit(at: int, x: torch.Tensor, point=point, source=source) -> torch.Tensor:  # x (T, T, C)
                if at != point:
                    return x
                x = x.clone()
                x[torch.arange(T), torch.arange(T)] = source  # copy b, position b <- the clean stream there
                return x

            rows.append(recovered(trace(model, batch, edit_resid=edit)))  # (T,)
    return torch.stack(rows).cpu()  # (L + 1, T)


@torch.no_grad()
def patch_heads(
    model: Transformer, clean, corrupted, answer: int, wrong: int, by_position: bool = False
) -> torch.Tensor:
    """(n_layer, n_head): the logit difference recovered by patching one head's clean output
    (before the output projection, at every position) into the corrupted run. by_position=True:
    (n_layer, n_head, T), one head at one position at a time."""
    clean, corrupted = check_pair(model, clean, corrupted, answer, wrong)
    H, T = model.config.n_head, clean.size(1)
    P = T if by_position else 1  # copies per head: one per position, or one for all positions
    copies = torch.arange(H * P)
    take = torch.zeros(H * P, H, T, dtype=torch.bool)  # (H*P, H, T): where copy c takes the clean output
    if by_position:
        take[copies, copies // P, copies % P] = True  # copy c: head c // T at position c % T
    else:
        take[copies, copies] = True  # copy h: head h at every position
    rows = []
    with eval_mode(model):
        batch = corrupted.expand(H * P, -1)  # (H*P, T)
        recovered = Recovery(model, clean.expand(H * P, -1), batch, answer, wrong)
        take = take[..., None].to(batch.device)  # (H*P, H, T, 1)
        for layer in range(model.config.n_layer):
            source = recovered.clean_run.heads[layer][0]  # (H, T, D)

            def edit(i: int, out: torch.Tensor, layer=layer, source=source) -> torch.Tensor:  # out (H*P, H, T, D)
                return torch.where(take, source, out) if i == layer else out

            rows.append(recovered(trace(model, batch, edit_heads=edit)).view(H, P))  # (H, P)
    out = torch.stack(rows).cpu()  # (L, H, P)
    return out if by_position else out[..., 0]  # (L, H, T) or (L, H)
