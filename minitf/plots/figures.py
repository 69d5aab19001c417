"""Figures: loss curves from metrics.jsonl and steps.jsonl (train and val loss, val bits per byte,
learning rate) of one or more runs, against steps or wall-clock seconds; and attention heatmaps
from an Inspection (minitf.inspection), one head or every head of a layer.

Figures are drawn on their own `Figure` with the Agg canvas, never through pyplot: a notebook's
backend and pyplot's list of open figures stay as the caller had them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import MinitfError
from ..inspection import Inspection, check_layer_head, token_label
from ..run_dir import LOSS_PLOT, METRICS, STEPS, read_rows
from ..system.files import atomic_write, check_out_file


def new_figure(**kw):
    """A matplotlib Figure that renders to files only (imported on use: loading a run never pays
    for matplotlib)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


FIGURE_KEY = "minitf-figure"  # the PNG text chunk naming which kind of figure minitf drew there


def check_figure_out(out_path, kind: str = "figure", force: bool = False) -> Path:
    """The path a figure of `kind` may be written to (system.files.check_out_file): an existing file
    is replaced only with force, or when it is a figure of the same kind minitf drew there (so a
    command run again replaces its own picture, and never a file it did not write)."""
    return check_out_file(out_path, force, ours=lambda p: figure_kind(p) == kind, example=f"{kind}.png")


def save_figure(fig, out_path, kind: str = "figure", force: bool = False, **kw) -> Path:
    """Write fig as a PNG tagged with its kind (checked first by check_figure_out); kw go to savefig."""
    out_path = check_figure_out(out_path, kind, force)
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, format="png", metadata={FIGURE_KEY: kind}, **kw))
    return out_path


def figure_kind(path: Path) -> str | None:
    """The kind save_figure tagged the PNG at path with; None for any other file. Only the chunks
    before the image data are read (where the tag is written), at most 64 KiB."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    if not head.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    at = 8
    while at + 8 <= len(head):
        size, name = int.from_bytes(head[at : at + 4], "big"), head[at + 4 : at + 8]
        if name in (b"IDAT", b"IEND"):
            return None
        if name == b"tEXt":
            key, _, value = head[at + 8 : at + 8 + size].partition(b"\0")
            if key == FIGURE_KEY.encode():
                return value.decode("latin-1")
        at += 12 + size  # length, name, data, CRC
    return None


def plot_runs(run_dirs, out_path, x: str = "step", force: bool = False) -> Path:
    """Draw every run's curves on one figure: loss, validation bits per byte, learning rate.

    x: "step", or "seconds" of training wall time, so recipes that step at different speeds
    compare as a user feels them. The training loss and LR come from steps.jsonl (every
    train.log_every steps) where the run has one, else from the evaluations in metrics.jsonl.
    An existing out_path is replaced only when it holds loss curves drawn here, or with force.
    """
    if x not in ("step", "seconds"):
        raise MinitfError(f"x must be step or seconds, got {x!r}")
    check_figure_out(out_path, "loss", force)  # before any reading: a wrong --out fails fast
    run_dirs = [Path(d) for d in run_dirs]
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise MinitfError(f"run directory {str(run_dir)!r} does not exist; pass --run DIR of a trained run")
    from matplotlib.ticker import MaxNLocator

    fig = new_figure(figsize=(15, 4.2))
    ax_loss, ax_bpb, ax_lr = fig.subplots(1, 3)
    key = "step" if x == "step" else "elapsed_s"
    for run_dir in run_dirs:
        evals = [r for r in read_rows(run_dir / METRICS) if "val_loss" in r]
        if not evals:
            raise MinitfError(f"{run_dir / METRICS} has no evaluations yet; train longer than train.eval_every")
        steps = [r for r in read_rows(run_dir / STEPS) if key in r] or [
            {**r, "loss": r.get("train_loss")} for r in evals
        ]
        label = run_dir.name if len(run_dirs) > 1 else ""
        style = _marks(evals)
        (line,) = ax_loss.plot(*_xy(steps, key, "loss"), alpha=0.6, label=f"{label} train".strip(), **_marks(steps))
        ax_loss.plot(*_xy(evals, key, "val_loss"), "--", color=line.get_color(), label=f"{label} val".strip(), **style)
        # a row may lack a value (val_bpb, lr: rows written by an older minitf, or by hand): its point is left out
        ax_bpb.plot(*_xy(evals, key, "val_bpb"), color=line.get_color(), label=label or "val", **style)
        ax_lr.plot(*_xy(steps, key, "lr"), color=line.get_color(), label=label or "lr", **_marks(steps))
    xlabel = "step" if x == "step" else "training seconds (wall clock)"
    ax_loss.set(xlabel=xlabel, ylabel="loss (nats/token)", title="loss")
    ax_bpb.set(xlabel=xlabel, ylabel="bits per byte", title="validation bits per byte")
    ax_lr.set(xlabel=xlabel, ylabel="learning rate", title="learning rate")
    for ax in (ax_loss, ax_bpb, ax_lr):
        ax.grid(alpha=0.3)
        ax.legend()
        if x == "step":  # whole steps only: no step 1.2 between the evaluations of a short run
            lo, hi = ax.get_xlim()
            if hi - lo < 2:  # one step alone: a range around it that holds whole steps
                ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return save_figure(fig, out_path, kind="loss", force=force, dpi=110)


def _xy(rows: list, x: str, y: str) -> tuple[list, list]:
    """The (x, y) points of the rows that hold both values."""
    kept = [r for r in rows if r.get(x) is not None and r.get(y) is not None]
    return [r[x] for r in kept], [r[y] for r in kept]


FEW_POINTS = 20  # a curve of at most this many points marks each one: one point alone draws no line


def _marks(rows: list) -> dict:
    """A dot on each measured point of a short curve, so one or two evaluations still show as points."""
    if len(rows) > FEW_POINTS:
        return {}
    return {"marker": "o", "markersize": 6 if len(rows) == 1 else 3.5}


def plot_loss(run_dir) -> Path:
    """A run's own loss.png, from its metrics.jsonl (what training wires in after each evaluation):
    a file of the run, so one there is replaced (a link or a FIFO there is still refused)."""
    return plot_runs([run_dir], Path(run_dir) / LOSS_PLOT, force=True)


def plot_attention(ins: Inspection, out_path, layer: int = 0, head: int | None = None, force: bool = False) -> Path:
    """Heatmap of one head's attention weights, or a grid of every head of `layer` when head is None.

    Rows are queries, columns the keys they attend to; the grey triangle is what the causal mask
    hides. Panels grow with the text up to a cap; past that (about 45 tokens in a grid, 64 for one
    head) every n-th token is labelled, so labels never overlap. An existing out_path is replaced
    only when it holds an attention figure drawn here, or with force.
    """
    from matplotlib import colormaps

    layer, head = check_layer_head(ins, layer, head)
    heads = list(range(ins.n_head)) if head is None else [head]
    T = len(ins.tokens)
    ncols = math.ceil(math.sqrt(len(heads)))  # near square: 4 heads 2x2, 12 heads 4x3
    nrows = math.ceil(len(heads) / ncols)
    panel = min(max(2.5 + 0.2 * T, 4.0), 9.0) if len(heads) == 1 else min(max(2.0 + 0.12 * T, 3.2), 5.5)
    font = 8 if len(heads) == 1 else 7
    step = math.ceil(T / max(1, int(panel / (1.25 * font / 72))))  # a label per 1.25 text heights: no overlap
    ticks = list(range(0, T, step))
    labels = [token_label(ins.tokens[i], 12) for i in ticks]
    cmap = colormaps["viridis"].with_extremes(bad="#e6e6e6")  # bad = masked: the hidden future

    fig = new_figure(figsize=(ncols * panel + 1.2, nrows * panel + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for ax, h in zip(axes.flat, heads):
        w = np.ma.masked_array(ins.layers[layer].weights[h].numpy(), mask=future)  # (T, T)
        im = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"layer {layer}, head {h}", fontsize=font + 2)
        ax.set_xticks(ticks, labels, rotation=90, fontsize=font)
        ax.set_yticks(ticks, labels, fontsize=font)
        ax.tick_params(length=2, pad=1)
    for ax in axes.flat[len(heads) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("query (the token attending)")
    for ax in axes[-1, :]:
        ax.set_xlabel("key (the token attended to)" + (f", labelled every {step} tokens" if step > 1 else ""))
    fig.colorbar(im, ax=axes, shrink=0.8 if nrows == 1 else 0.6, label="attention weight")
    text = "".join(ins.tokens)
    fig.suptitle(f"{text[:60]!r}{'…' if len(text) > 60 else ''}  ({T} token{'s' if T > 1 else ''})", fontsize=font + 3)
    return save_figure(fig, out_path, kind="attention", force=force, dpi=120, bbox_inches="tight")
