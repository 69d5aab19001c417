"""The training loop's batches: random windows of token ids, and the same ids shifted by one.

`TokenData.get_batch` takes batch_size random windows of
block_size + 1 token ids from a split and returns x (B, T) and y, the same ids shifted left by one:
at every position, the next token is the target.

The ids come from the token cache that corpus/prepare.py builds once per corpus and tokenizer: each
split (train, val) as one flat .bin file of token ids with <|endoftext|> between documents, and
meta.json. A cache is checked when opened (meta.json readable, each .bin as long as meta.json says,
the tokenizer's vocabulary the one the ids were made with), which costs a few stat calls, not a
read of the ids. Each batch is checked to hold only ids of the vocabulary, so damage of the same
size surfaces as one clear error, not an IndexError.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from .errors import MinitfError
from .tokenizer import Tokenizer

SPLITS = ("train", "val")  # a token cache's two splits: the tokens trained on, and the held-out ones
IGNORE = -100  # a target the loss skips (PyTorch's ignore_index): a chat's context tokens (conversations/data.py)


class TokenData:
    """The token cache of one corpus: train.bin / val.bin + meta.json + tokenizer.json."""

    def __init__(self, path: str | Path, tokenizer: Tokenizer | None = None):
        self.path = Path(path)
        self.meta: dict = _read_meta(self.path)
        self.tokenizer = tokenizer or Tokenizer.load(self.path / "tokenizer.json")
        if self.tokenizer.vocab_size != self.meta["vocab_size"]:
            raise CacheError(
                self.path,
                f"its ids are for a vocabulary of {self.meta['vocab_size']}, the "
                f"tokenizer has {self.tokenizer.vocab_size}",
            )

    def tokens(self, split: str) -> np.memmap:
        """A read-only memmap of a split's token ids."""
        return np.memmap(self._bin(split), dtype=self.meta["dtype"], mode="r")

    def bytes_per_token(self, split: str) -> float:
        return self.meta["splits"][split]["bytes"] / self.meta["splits"][split]["tokens"]

    def batch_words(self, rows: int, block_size: int) -> str:
        """A step's batch in words, for the start-up line: every row is block_size tokens."""
        return f"{rows} sequences of {block_size} = {rows * block_size:,} tokens"

    def check_fits(self, block_size: int) -> None:
        """Each split holds one window of block_size + 1 tokens at least, what a batch needs: checked
        before training starts, not at its first evaluation (a tiny data.val_fraction)."""
        for split in SPLITS:
            _check_window(split, self._bin(split).stat().st_size // np.dtype(self.meta["dtype"]).itemsize, block_size)

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator,
        device: str | torch.device = "cpu",
        policy=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """batch_size random windows of the split: x (B, T) and y = x shifted left by one, int64.
        (policy, the model being trained, is for data that samples from it: rl/rollouts.py.)"""
        dtype = np.dtype(self.meta["dtype"])
        # Plain reads, not a memmap: pages read through a long-lived map count as this process's
        # memory, so a big split would creep into RAM over a long run (a fresh map per batch, as
        # nanoGPT does, avoids that too but spends far more time in page faults).
        with open(self._bin(split), "rb", buffering=0) as f:
            n = os.fstat(f.fileno()).st_size // dtype.itemsize
            _check_window(split, n, block_size)
            ix = torch.randint(n - block_size, (batch_size,), generator=generator, device=generator.device)
            windows = []
            for i in ix.tolist():
                f.seek(i * dtype.itemsize)
                windows.append(f.read((block_size + 1) * dtype.itemsize))
        xy = np.frombuffer(b"".join(windows), dtype).reshape(batch_size, block_size + 1)
        if xy.size and int(xy.max()) >= self.meta["vocab_size"]:  # a few µs; an IndexError later costs a run
            raise CacheError(
                self.path, f"{split}.bin holds id {int(xy.max())}, outside the vocabulary of {self.meta['vocab_size']}"
            )
        xy = torch.from_numpy(xy.astype(np.int64))  # (B, T+1)
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()  # (B, T) each
        return to_device(x, y, device)

    def _bin(self, split: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return self.path / f"{split}.bin"


def to_device(x: torch.Tensor, y: torch.Tensor, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch moved to where the model is; to a GPU from pinned pages, so the copy overlaps with compute."""
    device = torch.device(device)
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """Loss in nats per token -> bits per UTF-8 byte, which compares across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class CacheError(MinitfError):
    """A token cache directory that is damaged: unreadable meta.json, a .bin of the wrong size."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"the token cache {path} is damaged ({why}); delete it and run again to rebuild it")
        self.path, self.why = path, why


def _check_window(split: str, n: int, block_size: int) -> None:
    if n < block_size + 1:
        raise MinitfError(
            f"the {split} split has only {n} tokens, fewer than block_size+1={block_size + 1}; use a bigger "
            f"corpus, a smaller model.block_size or a larger data.val_fraction"
        )


def _read_meta(path: Path) -> dict:
    """meta.json, checked against the sizes of the .bin files beside it."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        itemsize, vocab = np.dtype(meta["dtype"]).itemsize, int(meta["vocab_size"])
        tokens = {s: int(meta["splits"][s]["tokens"]) for s in SPLITS}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CacheError(path, f"meta.json: {type(e).__name__}: {e}") from None
    for s, n in tokens.items():
        size = (path / f"{s}.bin").stat().st_size if (path / f"{s}.bin").is_file() else None
        if size != n * itemsize or vocab < 1:
            raise CacheError(path, f"{s}.bin holds {size} bytes where meta.json says {n:,} tokens of {itemsize}")
    return meta
