"""Figures of a run over its training: what its heads became, step by step, read from its snapshots.

The scores are minitf/interpret/history.py's (`heads_over_training`: each head's induction score
and the in-context-learning score at every snapshot). `plot_heads_over_training` draws them under
the loss curve on one step axis, which is where Olsson et al. 2022 saw induction heads form: a
sudden jump of the scores with a bump in the loss. `minitf heads` is the command for both.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot (figures.py).
"""

from __future__ import annotations

from pathlib import Path

from ..interpret.history import HeadHistory, check_run, heads_over_training
from ..run_dir import METRICS, STEPS, read_rows
from .figures import check_figure_out, new_figure, save_figure

HEADS_PNG = "heads.png"  # minitf heads' figure, in the run directory unless --out says otherwise
HEADS_KIND = "heads"  # its tag (figures.FIGURE_KEY): minitf heads run again replaces its own figure only


def plot_heads_over_training(history: HeadHistory, out_path, force: bool = False) -> Path:
    """One figure, the step on its x axis: the loss curve (train from steps.jsonl, val from
    metrics.jsonl), every head's previous-token and induction scores (the two halves of an
    induction circuit), and the in-context-learning score. An existing out_path is replaced only
    when it holds such a figure drawn here, or with force."""
    fig = new_figure(figsize=(8, 9.5), layout="constrained")
    ax_loss, ax_prev, ax_ind, ax_icl = fig.subplots(4, 1, sharex=True)
    train = [r for r in read_rows(history.run_dir / STEPS) if r.get("loss") is not None]
    val = [r for r in read_rows(history.run_dir / METRICS) if r.get("val_loss") is not None]
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, alpha=0.7, label="train")
    ax_loss.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="val")
    ax_loss.set(ylabel="loss (nats/token)", title=f"{history.run_dir.name}: the loss, and what the heads became")
    _each_head(ax_prev, history.steps, history.previous_token, solid=0)  # layer 0: where previous-token heads sit
    ax_prev.set(ylabel="previous-token score", ylim=(0, 1.05))
    ax_prev.set_title("each head's previous-token score (a perfect previous-token head scores ~1)", fontsize=10)
    _each_head(ax_ind, history.steps, history.induction, solid=history.induction.shape[1] - 1)  # the last layer
    top = float(history.induction.max())
    ax_ind.set(ylabel="induction score", ylim=(0, min(0.55, max(0.1, 1.25 * top))))  # low scores stay readable
    ax_ind.set_title("each head's induction score (a perfect induction head scores 0.5)", fontsize=10)
    ax_icl.plot(history.steps, history.in_context, "o-", ms=3, color="C3")
    ax_icl.axhline(0, color="grey", lw=0.8)
    ax_icl.set(xlabel="step", ylabel="nats")
    ax_icl.set_title(f"in-context-learning score: the loss late minus early, on {history.in_context_on}", fontsize=10)
    fig.suptitle(f"random tokens drawn from {history.drawn_from}", fontsize=8, x=0.99, ha="right")
    ax_loss.legend()
    for ax in (ax_loss, ax_prev, ax_ind, ax_icl):
        ax.grid(alpha=0.3)
    return save_figure(fig, out_path, kind=HEADS_KIND, force=force, dpi=90)


def _each_head(ax, steps: list[int], scores, solid: int) -> None:
    """A line per head of scores (S, n_layer, n_head) against the steps; layer `solid`'s solid, the rest dotted."""
    _, n_layer, n_head = scores.shape
    for layer in range(n_layer):
        for head in range(n_head):
            style, colour = "-" if layer == solid else ":", f"C{(layer * n_head + head) % 10}"
            ax.plot(steps, scores[:, layer, head].tolist(), style, color=colour, label=f"L{layer}H{head}")
    ax.legend(ncol=min(n_head, 4), fontsize=7, loc="upper left")


def format_heads_table(history: HeadHistory, top: int = 4, top_previous: int = 2) -> str:
    """A table, a row per snapshot: the step, the val loss evaluated at that step (where there is
    one), the in-context score, the induction score of the `top` heads that end highest, and the
    previous-token score of the `top_previous` heads that end highest."""
    n_head = history.induction.shape[2]
    induction = history.induction[-1].flatten().argsort(descending=True)[:top].tolist()
    previous = history.previous_token[-1].flatten().argsort(descending=True)[:top_previous].tolist()
    val = {r["step"]: r["val_loss"] for r in read_rows(history.run_dir / METRICS) if r.get("val_loss") is not None}

    def names(ranked: list[int]) -> str:
        return " ".join(f"{f'L{j // n_head}H{j % n_head}':>6}" for j in ranked)

    def values(ranked: list[int], scores) -> str:  # scores (n_layer, n_head)
        return " ".join(f"{float(scores.flatten()[j]):>6.3f}" for j in ranked)

    groups = f"{'':27}  {'induction score':<{7 * len(induction) - 1}}  previous-token score"
    rows = [groups, f"{'step':>7} {'val loss':>8} {'in-context':>10}  {names(induction)}  {names(previous)}"]
    for i, step in enumerate(history.steps):
        loss = f"{val[step]:8.3f}" if step in val else f"{'':8}"
        scores = f"{values(induction, history.induction[i])}  {values(previous, history.previous_token[i])}"
        rows.append(f"{step:>7} {loss} {history.in_context[i]:>10.3f}  {scores}")
    return "\n".join(rows)


def watch_heads(
    run_dir: str | Path, out_path=None, length: int | None = None, force: bool = False
) -> tuple[HeadHistory, Path]:
    """minitf heads in Python: score run_dir's snapshots and draw them (default: <run>/heads.png).
    out_path is checked before the snapshots are scored: a wrong one fails at once."""
    check_run(run_dir)  # a wrong --run is named as such, not as the --out it would give
    out_path = check_figure_out(out_path or Path(run_dir) / HEADS_PNG, HEADS_KIND, force)
    history = heads_over_training(run_dir, length=length)
    return history, plot_heads_over_training(history, out_path, force=force)
