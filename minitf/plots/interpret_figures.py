"""Figures of minitf.interpret's numbers: head scores and head patching as layers x heads grids,
residual-stream patching as layers x positions, and a logit's direct attribution (the heads as a
grid, the other parts as bars), each number written out beside its colour.

Drawn as figures.py draws: on their own `Figure` with the Agg canvas, never through pyplot, and
matplotlib imported on use.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import MinitfError
from ..inspection import token_label
from ..interpret import Attribution
from .figures import new_figure, save_figure

SCORE_TITLES = {
    "previous_token": "previous-token score",
    "duplicate_token": "duplicate-token score",
    "induction": "induction score",
}


def _grid(ax, values: torch.Tensor, vmin: float, vmax: float, cmap: str, font: int):
    """One heatmap of values (rows, cols) with every cell's number on it; returns the image."""
    im = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
    rows, cols = values.shape
    if rows * cols <= 400:  # past that the numbers would not fit their cells
        mid = (vmin + vmax) / 2
        for i in range(rows):
            for j in range(cols):
                v = float(values[i, j])
                dark = v < mid if cmap == "viridis" else abs(v - mid) > 0.6 * (vmax - mid)
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=font, color="white" if dark else "black")
    return im


def _layers_heads(ax, values: torch.Tensor, font: int) -> None:
    L, H = values.shape
    ax.set_xticks(range(H), [str(h) for h in range(H)], fontsize=font)
    ax.set_yticks(range(L), [str(i) for i in range(L)], fontsize=font)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")


def plot_head_scores(scores: dict[str, torch.Tensor], out_path, title: str | None = None) -> Path:
    """One layers x heads panel per score (minitf.interpret.head_scores), on a 0..1 scale."""
    if not scores:
        raise MinitfError("no scores to draw; pass minitf.interpret.head_scores(model, ids)")
    L, H = next(iter(scores.values())).shape
    panel_w, panel_h = min(max(1.2 + 0.55 * H, 3.0), 9.0), min(max(1.0 + 0.45 * L, 2.4), 8.0)
    fig = new_figure(figsize=(len(scores) * panel_w + 1.0, panel_h + 0.8), layout="constrained")
    axes = fig.subplots(1, len(scores), squeeze=False)[0]
    font = 8 if H <= 12 else 6
    for ax, (name, values) in zip(axes, scores.items()):
        im = _grid(ax, values.float().cpu(), 0.0, 1.0, "viridis", font)
        ax.set_title(SCORE_TITLES.get(name, name), fontsize=10)
        _layers_heads(ax, values, font)
    fig.colorbar(im, ax=axes, shrink=0.9, label="share of the head's attention on the pattern")
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, out_path, dpi=120, bbox_inches="tight")


def plot_patching(recovered: torch.Tensor, tokens: list[str], out_path, title: str | None = None) -> Path:
    """Residual-stream patching (minitf.interpret.patch_residual), (n_layer + 1, T): a row per
    layer boundary, a column per token; blue recovers the clean answer (1), red pushes away from it."""
    rows, T = recovered.shape
    if len(tokens) != T:
        raise MinitfError(f"{len(tokens)} token labels for {T} positions; pass the prompt's tokens")
    fig = new_figure(
        figsize=(min(max(2.5 + 0.55 * T, 4.0), 16.0), min(max(1.2 + 0.4 * rows, 2.4), 10.0)), layout="constrained"
    )
    ax = fig.subplots()
    im = _grid(ax, recovered.float().cpu(), -1.0, 1.0, "RdBu", 7 if T <= 24 else 5)
    ax.set_xticks(range(T), [token_label(t, 10) for t in tokens], rotation=90, fontsize=8)
    ax.set_yticks(range(rows), ["embeddings"] + [f"after block {i}" for i in range(rows - 1)], fontsize=8)
    ax.set_xlabel("position patched (the clean prompt's token)")
    fig.colorbar(im, ax=ax, label="logit difference recovered (1 = clean, 0 = corrupted)")
    ax.set_title(title or "residual stream patched from the clean prompt", fontsize=10)
    return save_figure(fig, out_path, dpi=120, bbox_inches="tight")


def plot_head_patching(recovered: torch.Tensor, out_path, title: str | None = None) -> Path:
    """Head patching (minitf.interpret.patch_heads), (n_layer, n_head), on the same scale as plot_patching."""
    L, H = recovered.shape
    fig = new_figure(
        figsize=(min(max(2.2 + 0.55 * H, 3.5), 10.0), min(max(1.2 + 0.45 * L, 2.4), 8.0)), layout="constrained"
    )
    ax = fig.subplots()
    im = _grid(ax, recovered.float().cpu(), -1.0, 1.0, "RdBu", 8 if H <= 12 else 6)
    _layers_heads(ax, recovered, 8)
    fig.colorbar(im, ax=ax, label="logit difference recovered")
    ax.set_title(title or "head outputs patched from the clean prompt", fontsize=10)
    return save_figure(fig, out_path, dpi=120, bbox_inches="tight")


def plot_attribution(a: Attribution, out_path, token_label_text: str | None = None) -> Path:
    """A logit's direct attribution (minitf.interpret.attribute): each head's share as a layers x
    heads grid (red up, blue down), and beside it every other part and their sum, the logit."""
    L = a.heads.size(0)
    parts = [("token embedding", a.embedding), ("position vectors", a.positions)]
    for i in range(L):
        parts += [(f"layer {i} attention bias", float(a.attn_bias[i])), (f"layer {i} feed-forward", float(a.ffn[i]))]
    parts += [("all heads", float(a.heads.sum())), ("final norm bias", a.norm_bias), ("sum: the logit", a.total())]
    H = a.heads.size(1)
    fig = new_figure(figsize=(min(max(2.5 + 0.55 * H, 4.0), 10.0) + 4.5, min(max(1.5 + 0.45 * L, 3.0), 8.0)))
    grid_ax, bar_ax = fig.subplots(1, 2, width_ratios=[max(H, 3), 4])
    big = max(float(a.heads.abs().max()), 1e-9)
    im = _grid(grid_ax, a.heads.float().cpu(), -big, big, "RdBu_r", 8 if H <= 12 else 6)
    _layers_heads(grid_ax, a.heads, 8)
    grid_ax.set_title("each head's share")
    fig.colorbar(im, ax=grid_ax, shrink=0.8)
    names, values = [n for n, _ in parts], [v for _, v in parts]
    bar_ax.barh(range(len(parts)), values, color=["#b2182b" if v >= 0 else "#2166ac" for v in values])
    bar_ax.set_yticks(range(len(parts)), names, fontsize=8)
    bar_ax.invert_yaxis()  # the parts top-down, the sum last
    bar_ax.axvline(0.0, color="#57606a", linewidth=0.8)
    for i, v in enumerate(values):
        bar_ax.text(v, i, f" {v:+.3f} ", va="center", ha="left" if v >= 0 else "right", fontsize=7)
    bar_ax.set_title("the other parts, and the sum")
    what = f"{token_label_text!r}" if token_label_text else f"token {a.token}"
    if a.against is not None:
        what += f" minus token {a.against}"
    fig.suptitle(f"direct logit attribution of {what} at position {a.position}: logit {a.logit:+.3f}", fontsize=10)
    fig.set_layout_engine("constrained")
    return save_figure(fig, out_path, dpi=120, bbox_inches="tight")
