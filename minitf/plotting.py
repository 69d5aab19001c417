"""Loss curves from metrics.jsonl (train and val loss, val bits per byte), one or more runs.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot: a notebook's
backend and pyplot's list of open figures stay as the caller had them.
"""
from __future__ import annotations

from pathlib import Path

from .checkpoint import METRICS, read_metrics
from .config import MinitfError
from .io import atomic_write


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


def plot_runs(run_dirs, out_path) -> Path:
    """Draw every run's curves on one figure (loss on the left, val bpb on the right)."""
    run_dirs = [Path(d) for d in run_dirs]
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise MinitfError(f"run directory {str(run_dir)!r} does not exist; pass --run DIR of a trained run")
    fig = new_figure(figsize=(11, 4.2))
    ax_loss, ax_bpb = fig.subplots(1, 2)
    for run_dir in run_dirs:
        rows = [r for r in read_metrics(run_dir) if "val_loss" in r]
        if not rows:
            raise MinitfError(f"{run_dir / METRICS} has no evaluations yet; train longer than train.eval_every")
        steps = [r["step"] for r in rows]
        label = run_dir.name if len(run_dirs) > 1 else ""
        line, = ax_loss.plot(steps, [r["train_loss"] for r in rows], label=f"{label} train".strip())
        ax_loss.plot(steps, [r["val_loss"] for r in rows], "--", color=line.get_color(),
                     label=f"{label} val".strip())
        ax_bpb.plot(steps, [r["val_bpb"] for r in rows], color=line.get_color(), label=label or "val")
    ax_loss.set(xlabel="step", ylabel="loss (nats/token)", title="loss")
    ax_bpb.set(xlabel="step", ylabel="bits per byte", title="validation bits per byte")
    for ax in (ax_loss, ax_bpb):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return save_figure(fig, out_path, dpi=110)


def plot_loss(run_dir) -> Path:
    """A run's own loss.png, from its metrics.jsonl (what training wires in after each evaluation)."""
    return plot_runs([run_dir], Path(run_dir) / "loss.png")
