"""Batches of conversations for supervised fine-tuning: `ChatData.get_batch` takes batch_size random
conversations of a split and returns x (B, T) and y, the same ids shifted left by one, where every
target training does not learn (the system and user turns, the template's markers) is -100, which
the loss skips.

Packing: each row holds one conversation from its first token, cut at block_size + 1 tokens and
padded after its end, and T is the longest row of the batch. A row's tokens therefore attend only
to tokens of their own conversation (the causal mask keeps the padding after them out of sight),
so no answer's loss reads another conversation, and attention keeps its one fast causal kernel.
Packing several conversations into a row would waste less compute on padding but needs a
block-diagonal mask, which the flash kernels do not take.

The ids come from the chat token cache that conversations/cache.py builds once (<split>.bin, .mask,
.idx and meta.json), checked on opening as text caches are. With data.val_fraction=0 nothing is
held out, and the val split reads the training conversations (said when the cache opens).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..data import IGNORE, SPLITS, CacheError, to_device
from ..errors import MinitfError
from ..tokenizer import Tokenizer

# per conversation in <split>.idx: first token, tokens, the longest stretch without an answer or
# of one answer (what must fit in block_size), and where it came from (meta.json's files, line)
INDEX = np.dtype([("start", "<i8"), ("length", "<i8"), ("longest", "<i8"), ("file", "<i8"), ("line", "<i8")])
QUESTIONS = "questions.jsonl"  # held-out conversations up to their last question, and its right answer
PROMPTS = "prompts.jsonl"  # the same of the training conversations: what reinforcement learning answers


class ChatData:
    """The chat token cache of one conversation corpus."""

    def __init__(self, path: str | Path, tokenizer: Tokenizer | None = None, log=print, skip_long: bool = False):
        self.path, self.log, self.skip_long = Path(path), log, skip_long
        self.meta: dict = _read_meta(self.path)
        self.tokenizer = tokenizer or Tokenizer.load(self.path / "tokenizer.json")
        if self.tokenizer.vocab_size != self.meta["vocab_size"]:
            raise CacheError(self.path, f"its ids are for a vocabulary of {self.meta['vocab_size']}")
        held = self.meta["splits"]["val"]["conversations"] > 0
        self.files = {"train": "train", "val": "val" if held else "train"}  # each split's files
        self.index = {s: np.fromfile(self.path / f"{s}.idx", INDEX) for s in set(self.files.values())}
        if not held:
            log("data: data.val_fraction=0: nothing is held out, so the val numbers are the training conversations'")
        self.questions = [q for q in _read_questions(self.path / QUESTIONS) if q["answer"] is not None]
        self.prompts = _read_questions(self.path / PROMPTS)  # RL's: "answer" None where a line gives none

    def bytes_per_token(self, split: str) -> float:
        """UTF-8 bytes of the answers per learned token (bits per byte are of the answers)."""
        counts = self.meta["splits"][self.files[split]]
        return counts["bytes"] / max(counts["learned"], 1)

    def batch_words(self, rows: int, block_size: int) -> str:
        """A step's batch in words: a batch is as long as its longest conversation, not block_size."""
        return f"{rows} conversations of up to {block_size} tokens"

    def check_fits(self, block_size: int) -> None:
        """Every turn fits in block_size (else it is an error naming its file and line); the
        conversations longer than block_size + 1 are counted and said: their tail is not learned."""
        for split in self.index:
            index = self.index[split]
            over = np.flatnonzero(index["longest"] > block_size)
            if len(over) and self.skip_long and len(over) < len(index):  # data.skip_invalid
                self.log(
                    f"data: skipping {len(over):,} {split} conversation(s) with a turn longer than "
                    f"block_size={block_size} (first at {self.origin(index[over[0]])})"
                )
                self.index[split] = index = np.delete(index, over)
            elif len(over):
                row = index[over[0]]
                more = f" ({len(over) - 1} more in {split})" if len(over) > 1 else ""
                raise MinitfError(
                    f"{self.origin(row)}: a turn of {int(row['longest'])} tokens is longer than "
                    f"model.block_size={block_size}{more}; shorten it, or set data.skip_invalid=true to skip such ones"
                )
            cut = int((index["length"] > block_size + 1).sum())
            if cut:
                self.log(
                    f"data: {cut:,} of {len(index):,} {split} conversations are longer than block_size+1="
                    f"{block_size + 1} tokens; their tokens after that are not learned"
                )

    def origin(self, row) -> str:
        name = self.meta["files"][int(row["file"])]
        return f"{name} row {int(row['line'])}" if name.startswith("hf:") else f"{name}:{int(row['line'])}"

    def get_batch(
        self,
        split: str,
        batch_size: int,
        block_size: int,
        generator: torch.Generator,
        device: str | torch.device = "cpu",
        policy=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """batch_size random conversations: x (B, T) and y (B, T), T <= block_size, int64. policy
        (the model being trained) is for data that samples from it (rl/rollouts.py), not read here."""
        split = self.files[split]
        index = self.index[split]
        picks = torch.randint(len(index), (batch_size,), generator=generator, device=generator.device).tolist()
        rows = [index[i] for i in picks]
        width = min(block_size + 1, max(int(r["length"]) for r in rows))  # the longest row, cut
        xy = np.full((batch_size, width), self.tokenizer.eot_id, np.int64)  # (B, T+1) padded with a real id
        learned = np.zeros((batch_size, width), bool)  # (B, T+1)
        dtype = np.dtype(self.meta["dtype"])
        for b, row in enumerate(rows):
            n, start = min(int(row["length"]), width), int(row["start"])
            xy[b, :n] = np.fromfile(self.path / f"{split}.bin", dtype, count=n, offset=start * dtype.itemsize)
            learned[b, :n] = np.fromfile(self.path / f"{split}.mask", np.uint8, count=n, offset=start)
        if int(xy.max()) >= self.meta["vocab_size"]:
            raise CacheError(self.path, f"{split}.bin holds id {int(xy.max())}, outside the vocabulary")
        x = torch.from_numpy(xy[:, :-1].copy())  # (B, T)
        y = torch.from_numpy(np.where(learned[:, 1:], xy[:, 1:], IGNORE))  # (B, T): only answers count
        return to_device(x, y, device)


def _read_questions(path: Path) -> list[dict]:
    """questions.jsonl or prompts.jsonl: [{"messages": a conversation up to its question, "answer": text or None}]."""
    try:
        questions = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if not all(isinstance(q["messages"], list) and isinstance(q["answer"], (str, type(None))) for q in questions):
            raise ValueError("a question without messages or answer")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CacheError(path.parent, f"{path.name}: {type(e).__name__}: {e}") from None
    return questions


def _read_meta(path: Path) -> dict:
    """meta.json, checked against the sizes of the files beside it."""
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        itemsize = np.dtype(meta["dtype"]).itemsize
        splits = {s: (int(meta["splits"][s]["tokens"]), int(meta["splits"][s]["conversations"])) for s in SPLITS}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CacheError(path, f"meta.json: {type(e).__name__}: {e}") from None
    for s, (tokens, conversations) in splits.items():
        for ext, want in ((".bin", tokens * itemsize), (".mask", tokens), (".idx", conversations * INDEX.itemsize)):
            f = path / f"{s}{ext}"
            size = f.stat().st_size if f.is_file() else None
            if size != want:
                raise CacheError(path, f"{s}{ext} holds {size} bytes where meta.json says {want}")
    return meta
