"""Corpus -> train/val split -> tokenizer -> token cache on disk -> random (B, T) batches.

prepare_data() loads a corpus through HF `datasets`, trains a tokenizer on its train part (unless
one is given), tokenizes it once and stores each split as one flat .bin file of token ids
with <|endoftext|> between documents. TokenData.get_batch() samples windows from those files.

The sources and the split rule are in corpus.py. Empty documents are dropped; an empty split is
an error. Byte counts are of the text as loaded (datasets reads \\r\\n as \\n).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .config import DataConfig, MinitfError
from .corpus import Source, cache_dir
from .io import atomic_write
from .tokenizer import Tokenizer

SPLITS = ("train", "val")
FORMAT = 1  # bump when the cache layout or the split rule changes, so old caches rebuild
TOKENIZER_TRAIN_CHARS = 200_000_000  # BPE merges settle long before this; more costs minutes and GBs
_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])")  # 'x\nY': the GPT-2 pre-tokenizer splits here anyway


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """Loss in nats per token -> bits per UTF-8 byte, which compares across tokenizers."""
    return loss_nats_per_token / math.log(2) / bytes_per_token


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class TokenData:
    """The token cache of one corpus: train.bin / val.bin memmaps + meta.json + tokenizer.json."""

    def __init__(self, path: str | Path, tokenizer: Tokenizer | None = None):
        self.path = Path(path)
        self.meta: dict = json.loads((self.path / "meta.json").read_text())
        self.tokenizer = tokenizer or Tokenizer.load(self.path / "tokenizer.json")

    def tokens(self, split: str) -> np.memmap:
        """A read-only memmap of a split's token ids."""
        return np.memmap(self._bin(split), dtype=self.meta["dtype"], mode="r")

    def bytes_per_token(self, split: str) -> float:
        return self.meta["splits"][split]["bytes"] / self.meta["splits"][split]["tokens"]

    def get_batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
                  device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """batch_size random windows of the split: x (B, T) and y = x shifted left by one, int64."""
        dtype = np.dtype(self.meta["dtype"])
        # Plain reads, not a memmap: pages read through a long-lived map count as this process's
        # memory, so a big split would creep into RAM over a long run (a fresh map per batch, as
        # nanoGPT does, avoids that too but spends far more time in page faults).
        with open(self._bin(split), "rb", buffering=0) as f:
            n = os.fstat(f.fileno()).st_size // dtype.itemsize
            if n < block_size + 1:
                raise MinitfError(f"the {split} split has only {n} tokens, fewer than block_size+1="
                                  f"{block_size + 1}; use a bigger corpus, a smaller model.block_size or a "
                                  f"larger data.val_fraction")
            ix = torch.randint(n - block_size, (batch_size,), generator=generator, device=generator.device)
            windows = []
            for i in ix.tolist():
                f.seek(i * dtype.itemsize)
                windows.append(f.read((block_size + 1) * dtype.itemsize))
        xy = np.frombuffer(b"".join(windows), dtype).reshape(batch_size, block_size + 1)
        xy = torch.from_numpy(xy.astype(np.int64))  # (B, T+1)
        x, y = xy[:, :-1].contiguous(), xy[:, 1:].contiguous()  # (B, T) each
        device = torch.device(device)
        if device.type == "cuda":  # pinned pages let the copy overlap with compute
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def _bin(self, split: str) -> Path:
        if split not in SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return self.path / f"{split}.bin"


def prepare_data(cfg: DataConfig, tokenizer: Tokenizer | None = None,
                 log: Callable[[str], None] = print) -> TokenData:
    """Build, or reuse, the token cache of cfg.source under cache_dir()/tokens/<key>/.

    The key covers the source's fingerprint, the tokenizer and the split settings. Without a
    tokenizer one is trained on the train split (vocab cfg.vocab_size), and cached too.
    """
    source = Source(cfg)
    settings = {"format": FORMAT, "source": cfg.source, "fingerprint": source.fingerprint,
                "val_fraction": cfg.val_fraction, "max_documents": cfg.max_documents,
                "text_field": cfg.text_field}
    tok_file = cache_dir() / "tokenizers" / f"{_digest(settings, vocab_size=cfg.vocab_size)}.json"
    if tokenizer is None and tok_file.is_file():
        tokenizer = Tokenizer.load(tok_file)
    out = _tokens_dir(settings, tokenizer) if tokenizer else None
    if out and (out / "meta.json").is_file():
        log(f"data: reusing the token cache {out}")
        return TokenData(out, tokenizer)
    with _quiet_datasets():
        ds, is_val = source.load(cfg, log)
        if tokenizer is None:
            t0, texts = time.perf_counter(), _TrainTexts(ds, is_val)
            tokenizer = Tokenizer.train(texts, cfg.vocab_size)
            log(f"data: trained a {tokenizer.vocab_size}-token BPE on {texts.chars / 1e6:.2f}M characters "
                f"in {time.perf_counter() - t0:.1f} s")
            tok_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(tok_file, lambda tmp: Path(tmp).write_text(tokenizer.to_json(), encoding="utf-8"))
            out = _tokens_dir(settings, tokenizer)
        if not (out / "meta.json").is_file():  # (it can be, if only the tokenizer file was deleted)
            _build(ds, is_val, tokenizer, out, settings, cfg.num_proc, log)
    return TokenData(out, tokenizer)


class _TrainTexts:
    """The train documents, in pieces, for Tokenizer.train; capped at TOKENIZER_TRAIN_CHARS."""

    def __init__(self, ds, is_val):
        self.ds, self.is_val, self.chars = ds, is_val, 0

    def __iter__(self):
        texts = (t for batch in self.ds.iter(batch_size=256) for t in batch["text"])
        for i, text in enumerate(texts):
            if self.chars >= TOKENIZER_TRAIN_CHARS:
                return
            if text and not self.is_val(i):
                text = text[: TOKENIZER_TRAIN_CHARS - self.chars]
                self.chars += len(text)
                yield from _pieces(text)


def _pieces(text: str, size: int = 1 << 16) -> list[str]:
    """Cut a long text where the pre-tokenizer splits anyway, so the pieces encode to exactly the
    ids of the whole, and one long document still spreads over all the tokenizer's threads."""
    out, start = [], 0
    while len(text) - start > 2 * size and (m := _CUT.search(text, start + size)):
        out.append(text[start : m.start()])
        start = m.start()
    out.append(text[start:])
    return out


def _build(ds, is_val, tok: Tokenizer, out: Path, settings: dict, num_proc: int | None, log) -> None:
    """Tokenize every document once and write the cache directory atomically (temp dir + rename)."""
    t0, dtype = time.perf_counter(), token_dtype(tok.vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        rows = _tokenize(ds, tok, dtype, tmp / "ids.arrow", num_proc)
        splits = _write_splits(rows, is_val, np.array([tok.eot_id], dtype).tobytes(), dtype.itemsize, tmp)
        seconds = time.perf_counter() - t0
        meta = {**settings, "tokenizer_hash": tok.hash, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id,
                "dtype": dtype.name, "splits": splits, "tokenize_seconds": round(seconds, 2)}
        for p in tmp.glob("ids*.arrow"):
            p.unlink()
        tok.save(tmp / "tokenizer.json")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, out)
        except OSError:  # another process built the same cache first: keep theirs
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tr, va = splits["train"], splits["val"]
    log(f"data: tokenized {(tr['bytes'] + va['bytes']) / 1e6:.2f} MB in {seconds:.1f} s: train "
        f"{tr['tokens']:,} tokens / {tr['documents']} documents, val {va['tokens']:,} / {va['documents']}")


def _tokenize(ds, tok: Tokenizer, dtype: np.dtype, scratch: Path, num_proc: int | None) -> Iterator:
    """(token ids as bytes, UTF-8 byte count) of each document in order, by a batched datasets.map."""
    import datasets

    def encode(batch: dict) -> dict:
        texts = [t or "" for t in batch["text"]]
        pieces = [_pieces(t) for t in texts]
        flat = iter(tok.encode_batch([p for ps in pieces for p in ps]))
        ids = [b"".join(np.asarray(next(flat), dtype).tobytes() for _ in ps) for ps in pieces]
        return {"ids": ids, "bytes": [len(t.encode("utf-8")) for t in texts]}

    if isinstance(ds, datasets.Dataset):
        # processes pay off only for big corpora: encode_batch already runs a thread per core
        nproc = min(num_proc or os.cpu_count() or 1, max(1, len(ds) // 1000))
        with _env("TOKENIZERS_PARALLELISM", "false" if nproc > 1 else None):
            ds = ds.map(encode, batched=True, num_proc=nproc if nproc > 1 else None, remove_columns=["text"],
                        cache_file_name=str(scratch), new_fingerprint=_digest({"scratch": str(scratch)}))
    else:  # streamed: encoded lazily, as the rows are read
        ds = ds.map(encode, batched=True, remove_columns=["text"])
    return (row for batch in ds.iter(batch_size=1000) for row in zip(batch["ids"], batch["bytes"]))


def _write_splits(rows: Iterator, is_val, eot: bytes, itemsize: int, tmp: Path) -> dict:
    """Append each document to its split's .bin, <|endoftext|> between documents; count them."""
    splits = {s: {"tokens": 0, "bytes": 0, "documents": 0} for s in SPLITS}
    with open(tmp / "train.bin", "wb") as train, open(tmp / "val.bin", "wb") as val:
        for i, (ids, nbytes) in enumerate(rows):
            s, f = (splits["val"], val) if is_val(i) else (splits["train"], train)
            if not ids:
                continue  # an empty document
            if s["documents"]:
                f.write(eot)
                s["tokens"] += 1
            f.write(ids)
            s["tokens"] += len(ids) // itemsize
            s["bytes"] += nbytes
            s["documents"] += 1
    for name, s in splits.items():
        if not s["tokens"]:
            raise MinitfError(f"the {name} split came out empty ({splits['train']['documents']} non-empty "
                              f"train documents); add text or documents, or change data.val_fraction")
    return splits


def _digest(settings: dict, **extra) -> str:
    return hashlib.sha256(json.dumps({**settings, **extra}, sort_keys=True).encode()).hexdigest()[:20]


def _tokens_dir(settings: dict, tok: Tokenizer) -> Path:
    return cache_dir() / "tokens" / _digest(settings, tokenizer=tok.hash)


@contextlib.contextmanager
def _quiet_datasets():
    """No progress bars while preparing (the log says what happens), then as they were."""
    import datasets

    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """Set an environment variable for a block, unless it is None or the user has set it."""
    mine = value is not None and name not in os.environ
    if mine:
        os.environ[name] = value
    try:
        yield
    finally:
        if mine:
            del os.environ[name]
