"""A corpus -> train/val split -> tokenizer -> token cache on disk (`prepare_data`), once.

prepare_data() reads a corpus as a stream of documents, trains a tokenizer on its train part
(unless one is given), tokenizes it once with bounded memory (token_cache.py) and stores each split
as one flat .bin file of token ids with <|endoftext|> between documents, which data.TokenData
samples batches from. The sources and the split rule are in sources.py. Empty documents are
dropped; an empty split is an error. Byte counts are of the text as read (\\r\\n read as \\n).
A damaged cache (data.CacheError) is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..config import DataConfig
from ..data import CacheError, TokenData, token_dtype
from ..errors import MinitfError
from ..system.runtime import give_back_freed_memory
from ..tokenizer import Tokenizer
from .sources import Documents, Source, cache_dir
from .token_cache import (
    TASK_CHARS,
    build_splits,
    cache_build,
    pieces,
    progress,
    write_error,
)

FORMAT = 1  # bump when the cache layout or the split rule changes, so old caches rebuild
FILES = "files.json"  # in a token cache: {file as listed: sha256} of the corpus it was built from
# BPE merges settle long before this (on a generated corpus, 100M characters compress held-out text
# as well as 200M, within 0.03 %); BPE memory grows with it (0.80 GB peak at 100M, 1.03 GB at 200M)
TOKENIZER_TRAIN_CHARS = 100_000_000


def prepare_data(cfg: DataConfig, tokenizer: Tokenizer | None = None, log: Callable[[str], None] = print) -> TokenData:
    """Build, or reuse, the token cache of cfg.source under cache_dir()/tokens/<key>/.

    The key covers the source's fingerprint (its files' names and content), the tokenizer and the
    split settings. Without a tokenizer one is trained on the train split (vocab cfg.vocab_size),
    and cached too. A file that changes while it is read is refused (corpus.read_blocks).
    """
    source = Source(cfg, log)
    settings = _settings(cfg, source.fingerprint)
    tok_file = cache_dir() / "tokenizers" / f"{_digest(settings, vocab_size=cfg.vocab_size)}.json"
    if tokenizer is None and tok_file.is_file():
        with contextlib.suppress(MinitfError):  # an unreadable one is trained again
            tokenizer = Tokenizer.load(tok_file)
    out = _tokens_dir(settings, tokenizer) if tokenizer else None
    if out and (out / "meta.json").is_file():
        try:
            data = TokenData(out, tokenizer)
            log(f"data: reusing the token cache {out}")
            return data
        except CacheError as e:
            log(f"data: the token cache {out} is damaged ({e.why}); building it again")
            shutil.rmtree(out, ignore_errors=True)
    with _quiet_datasets() if source.kind == "hf" else contextlib.nullcontext():
        docs = source.load(cfg, log)
        if tokenizer is None:
            tokenizer = _train_tokenizer(docs, cfg.vocab_size, tok_file, log)
            out = _tokens_dir(settings, tokenizer)
        if not (out / "meta.json").is_file():  # (it can be, if only the tokenizer file was deleted)
            _build(docs, tokenizer, out, settings, _num_proc(cfg.num_proc, docs.nbytes), log, source.hashes)
    return TokenData(out, tokenizer)


def check_corpus_unchanged(cfg: DataConfig, state_file: Path) -> None:
    """For --resume: refuse a corpus whose fingerprint is not the one the run's checkpoint
    recorded (state.pt's "data"), in one line naming the files that changed when the token cache
    the run was trained on is still there to compare with. Checkpoints that record no corpus,
    or cannot be read (loading the checkpoint reports that), are not checked."""
    try:  # mmap: only the small entries are read, not the weights
        state = torch.load(state_file, map_location="cpu", weights_only=True, mmap=True)
        trained_on, tokenizer_hash = state.get("data"), state.get("tokenizer")
    except Exception:
        return
    if trained_on is None:
        return
    source = Source(cfg)
    if source.fingerprint == trained_on:
        return
    what = "its files' content differs"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        old_dir = cache_dir() / "tokens" / _digest(_settings(cfg, trained_on), tokenizer=tokenizer_hash)
        old = json.loads((old_dir / FILES).read_text(encoding="utf-8"))
        new = {str(f): h for f, h in source.hashes.items()}
        changes = [f"{f} edited" for f in new if f in old and old[f] != new[f]]
        changes += [f"{f} added" for f in new if f not in old] + [f"{f} removed" for f in old if f not in new]
        if changes:
            what = ", ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
    raise MinitfError(
        f"--resume: the corpus data.source={cfg.source} changed since this run was trained on it ({what}); "
        f"put the original text back, or start a new run.out_dir on the new text"
    )


def _settings(cfg: DataConfig, fingerprint: str) -> dict:
    """What a token cache depends on besides the tokenizer."""
    return {
        "format": FORMAT,
        "source": cfg.source,
        "fingerprint": fingerprint,
        "val_fraction": cfg.val_fraction,
        "max_documents": cfg.max_documents,
        "text_field": cfg.text_field,
    }


def _train_tokenizer(docs: Documents, vocab_size: int, tok_file: Path, log) -> Tokenizer:
    """A BPE trained on the train documents, at most TOKENIZER_TRAIN_CHARS characters of them."""
    t0, texts = time.perf_counter(), _TrainTexts(docs)
    with progress(min(docs.nbytes or TOKENIZER_TRAIN_CHARS, TOKENIZER_TRAIN_CHARS), "training BPE") as texts.bar:
        tokenizer = Tokenizer.train(texts, vocab_size)
    give_back_freed_memory()
    log(
        f"data: trained a {tokenizer.vocab_size}-token BPE on {texts.chars / 1e6:.2f}M characters "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    tok_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = tok_file.with_name(f".{tok_file.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(tokenizer.to_json(), encoding="utf-8")
        os.replace(tmp, tok_file)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(tok_file, e) from None
    return tokenizer


class _TrainTexts:
    """The train documents, in pieces, for Tokenizer.train; capped at TOKENIZER_TRAIN_CHARS."""

    def __init__(self, docs: Documents):
        self.docs, self.chars, self.bar = docs, 0, None

    def __iter__(self):
        for i, doc in enumerate(self.docs.docs()):
            if self.chars >= TOKENIZER_TRAIN_CHARS:
                return
            if not self.docs.is_val(i):
                yield from pieces(self._capped(doc))

    def _capped(self, blocks):
        for block in blocks:
            block = block[: TOKENIZER_TRAIN_CHARS - self.chars]
            self.chars += len(block)
            if self.bar is not None:
                self.bar.update(len(block))
            if not block:
                return
            yield block


def _num_proc(asked: int | None, nbytes: int | None) -> int:
    """Worker processes for tokenizing: as asked, else one per core but no more than there are
    tasks. Processes also spread the Python work around each encode over the cores, where the
    tokenizer's own threads share one interpreter (docs/performance.md has the measured comparison)."""
    if asked:
        return asked
    tasks = math.ceil(nbytes / TASK_CHARS) if nbytes is not None else 1 << 30
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, tasks))


def _build(
    docs: Documents, tok: Tokenizer, out: Path, settings: dict, num_proc: int, log, hashes: dict[Path, str]
) -> None:
    """Tokenize every document once and write the cache directory atomically (temp dir + rename);
    FILES in it lists the sha256 of each file read, so a refused resume can name what changed."""
    with cache_build(out) as tmp:
        dtype = token_dtype(tok.vocab_size)
        splits = build_splits(docs, tok, tmp, dtype, num_proc, docs.nbytes)
        seconds = splits.pop("seconds")
        meta = {
            **settings,
            "tokenizer_hash": tok.hash,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "dtype": dtype.name,
            "splits": splits,
            "tokenize_seconds": round(seconds, 2),
        }
        tok.save(tmp / "tokenizer.json")
        (tmp / FILES).write_text(json.dumps({str(f): h for f, h in hashes.items()}, indent=0), encoding="utf-8")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    give_back_freed_memory()
    tr, va = splits["train"], splits["val"]
    log(
        f"data: tokenized {(tr['bytes'] + va['bytes']) / 1e6:.2f} MB in {seconds:.1f} s: train "
        f"{tr['tokens']:,} tokens / {tr['documents']} documents, val {va['tokens']:,} / {va['documents']}"
    )


def _digest(settings: dict, **extra) -> str:
    return hashlib.sha256(json.dumps({**settings, **extra}, sort_keys=True).encode()).hexdigest()[:20]


def _tokens_dir(settings: dict, tok: Tokenizer) -> Path:
    return cache_dir() / "tokens" / _digest(settings, tokenizer=tok.hash)


@contextlib.contextmanager
def _quiet_datasets():
    """No datasets progress bars while preparing (ours and the log say what happens), then as they were."""
    import datasets

    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()
