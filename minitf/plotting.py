"""Loss curves from metrics.jsonl and steps.jsonl (train and val loss, val bits per byte,
learning rate), one or more runs, against steps or wall-clock seconds.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot: a notebook's
backend and pyplot's list of open figures stay as the caller had them.
"""

from __future__ import annotations

from pathlib import Path

from .checkpoint import METRICS, read_metrics
from .config import MinitfError
from .io import atomic_write
from .metrics import STEPS, read_rows


def new_figure(**kw):
    """A matplotlib Figure that renders to files only (imported on use: loading a run never pays
    for matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, out_path, **kw) -> Path:
    out_path = Path(out_path)
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, format="png", **kw))
    return out_path


def plot_runs(run_dirs, out_path, x: str = "step") -> Path:
    """Draw every run's curves on one figure: loss, validation bits per byte, learning rate.

    x: "step", or "seconds" of training wall time, so recipes that step at different speeds
    compare as a user feels them. The training loss and LR come from steps.jsonl (every
    train.log_every steps) where the run has one, else from the evaluations in metrics.jsonl.
    """
    if x not in ("step", "seconds"):
        raise MinitfError(f"x must be step or seconds, got {x!r}")
    run_dirs = [Path(d) for d in run_dirs]
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise MinitfError(f"run directory {str(run_dir)!r} does not exist; pass --run DIR of a trained run")
    fig = new_figure(figsize=(15, 4.2))
    ax_loss, ax_bpb, ax_lr = fig.subplots(1, 3)
    key = "step" if x == "step" else "elapsed_s"
    for run_dir in run_dirs:
        evals = [r for r in read_metrics(run_dir) if "val_loss" in r]
        if not evals:
            raise MinitfError(f"{run_dir / METRICS} has no evaluations yet; train longer than train.eval_every")
        steps = [r for r in read_rows(run_dir / STEPS) if key in r] or [{**r, "loss": r["train_loss"]} for r in evals]
        label = run_dir.name if len(run_dirs) > 1 else ""
        style = {"marker": "o"} if len(evals) == 1 else {}  # one point draws no line
        at = lambda rows: [r[key] for r in rows]  # noqa: E731
        (line,) = ax_loss.plot(
            at(steps),
            [r["loss"] for r in steps],
            alpha=0.6,
            label=f"{label} train".strip(),
            **({"marker": "o"} if len(steps) == 1 else {}),
        )
        ax_loss.plot(
            at(evals),
            [r["val_loss"] for r in evals],
            "--",
            color=line.get_color(),
            label=f"{label} val".strip(),
            **style,
        )
        ax_bpb.plot(at(evals), [r["val_bpb"] for r in evals], color=line.get_color(), label=label or "val", **style)
        ax_lr.plot(
            at(steps),
            [r["lr"] for r in steps],
            color=line.get_color(),
            label=label or "lr",
            **({"marker": "o"} if len(steps) == 1 else {}),
        )
    xlabel = "step" if x == "step" else "training seconds (wall clock)"
    ax_loss.set(xlabel=xlabel, ylabel="loss (nats/token)", title="loss")
    ax_bpb.set(xlabel=xlabel, ylabel="bits per byte", title="validation bits per byte")
    ax_lr.set(xlabel=xlabel, ylabel="learning rate", title="learning rate")
    for ax in (ax_loss, ax_bpb, ax_lr):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return save_figure(fig, out_path, dpi=110)


def plot_loss(run_dir) -> Path:
    """A run's own loss.png, from its metrics.jsonl (what training wires in after each evaluation)."""
    return plot_runs([run_dir], Path(run_dir) / "loss.png")
