"""Head scores: how much each attention head behaves like a previous-token, duplicate-token or
induction head, and the model's in-context-learning score.

These are the numbers interpretability work first asks of a model (TransformerLens's
`head_detector`, Olsson et al. 2022, "In-context Learning and Induction Heads"), computed here on
minitf's own models from the attention weights of one batched pass, so a score can be followed
over training or read off a run with no other library.

The three head scores follow TransformerLens's `transformer_lens/head_detector.py` exactly: a
detection pattern, a (T, T) matrix of ones where the head "should" look, and the "mul" measure,
sum(weights * pattern) / sum(weights), the share of the head's attention that falls on the
pattern (with its defaults: neither the first token nor the current one is excluded). Since every
row of weights sums to 1, sum(weights) is T, so even a perfect head scores below 1 where the
pattern has empty rows:

- previous_token: pattern[i, i-1] = 1. A perfect head scores (T - 1) / T (row 0 has no previous token).
- duplicate_token: pattern[i, j] = 1 for every earlier j < i with ids[j] == ids[i].
- induction: pattern[i, j] = 1 for every j <= i where ids[j-1] == ids[i], j >= 1 (the token after an
  earlier copy of the current one). On `repeated_tokens` (a sequence of n distinct ids, twice) a
  perfect induction head scores n / 2n = 1/2: only the second half's rows have somewhere to look.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fast.lm_loss import IGNORE
from ..model import Transformer
from ..system.runtime import eval_mode
from .checks import as_batch, as_int, at_least, index, refuse
from .memory import forward_bytes, pass_bytes, per_pass
from .trace import trace

SCORES = ("previous_token", "duplicate_token", "induction")


def repeated_tokens(vocab_size: int, length: int, batch: int = 4, seed: int = 0) -> torch.Tensor:
    """(batch, 2 * length) ids: in each row a random sequence of `length` ids, then the same again.

    The ids are drawn uniformly from 1 .. vocab_size - 1: id 0 is minitf's <|endoftext|>, which
    never appears inside a document. Within a row they are distinct (drawn without replacement)
    when the vocabulary has enough ids, so the only repeats are the planted ones. A generator
    seeded with `seed` draws them: the global RNG is left alone.
    """
    length, batch = at_least(length, "length", 1), at_least(batch, "batch", 1)
    vocab_size = at_least(vocab_size, "vocab_size", 2)  # id 0 is <|endoftext|>: at least one other
    g = torch.Generator().manual_seed(as_int(seed, "seed", "an int"))
    if length <= vocab_size - 1:
        first = torch.stack([torch.randperm(vocab_size - 1, generator=g)[:length] for _ in range(batch)])  # (B, n)
    else:
        first = torch.randint(0, vocab_size - 1, (batch, length), generator=g)  # (B, n)
    first = first + 1  # 0 .. vocab_size - 2 -> 1 .. vocab_size - 1: never <|endoftext|>
    return torch.cat([first, first], dim=1)  # (B, 2n)


def detection_patterns(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """(B, T) ids -> {score name: (B, T, T) float patterns}, TransformerLens's three detection patterns."""
    B, T = ids.shape
    below = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(-1)  # (T, T) j < i
    previous = below & ~below.tril(-2)  # (T, T) j == i - 1
    duplicate = (ids[:, :, None] == ids[:, None, :]) & below  # (B, T, T) ids[i] == ids[j], j < i
    # shifted one column right: query i looks at the token after its earlier copy, column 0 empty
    induction = F.pad(duplicate[:, :, :-1], (1, 0))  # (B, T, T) j <= i already, as j - 1 < i
    return {
        "previous_token": previous.expand(B, T, T).float(),
        "duplicate_token": duplicate.float(),
        "induction": induction.float(),
    }


@torch.no_grad()
def head_scores(model: Transformer, ids, budget: int | None = None) -> dict[str, torch.Tensor]:
    """{"previous_token", "duplicate_token", "induction"}: each (n_layer, n_head), every head's score.

    ids: (T,) or (B, T) token ids, e.g. `repeated_tokens(...)` or your own text's
    (`tokenizer.encode(text)`); a batch's scores are the mean of each sequence's, as
    TransformerLens's `detect_head` averages over a list of texts. The score is TransformerLens's
    "mul" measure (this module's docstring): the share of each head's attention on the pattern.
    Sequences go in passes of at most `budget` bytes (memory.py; default memory.BUDGET).
    """
    ids = as_batch(model, ids)  # (B, T)
    T = ids.size(1)
    # a block's weights are scored as they are made and let go: a pass holds one block's steps and the patterns
    size = per_pass(pass_bytes(model, T) + 3 * T * T * (4 + 1), T, budget, "head_scores")
    per_sequence = {name: [] for name in SCORES}
    with eval_mode(model):
        for part in ids.split(size):  # (b, T) each
            trace(model, part, keep=scorer(detection_patterns(part), per_sequence))
    L = model.config.n_layer
    return {  # per_sequence[name]: (b, H) per block, per pass -> (L, B, H) -> (L, H)
        name: torch.stack([torch.cat(v[layer::L]) for layer in range(L)]).mean(dim=1).cpu()
        for name, v in per_sequence.items()
    }


def scorer(patterns: dict[str, torch.Tensor], out: dict[str, list]):
    """trace's keep for head_scores: each block's weights (b, H, T, T) scored against the patterns
    (b, T, T) as they are made, the (b, H) scores appended to out, and the weights let go."""

    def score(layer: int, steps: dict) -> dict:
        weights = steps["weights"].float()  # (b, H, T, T)
        total = weights.sum(dim=(-2, -1))  # (b, H)
        for name, pattern in patterns.items():  # no (b, H, T, T) product is made
            out[name].append(torch.einsum("bhij,bij->bh", weights, pattern) / total)
        return {}

    return score


@torch.no_grad()
def token_losses(model: Transformer, ids, budget: int | None = None) -> torch.Tensor:
    """(B, T - 1): the next-token loss at each position, position p predicting ids[:, p + 1]."""
    ids = as_batch(model, ids)  # (B, T)
    T = ids.size(1)
    if T < 2:
        raise refuse("ids", f"{T} token long", "at least 2 tokens for a next-token loss")
    size = per_pass(forward_bytes(model, T), T, budget, "in_context_score")
    out = []
    with eval_mode(model):
        for part in ids.split(size):  # (b, T)
            logits, _ = model(part[:, :-1])  # (b, T-1, V)
            losses = F.cross_entropy(logits.float().transpose(1, 2), part[:, 1:], ignore_index=IGNORE, reduction="none")
            out.append(losses)  # (b, T-1)
    return torch.cat(out).cpu()  # (B, T-1)


def in_context_positions(T: int) -> tuple[int, int]:
    """(early, late) positions for `in_context_score` on T ids: late is the last prediction
    (T - 2), early a tenth of it, the ratio of Olsson et al.'s tokens 500 and 50."""
    late = T - 2
    early = late // 10
    if early < 1:
        raise refuse("ids", f"{T} tokens long", "at least 12 tokens, so that the default early position is >= 1")
    return early, late


def in_context_score(
    model: Transformer, ids, early: int | None = None, late: int | None = None, budget: int | None = None
) -> float:
    """Olsson et al.'s in-context-learning score: the loss at a late position minus the loss at
    an early one, averaged over the batch. Negative: the model predicts better with more context.

    The paper took token 500 minus token 50. Scaled to ids of T tokens
    (at most block_size), this takes by default the last position, late = T - 2 (the loss of
    predicting ids[T - 1]) and early = late // 10, the same 10:1 ratio: on 256 tokens, 254 and 25.
    Pass early and late (positions of the prediction, 0 .. T - 2) to choose others. One position
    of one text is noisy: pass a batch of texts (B, T), e.g. block_size windows of a corpus.
    """
    ids = as_batch(model, ids)  # (B, T)
    default_early, default_late = in_context_positions(ids.size(1))
    last = f" (a prediction position of these {ids.size(1)} ids)"
    early = default_early if early is None else index(early, "early", 0, ids.size(1) - 2, last)
    late = default_late if late is None else index(late, "late", 0, ids.size(1) - 2, last)
    losses = token_losses(model, ids, budget)  # (B, T-1)
    return float(losses[:, late].mean() - losses[:, early].mean())
