"""Tokenizing a corpus into a token cache directory with bounded memory.

Documents stream in as text blocks and are cut into pieces where the tokenizer's pre-tokenizer
splits anyway, so the pieces encode to exactly the ids of the whole text; pieces are grouped
into tasks of about TASK_CHARS characters; each task is encoded (by the tokenizer's threads in
this process, or by worker processes), and its ids are appended to train.bin / val.bin at once.
Nothing holds more than a few tasks of text and ids, whatever the size of the corpus.

The directory is built under a temporary name that carries this process's id and is renamed
into place when complete; a later build removes temporary directories whose process is gone
(killed, or out of memory), so an interrupted build leaves nothing behind. Worker processes are
asked to die with this process (Linux), so a killed build leaves no orphans.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from ..data import SPLITS
from ..errors import MinitfError
from ..system.progress import progress_bar
from ..system.runtime import libc
from ..tokenizer import Tokenizer

PIECE_CHARS = 1 << 16  # a long document is cut into pieces of about this many characters
TASK_CHARS = 1 << 20  # pieces are encoded this many characters at a time
# Cut 'x\nY' after the newline, and 'x Y' before the space (x, Y not whitespace): the GPT-2
# pre-tokenizer splits at both anyway, so cutting there changes no id. (Python's \s is a superset
# of the Unicode White_Space the tokenizer's regex uses, so \S here is never whitespace there.)
_CUT = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")
_STALE = re.compile(r"\.tmp-(\d+)-\w+")


def pieces(blocks: Iterable[str], size: int | None = None) -> Iterator[str]:
    """One document's text blocks -> pieces of about `size` characters (longer only where the text
    has no cut point) that join to the same text and encode to the same ids as the whole."""
    size = size or PIECE_CHARS
    buf, start, scan = "", 0, 0  # text not yet given out is buf[start:]; no cut point lies before scan
    for block in blocks:
        buf, scan, start = buf[start:] + block, scan - start, 0
        while len(buf) - start > 2 * size:
            m = _CUT.search(buf, max(start + size, scan))
            if not m:
                scan = len(buf)
                break
            yield buf[start : m.start()]
            start = m.start()
    if buf[start:]:
        yield buf[start:]


def tasks(docs: Iterable[Iterable[str]]) -> Iterator[list[tuple[int, str]]]:
    """Documents -> lists of (document index, piece) holding about TASK_CHARS characters each."""
    task, chars, task_chars = [], 0, TASK_CHARS
    for i, doc in enumerate(docs):
        for piece in pieces(doc):
            task.append((i, piece))
            chars += len(piece)
            if chars >= task_chars:
                yield task
                task, chars = [], 0
    if task:
        yield task


def encode_task(tok: Tokenizer, dtype: np.dtype, task: list[tuple[int, str]]) -> list[tuple[int, bytes, int]]:
    """A task's pieces -> (document index, ids as bytes, UTF-8 bytes of text) per run of one document."""
    ids = tok.encode_batch([p for _, p in task])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype, sum(map(len, ids)))
    out, at = [], 0
    for doc, run in itertools.groupby(zip(task, map(len, ids)), key=lambda r: r[0][0]):
        run = list(run)
        n = sum(length for _, length in run)
        nbytes = sum(len(p) if p.isascii() else len(p.encode("utf-8")) for (_, p), _ in run)
        out.append((doc, flat[at : at + n].tobytes(), nbytes))
        at += n
    return out


def encoded(tasks: Iterable, tok: Tokenizer, dtype: np.dtype, num_proc: int) -> Iterator[list]:
    """encode_task over tasks, in order: here (the tokenizer's own threads) when num_proc is 1,
    else in num_proc worker processes with at most two tasks each in flight."""
    if num_proc <= 1:
        yield from (encode_task(tok, dtype, t) for t in tasks)
        return
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with _env("TOKENIZERS_PARALLELISM", "false"):
        pool = ctx.Pool(num_proc, _worker_start, (tok.to_json(), dtype.str, os.getpid()))
        try:
            pending: deque = deque()
            for t in tasks:
                pending.append(pool.apply_async(_worker_encode, (t,)))
                if len(pending) >= 2 * num_proc:
                    yield pending.popleft().get()
            while pending:
                yield pending.popleft().get()
        finally:
            # however it ends (Ctrl-C too), the workers finish the few tasks they hold (2 each at
            # most) and exit. Pool.terminate() would kill one that may be holding the result
            # queue's lock as it sends a result, and then wait for that lock forever
            pool.close()
            pool.join()


_worker: dict = {}  # a worker process's tokenizer and dtype, set once by _worker_start


def _worker_start(tok_json: str, dtype: str, parent: int) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if sys.platform == "linux":
        libc().prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)
    _worker.update(tok=Tokenizer(HFTokenizer.from_str(tok_json)), dtype=np.dtype(dtype))


def _worker_encode(task):
    return encode_task(_worker["tok"], _worker["dtype"], task)


class SplitWriter:
    """Appends each document's ids to its split's .bin, <|endoftext|> between documents; counts."""

    def __init__(self, tmp: Path, is_val: Callable[[int], bool], eot: bytes, itemsize: int):
        self.is_val, self.eot, self.itemsize = is_val, eot, itemsize
        self.files = {s: open(tmp / f"{s}.bin", "wb") for s in SPLITS}
        self.stats = {s: {"tokens": 0, "bytes": 0, "documents": 0} for s in SPLITS}
        self.last = {s: -1 for s in SPLITS}

    def add(self, doc: int, ids: bytes, nbytes: int) -> None:
        s = "val" if self.is_val(doc) else "train"
        f, st = self.files[s], self.stats[s]
        if doc != self.last[s]:  # the first ids of a new document
            if st["documents"]:
                f.write(self.eot)
                st["tokens"] += 1
            st["documents"] += 1
            self.last[s] = doc
        f.write(ids)
        st["tokens"] += len(ids) // self.itemsize
        st["bytes"] += nbytes

    def close(self) -> dict:
        for f in self.files.values():
            f.close()
        for name, s in self.stats.items():
            if not s["tokens"]:
                raise MinitfError(
                    f"the {name} split came out empty ({self.stats['train']['documents']} non-empty "
                    f"train documents); add text or documents, or change data.val_fraction"
                )
        return self.stats


def temp_dir(parent: Path) -> Path:
    """A fresh build directory named for this process, after removing those of dead processes."""
    parent.mkdir(parents=True, exist_ok=True)
    for d in parent.glob(".tmp-*"):
        m = _STALE.fullmatch(d.name)
        if m and not _alive(int(m[1])):
            shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def cache_build(out: Path) -> Iterator[Path]:
    """A fresh build directory beside `out` to write a cache into; when the block ends, renamed to
    `out` in one step (or dropped if another process built the same cache first: theirs is kept).
    On any error it is removed, and an OSError is said as write_error (a full disk, no permission)."""
    try:
        tmp = temp_dir(out.parent)
    except OSError as e:
        raise write_error(out.parent, e) from None
    try:
        yield tmp
        try:
            os.replace(tmp, out)
        except OSError:  # another process built the same cache first: keep theirs
            shutil.rmtree(tmp)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(Path(e.filename) if e.filename else out, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_error(path: Path, e: OSError) -> MinitfError:
    return MinitfError(
        f"could not write {path}: {e.strerror or e}; free some disk space or make it "
        f"writable, or set MINITF_CACHE to a directory on another disk"
    )


def progress(total: int | None, desc: str):
    """Progress in MB with MB/s (and an ETA when total is known): a bar on a terminal, a line
    every 5 s in a log."""
    return progress_bar(
        total, desc, unit="B", every=5.0, unit_scale=True, unit_divisor=1000, mininterval=1, leave=False
    )


@contextlib.contextmanager
def _env(name: str, value: str | None):
    """Set an environment variable for a block, unless the user has set it."""
    mine = value is not None and name not in os.environ
    if mine:
        os.environ[name] = value
    try:
        yield
    finally:
        if mine:
            del os.environ[name]


def build_splits(docs, tok: Tokenizer, tmp: Path, dtype: np.dtype, num_proc: int, nbytes: int | None) -> dict:
    """Tokenize every document into tmp/train.bin and tmp/val.bin; return the split statistics."""
    writer = SplitWriter(tmp, docs.is_val, np.array([tok.eot_id], dtype).tobytes(), dtype.itemsize)
    t0 = time.perf_counter()
    results = encoded(tasks(docs.docs()), tok, dtype, num_proc)
    # closing the generator ends the worker pool now, not when an exception's traceback is freed
    with progress(nbytes, "tokenizing") as bar, contextlib.closing(results):
        try:
            for result in results:
                for doc, ids, n in result:
                    writer.add(doc, ids, n)
                    bar.update(n)
        finally:
            for f in writer.files.values():
                f.close()
    stats = writer.close()
    stats["seconds"] = time.perf_counter() - t0
    return stats
