"""Figures of a run over its training: what its heads became, step by step, read from its snapshots.

The scores are minitf/interpret/history.py's (`heads_over_training`: each head's induction score
and the in-context-learning score at every snapshot). `plot_heads_over_training` draws them under
the loss curve on one step axis, which is where Olsson et al. 2022 saw induction heads form: a
sudden jump of the scores with a bump in the loss. `minitf heads` is the command for both.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot (figures.py).
"""

from __future__ import annotations

from pathlib import Path

from ..interpret.history import HeadHistory, heads_over_training
from ..run_dir import METRICS, STEPS, read_rows
from .figures import check_figure_out, new_figure, save_figure

HEADS_PNG = "heads.png"  # minitf heads' figure, in the run directory unless --out says otherwise
HEADS_KIND = "heads"  # its tag (figures.FIGURE_KEY): minitf heads run again replaces its own figure only


def plot_heads_over_training(history: HeadHistory, out_path, force: bool = False) -> Path:
    """One figure, the step on its x axis: the loss curve (train from steps.jsonl, val from
    metrics.jsonl), every head's induction score, and the in-context-learning score. An existing
    out_path is replaced only when it holds such a figure drawn here, or with force."""
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
    return save_figure(fig, out_path, kind=HEADS_KIND, force=force, dpi=90)


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


def watch_heads(
    run_dir: str | Path, out_path=None, length: int | None = None, force: bool = False
) -> tuple[HeadHistory, Path]:
    """minitf heads in Python: score run_dir's snapshots and draw them (default: <run>/heads.png).
    out_path is checked before the snapshots are scored: a wrong one fails at once."""
    out_path = check_figure_out(out_path or Path(run_dir) / HEADS_PNG, HEADS_KIND, force)
    history = heads_over_training(run_dir, length=length)
    return history, plot_heads_over_training(history, out_path, force=force)
