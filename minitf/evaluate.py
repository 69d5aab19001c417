"""Held-out loss, during training and on a whole corpus.

How well a model predicts text it was not trained on: during training on a few fixed batches
(`evaluate`, with the metric a recipe adds), and after it on a whole corpus (`evaluate_text`,
scripts/evaluate.py)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .config import Config, DataConfig
from .corpus.prepare import prepare_data
from .data import TokenData, bits_per_byte
from .errors import ConfigError
from .fast.lm_loss import IGNORE
from .system.progress import progress_bar
from .system.runtime import eval_mode


@torch.no_grad()
def evaluate(model, data, cfg: Config, device, autocast, metric=None) -> dict:
    """Mean loss over eval_batches fixed batches per split (the same batches at every eval), in
    eval mode; the caller's mode comes back after. The loss is over the learned targets (those
    not IGNORE: every token of text, the answers of conversations), each batch weighed by how
    many it holds. metric, a recipe's (train.eval_metric), adds its numbers under "metric"."""
    out = {}
    with eval_mode(model):
        for split in ("train", "val"):
            g = torch.Generator().manual_seed(cfg.run.seed + 999)
            losses, counts = [], []
            for _ in range(cfg.train.eval_batches):
                x, y = data.get_batch(split, cfg.train.batch_size, cfg.model.block_size, g, device)
                with autocast:
                    losses.append(model(x, y, logits=False)[1].item())  # the loss alone: no whole logits
                counts.append(int((y != IGNORE).sum()))
            out[split] = sum(loss * n for loss, n in zip(losses, counts)) / max(sum(counts), 1)
        if metric is not None:
            with autocast:
                out["metric"] = metric.compute(model, data, cfg)
    out["val_bpb"] = bits_per_byte(out["val"], data.bytes_per_token("val"))
    return out


@torch.no_grad()
def evaluate_text(
    model, tokenizer, data_cfg: DataConfig, batch_size: int = 8, log=print, splits=("train", "val")
) -> dict:
    """Loss, perplexity and bits per byte of `model` on a whole corpus, every token predicted once.

    The text goes through the token cache with the model's own tokenizer (prepare_data: bounded
    memory, cached for the next time), then each split is read from disk in batches of
    non-overlapping block_size windows, so a corpus bigger than memory is fine. Returns
    {"train": {...}, "val": {...}, "all": {...}}, each with loss (nats/token), perplexity,
    bits_per_byte and tokens; with the run's own data settings "val" is its held-out split.
    splits=("val",) reads the held-out split alone (and "all" is then the same).
    """
    check_batch_size(batch_size)
    data = prepare_data(data_cfg, tokenizer, log=log)
    device = next(model.parameters()).device
    with eval_mode(model):
        sums = {split: _nats_and_tokens(model, data, split, batch_size, device) for split in splits}
    sums["all"] = tuple(map(sum, zip(*(sums[s] for s in splits))))
    out = {}
    for name, (nats, predicted) in sums.items():
        parts = splits if name == "all" else (name,)
        nbytes = sum(data.meta["splits"][s]["bytes"] for s in parts)
        tokens = sum(data.meta["splits"][s]["tokens"] for s in parts)
        loss = nats / predicted
        out[name] = {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "tokens": predicted,
            "bits_per_byte": bits_per_byte(loss, nbytes / tokens),
        }
    return out


def check_batch_size(batch_size, what: str = "batch_size") -> None:
    """An evaluation's windows per forward pass: a whole number of at least 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"{what} must be a whole number of at least 1 (windows per forward pass), got {batch_size!r}")


def _nats_and_tokens(model, data: TokenData, split: str, batch_size: int, device) -> tuple[float, int]:
    """Summed cross-entropy over every predicted token of a split, and their count."""
    block = model.config.block_size
    dtype = np.dtype(data.meta["dtype"])
    path = data.path / f"{split}.bin"
    n = path.stat().st_size // dtype.itemsize
    starts = list(range(0, n - 1, block))  # window i predicts tokens start+1 .. start+block
    nats_sum, predicted = 0.0, 0
    batches = range(0, len(starts), batch_size)
    # a bar on a terminal, a line every few seconds in a log (never a line of carriage returns)
    with progress_bar(len(batches), f"evaluating {split}", unit="batch", leave=False) as bar:
        for first in batches:
            nats, count = _batch_nats(model, path, dtype, n, block, starts[first : first + batch_size], device)
            nats_sum, predicted = nats_sum + nats, predicted + count
            bar.update(1)
    return nats_sum, predicted


def _batch_nats(model, path, dtype, n: int, block: int, starts: list[int], device) -> tuple[float, int]:
    """Summed cross-entropy and count of the tokens predicted by the windows at `starts`."""
    nats, predicted = 0.0, 0
    rows = []
    for start in starts:  # plain reads: the split is never mapped whole
        rows.append(np.fromfile(path, dtype=dtype, count=min(block + 1, n - start), offset=start * dtype.itemsize))
    same = all(len(r) == len(rows[0]) for r in rows)  # only a split's last window can be shorter
    for group in [rows] if same else [[r] for r in rows]:
        xy = torch.from_numpy(np.stack(group).astype(np.int64)).to(device)  # (B, T+1)
        logits, _ = model(xy[:, :-1])  # (B, T, V)
        nats += F.cross_entropy(logits.flatten(0, 1).float(), xy[:, 1:].flatten(), reduction="sum").item()
        predicted += xy[:, 1:].numel()
    return nats, predicted
