"""Figures of a run over its training: what its heads became, step by step, read from its snapshots.

A run trained with train.snapshot_every keeps its weights every N steps (minitf/training/snapshots.py).
`heads_over_training` scores every snapshot on repeated random tokens (a random sequence, then the
same again: minitf.interpret): each head's induction score, which is how much it looks at the
token after an earlier copy of the current one, and the in-context-learning score (the loss late
in the run's own validation text minus early in it, as Olsson et al. measured it on text). The
random tokens are drawn from those the run's text uses, where its token cache is at hand: a token
the model never saw (most of the 256 byte tokens, in a corpus of English) has an untrained
embedding, and a head cannot match what it cannot tell apart.
`plot_heads_over_training` draws them under the loss curve on one step axis, which is where
Olsson et al. 2022 saw induction heads form: a sudden jump of the scores with a bump in the loss.
`minitf heads` is the command for both.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot (figures.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import load_run_config
from ..data import prepare_data
from ..errors import MinitfError
from ..interpret import head_scores, in_context_score, repeated_tokens
from ..model import Transformer
from ..tokenizer import Tokenizer
from ..training.checkpoint import CONFIG, TOKENIZER, load_weights
from ..training.metrics import METRICS, STEPS, read_rows
from ..training.snapshots import list_snapshots
from .figures import new_figure, save_figure

HEADS_PNG = "heads.png"  # minitf heads' figure, in the run directory unless --out says otherwise


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
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).is_file():
        what = "does not exist" if not run_dir.is_dir() else f"has no {CONFIG}"
        raise MinitfError(f"run directory {str(run_dir)!r} {what}; pass --run DIR of a run trained with minitf train")
    kept = list_snapshots(run_dir)
    if not kept:
        raise MinitfError(
            f"{run_dir} has no snapshots; train it with train.snapshot_every=N (its weights every N steps), "
            f"e.g. minitf train --config induction"
        )
    cfg = load_run_config(run_dir / CONFIG)
    length = length or min(cfg.model.block_size // 2, 24)
    if not 6 <= length <= cfg.model.block_size // 2:  # in_context_score needs 12 tokens; both copies fit the window
        raise MinitfError(f"length must be in [6, {cfg.model.block_size // 2}] (half the block size), got {length}")
    model = Transformer(cfg.model).eval()
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


def plot_heads_over_training(history: HeadHistory, out_path) -> Path:
    """One figure, the step on its x axis: the loss curve (train from steps.jsonl, val from
    metrics.jsonl), every head's induction score, and the in-context-learning score."""
    fig = new_figure(figsize=(8, 7.5), layout="constrained")
    ax_loss, ax_ind, ax_icl = fig.subplots(3, 1, sharex=True)
    train = [r for r in read_rows(history.run_dir / STEPS) if r.get("loss") is not None]
    val = [r for r in read_rows(history.run_dir / METRICS) if r.get("val_loss") is not None]
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, alpha=0.7, label="train")
    ax_loss.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="val")
    ax_loss.set(ylabel="loss (nats/token)", title=f"{history.run_dir.name}: the loss, and what the heads became")
    _, n_layer, n_head = history.induction.shape
    colours = [f"C{i}" for i in range(10)]
    for layer in range(n_layer):
        for head in range(n_head):
            style = "-" if layer == n_layer - 1 else ":"  # the last layer's heads solid: where induction heads sit
            ax_ind.plot(
                history.steps,
                history.induction[:, layer, head].tolist(),
                style,
                color=colours[(layer * n_head + head) % 10],
                label=f"L{layer}H{head}",
            )
    top = float(history.induction.max())
    ax_ind.set(ylabel="induction score", ylim=(0, min(0.55, max(0.1, 1.25 * top))))  # low scores stay readable
    ax_ind.set_title("each head's induction score (a perfect induction head scores 0.5)", fontsize=10)
    ax_ind.legend(ncol=min(n_head, 4), fontsize=7, loc="upper left")
    ax_icl.plot(history.steps, history.in_context, "o-", ms=3, color="C3")
    ax_icl.axhline(0, color="grey", lw=0.8)
    ax_icl.set(xlabel="step", ylabel="nats")
    ax_icl.set_title(f"in-context-learning score: the loss late minus early, on {history.in_context_on}", fontsize=10)
    fig.suptitle(f"random tokens drawn from {history.drawn_from}", fontsize=8, x=0.99, ha="right")
    ax_loss.legend()
    for ax in (ax_loss, ax_ind, ax_icl):
        ax.grid(alpha=0.3)
    return save_figure(fig, out_path, dpi=90)


def format_heads_table(history: HeadHistory, top: int = 4) -> str:
    """A table, a row per snapshot: the step, the val loss evaluated at that step (where there is
    one), the in-context score and the induction score of the `top` heads that end highest."""
    final = history.induction[-1].flatten()  # (n_layer * n_head,)
    n_head = history.induction.shape[2]
    best = final.argsort(descending=True)[:top].tolist()
    names = [f"L{i // n_head}H{i % n_head}" for i in best]
    val = {r["step"]: r["val_loss"] for r in read_rows(history.run_dir / METRICS) if r.get("val_loss") is not None}
    rows = [f"{'step':>7} {'val loss':>8} {'in-context':>10}  " + " ".join(f"{n:>6}" for n in names)]
    for i, step in enumerate(history.steps):
        scores = history.induction[i].flatten()
        loss = f"{val[step]:8.3f}" if step in val else f"{'':8}"
        rows.append(f"{step:>7} {loss} {history.in_context[i]:>10.3f}  " + " ".join(f"{scores[j]:>6.3f}" for j in best))
    return "\n".join(rows)


def watch_heads(run_dir: str | Path, out_path=None, length: int | None = None) -> tuple[HeadHistory, Path]:
    """minitf heads in Python: score run_dir's snapshots and draw them (default: <run>/heads.png)."""
    history = heads_over_training(run_dir, length=length)
    return history, plot_heads_over_training(history, out_path or Path(run_dir) / HEADS_PNG)
