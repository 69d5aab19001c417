"""A run's heads over its training, read from its snapshots: what `minitf heads` draws.

A run trained with train.snapshot_every keeps its weights every N steps (minitf/training/snapshots.py).
`heads_over_training` scores every snapshot on repeated random tokens (a random sequence, then the
same again): each head's induction score, which is how much it looks at the token after an
earlier copy of the current one, and the in-context-learning score (the loss late in the run's own
validation text minus early in it, as Olsson et al. measured it on text). The random tokens are
drawn from those the run's text uses, where its token cache is at hand: a token the model never
saw (most of the 256 byte tokens, in a corpus of English) has an untrained embedding, and a head
cannot match what it cannot tell apart. minitf/plots/training_figures.py draws the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import load_run_config
from ..corpus.prepare import prepare_data
from ..errors import MinitfError
from ..model import Transformer
from ..run_dir import CONFIG, TOKENIZER, load_weights
from ..tokenizer import Tokenizer
from .checks import as_int, at_least, index
from .scores import head_scores, in_context_score, repeated_tokens
from .snapshots import checked_snapshots

# in_context_score needs 12 tokens, and both copies fit the context
HALF = " (the repeated sequence's length: at least 6, and both copies fit in block_size)"


@dataclass
class HeadHistory:
    """A run's heads over its snapshots: one entry per snapshot, in step order."""

    run_dir: Path
    steps: list[int]
    induction: torch.Tensor  # (S, n_layer, n_head): each head's induction score (1/2 is perfect, TransformerLens)
    previous_token: torch.Tensor  # (S, n_layer, n_head): each head's previous-token score
    in_context: list[float]  # the in-context-learning score (nats; negative: later tokens are predicted better)
    length: int  # the repeated sequence's length: the ids are `length` random tokens, then the same again
    drawn_from: str  # which tokens the random ones were drawn from, in words
    in_context_on: str  # what the in-context score was measured on, in words


def heads_over_training(run_dir: str | Path, length: int | None = None, batch: int = 16, seed: int = 0) -> HeadHistory:
    """Score every snapshot of run_dir on `batch` sequences of `length` random tokens repeated
    (default 24, or half the context if that is shorter: a small model learns the repeats its text
    holds, and may not look back much further than those), and its in-context score on
    IN_CONTEXT_WINDOWS windows of the run's validation text (on the repeated tokens without it).

    Refused in one line when run_dir is not a run, or has no snapshots (train.snapshot_every).
    """
    run_dir = check_run(run_dir)
    cfg = load_run_config(run_dir / CONFIG)
    half = cfg.model.block_size // 2
    length = min(half, 24) if length is None else index(length, "length (--length)", 6, half, HALF)
    batch, seed = at_least(batch, "batch", 1), as_int(seed, "seed", "an int")
    model = Transformer(cfg.model).eval()
    kept = checked_snapshots(run_dir, cfg, _tokenizer_hash(run_dir), model)
    if not kept:
        raise MinitfError(
            f"{run_dir} has no snapshots; train it with train.snapshot_every=N (its weights every N steps), "
            f"e.g. minitf train --config induction"
        )
    ids, drawn_from, text = _probe(run_dir, cfg, length, batch, seed)  # (B, 2 * length), (W, block_size) or None
    induction, previous, icl = [], [], []
    for _, path in kept:
        load_weights(model, path)
        scores = head_scores(model, ids)  # each (n_layer, n_head)
        induction.append(scores["induction"])
        previous.append(scores["previous_token"])
        icl.append(in_context_score(model, ids if text is None else text))
    steps = [s for s, _ in kept]
    on = f"{length} random tokens repeated" if text is None else f"{len(text)} windows of its validation text"
    return HeadHistory(run_dir, steps, torch.stack(induction), torch.stack(previous), icl, length, drawn_from, on)


def check_run(run_dir: str | Path) -> Path:
    """run_dir as a Path, refused in one line when it is not a run's directory (saying what it is)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        what = f"has no {CONFIG}" if run_dir.is_dir() else "is a file, not a directory" if run_dir.exists() else ""
        where = f"run directory {str(run_dir)!r} {what or 'does not exist'}"
        raise MinitfError(f"{where}; pass --run DIR of a run trained with minitf train")
    return run_dir


def _tokenizer_hash(run_dir: Path) -> str | None:
    """The hash of the run's tokenizer, which its snapshots record; None where it cannot be read."""
    try:
        return Tokenizer.load(run_dir / TOKENIZER).hash
    except (MinitfError, OSError):
        return None


SEEN_SAMPLE = 1 << 22  # the tokens read to find which ids the text uses: a few MB, enough for a small run
IN_CONTEXT_WINDOWS = 64  # validation windows the in-context score averages over: one position each is noisy


def _probe(run_dir: Path, cfg, length: int, batch: int, seed: int) -> tuple[torch.Tensor, str, torch.Tensor | None]:
    """`repeated_tokens` drawn from the ids the run's training text uses (its token cache, found or
    rebuilt from data.source), and windows of its validation text; from the whole vocabulary, and
    no text, when the text is out of reach."""
    try:
        data = prepare_data(cfg.data, Tokenizer.load(run_dir / TOKENIZER), log=lambda line: None)
        seen = np.unique(np.asarray(data.tokens("train")[:SEEN_SAMPLE]))
        g = torch.Generator().manual_seed(seed)
        text, _ = data.get_batch("val", IN_CONTEXT_WINDOWS, cfg.model.block_size, g)  # (W, block_size)
    except (MinitfError, OSError):
        ids = repeated_tokens(cfg.model.vocab_size, length, batch=batch, seed=seed)
        return ids, "the whole vocabulary", None
    seen = torch.from_numpy(seen[seen > 0].astype(np.int64))  # (K,) the ids the text uses, <|endoftext|> aside
    picks = repeated_tokens(len(seen) + 1, length, batch=batch, seed=seed) - 1  # (B, 2 * length) in 0 .. K - 1
    return seen[picks], f"the {len(seen)} tokens its text uses", text
