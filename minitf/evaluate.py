"""Held-out loss: how well a model predicts text it was not trained on."""
from __future__ import annotations

import torch

from .config import Config
from .data import TokenData, bits_per_byte


@torch.no_grad()
def evaluate(model, data: TokenData, cfg: Config, device, autocast) -> dict:
    """Mean loss over eval_batches fixed batches per split (the same batches at every eval)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(cfg.run.seed + 999)
        losses = []
        for _ in range(cfg.train.eval_batches):
            x, y = data.get_batch(split, cfg.train.batch_size, cfg.model.block_size, g, device)
            with autocast:
                losses.append(model(x, y)[1].item())
        out[split] = sum(losses) / len(losses)
    model.train()
    out["val_bpb"] = bits_per_byte(out["val"], data.bytes_per_token("val"))
    return out
