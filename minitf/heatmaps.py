"""Attention heatmaps from an Inspection (minitf.inspection): one head, or every head of a layer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .inspection import Inspection, check_layer_head, token_label
from .plotting import new_figure, save_figure


def plot_attention(ins: Inspection, out_path, layer: int = 0, head: int | None = None) -> Path:
    """Heatmap of one head's attention weights, or a grid of every head of `layer` when head is None.

    Rows are queries, columns the keys they attend to; the grey triangle is what the causal mask
    hides. Panels grow with the text up to a cap; past that (about 45 tokens in a grid, 64 for one
    head) every n-th token is labelled, so labels never overlap.
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
    return save_figure(fig, out_path, dpi=120, bbox_inches="tight")
