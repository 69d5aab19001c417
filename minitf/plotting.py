"""Loss curves from metrics.jsonl: train and val loss, and val bits per byte, for one or more runs."""
from __future__ import annotations

from pathlib import Path

from .checkpoint import METRICS, atomic_write, read_metrics
from .config import MinitfError


def plot_runs(run_dirs, out_path) -> Path:
    """Draw every run's curves on one figure (loss on the left, val bpb on the right)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_bpb) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run_dir in map(Path, run_dirs):
        rows = [r for r in read_metrics(run_dir) if "val_loss" in r]
        if not rows:
            plt.close(fig)
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
    out_path = Path(out_path)
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return out_path
