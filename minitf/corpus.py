"""Where documents come from: the default Shakespeare corpus, local text files, or a Hugging Face
dataset, each as a stream of documents, plus the train/val split rule.

- A document arrives as an iterator of text blocks of bounded size, so one 1 GB file is never a
  1 GB string. Text files are read by minitf itself in universal-newline mode (\\r\\n and \\r
  read as \\n, as datasets' text loader reads them); hf: datasets go through HF `datasets`.
- Split: one document -> its contiguous tail, cut by characters, is val (nanoGPT's convention, so
  numbers compare); a single file is read twice, first to count its characters. Several ->
  whole documents, spread evenly: document i is val when ceil((i+1)f - 1/2) > ceil(if - 1/2),
  f = val_fraction, so n*f rounded (half down) of n are; if that is none (n*f <= 1/2), the last is.
- Invalid UTF-8 in a file is an error naming the file and byte offset, never a silent replacement.
  Empty files are skipped with a note.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import math
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import shakespeare
from .config import ConfigError, DataConfig, MinitfError
from .errors import first_line

BLOCK_CHARS = 1 << 20  # text is read and handed on in blocks of at most this many characters
_LOCAL = shakespeare.LOCAL
# every kind of data.source, as the user writes it; a new kind is added here and in Source
KINDS = {
    "shakespeare": "shakespeare",
    "file": "file:<path, directory or glob>",
    "hf": "hf:<dataset>[:<config>] or hf:<local dataset directory>",
}


def cache_dir() -> Path:
    return Path(os.environ.get("MINITF_CACHE") or Path.home() / ".cache" / "minitf").expanduser()


@dataclass
class Documents:
    """A corpus ready to read: docs() starts a fresh pass (each document an iterator of text
    blocks); is_val(i) says whether document i is held out; nbytes is about how many bytes of
    text a pass reads (None when unknown), for progress bars."""

    docs: Callable[[], Iterator[Iterator[str]]]
    is_val: Callable[[int], bool]
    nbytes: int | None


class Source:
    """Where the documents come from. The fingerprint is cheap: names, sizes and mtimes of files."""

    def __init__(self, cfg: DataConfig):
        self.kind, _, self.spec = cfg.source.partition(":")
        if self.kind not in KINDS or (self.kind == "shakespeare") != (cfg.source == "shakespeare"):
            raise ConfigError(f"data.source must be {', '.join(repr(k) for k in KINDS.values())}; got {cfg.source!r}")
        if self.kind != "shakespeare" and not self.spec.strip():
            raise ConfigError(
                f"data.source={cfg.source} names no {'path' if self.kind == 'file' else 'dataset'}; "
                f"write it as {KINDS[self.kind]}"
            )
        root = Path(self.spec).expanduser()
        self.local = self.kind == "hf" and (root.exists() or self.spec.startswith(("/", ".", "~")))
        self.files: list[Path] = []
        self.empty: list[Path] = []
        if self.kind == "file":
            self.files, self.empty = _text_files(self.spec)
        elif self.local:  # hf:<local dataset directory>, read without the network
            if not root.is_dir():
                raise MinitfError(
                    f"data.source={cfg.source}: no such directory; hf: takes a hub dataset "
                    f"name or a local dataset directory (one text file goes in file:PATH)"
                )
            self.spec = str(root)
            self.files = sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.relative_to(root).parts)
        salt = shakespeare.SHAKESPEARE_SHA256 if self.kind == "shakespeare" else ""
        h = hashlib.sha256(f"{cfg.source}\0{salt}".encode())
        for f in self.files:
            st = f.stat()
            h.update(f"\0{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        self.fingerprint = h.hexdigest()

    def load(self, cfg: DataConfig, log) -> Documents:
        if self.kind == "hf":
            return _hf_documents(_load_hf(self.spec, cfg, self.local), cfg, log)
        if self.empty:
            log(f"data: skipping {len(self.empty)} empty file(s): {', '.join(map(str, self.empty[:3]))}")
        files = shakespeare.shakespeare_files(cache_dir(), log) if self.kind == "shakespeare" else self.files
        files, f = files[: cfg.max_documents], cfg.val_fraction
        nbytes = sum(p.stat().st_size for p in files)
        if len(files) == 1:
            n = sum(map(len, read_blocks(files[0])))  # a first, cheap pass: the split needs the length
            cut = int(n * (1 - f))
            log(f"data: {cfg.source}: 1 document of {n:,} characters; val is its last {f:.0%}")
            return Documents(lambda: iter(_split_blocks(read_blocks(files[0]), cut)), lambda i: i == 1, nbytes)
        log(
            f"data: {cfg.source}: {len(files):,} documents; "
            f"{'the last' if len(files) * f <= 0.5 else f'one in {1 / f:.3g}'} goes to val"
        )
        return Documents(lambda: (read_blocks(p) for p in files), val_rule(len(files), f), nbytes)


def val_rule(n: int | None, f: float) -> Callable[[int], bool]:
    """Whether document i of n (None: unknown, streamed) is held out for val_fraction f."""
    if n is not None and n * f <= 0.5:  # too few documents to hold out one in 1/f: the last
        return lambda i: i == n - 1
    return lambda i: math.ceil((i + 1) * f - 0.5) > math.ceil(i * f - 0.5)


def read_blocks(path: Path, size: int | None = None) -> Iterator[str]:
    """The text of a UTF-8 file, in blocks of at most `size` characters."""
    size = size or BLOCK_CHARS
    try:
        with open(path, encoding="utf-8") as f:
            while block := f.read(size):
                yield block
    except UnicodeDecodeError:
        _explain_utf8(path)
        raise


def _split_blocks(blocks: Iterator[str], cut: int) -> list[Iterator[str]]:
    """One document's blocks -> two documents: its first `cut` characters, then the rest."""
    state = {"seen": 0, "rest": "", "done": False}

    def head():
        for block in blocks:
            take = cut - state["seen"]
            state["seen"] += len(block)
            if take >= len(block):
                yield block
                continue
            state["rest"], state["done"] = block[take:], True
            if take:
                yield block[:take]
            return
        state["done"] = True

    def tail():
        if not state["done"]:  # the head was not read to its end: skip over it
            for _ in head():
                pass
        if state["rest"]:
            yield state["rest"]
        yield from blocks

    return [head(), tail()]


def _text_files(spec: str) -> tuple[list[Path], list[Path]]:
    """file:<path|dir|glob> -> (non-empty files, empty files), sorted; a directory means its *.txt."""
    p = Path(spec).expanduser()
    pattern = str(p / "**" / "*.txt") if p.is_dir() else str(p)
    files = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    if not files:
        what = "is a directory with no *.txt files" if p.is_dir() else "matches no files"
        raise MinitfError(
            f"data.source=file:{spec} {what}; point it at a UTF-8 text file, a directory "
            f"of *.txt files or a glob such as 'file:notes/**/*.md'"
        )
    empty = [f for f in files if f.stat().st_size == 0]
    if len(empty) == len(files):
        raise MinitfError(f"data.source=file:{spec}: all {len(files)} file(s) are empty; add some text")
    return [f for f in files if f not in empty], empty


def _explain_utf8(path: Path) -> None:
    """Raise a MinitfError naming the first invalid byte of path and its offset."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as u:
                raise MinitfError(
                    f"{path} is not valid UTF-8 (byte 0x{chunk[u.start]:02x} at offset "
                    f"{offset + u.start}); convert it first, e.g. iconv -f latin1 "
                    f"-t utf-8 {path.name} > {path.stem}.utf8.txt"
                ) from None
            offset += len(chunk)


def _load_hf(spec: str, cfg: DataConfig, local: bool):
    """hf:<dataset>[:<config>] from the hub (failing in seconds when it is unreachable, where
    datasets itself retries for ~20 s) into the user's HF cache, or hf:<local dataset directory>
    without the network, its Arrow copy under our cache."""
    import datasets
    from huggingface_hub import constants

    name, _, config = (spec, "", "") if local else spec.partition(":")
    offline = any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )  # then datasets reads its cache
    if not local and not offline:
        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=5).close()
        except urllib.error.HTTPError:
            pass  # it answered, so it is reachable
        except (OSError, ValueError) as e:
            raise MinitfError(
                f"could not reach the Hugging Face hub at {endpoint} to load {name!r} "
                f"({getattr(e, 'reason', e)}); use hf:/path/to/a/downloaded/dataset, set "
                f"HF_HUB_OFFLINE=1 to read your HF cache, {_LOCAL}"
            ) from None
    try:
        ds = datasets.load_dataset(
            name,
            config or None,
            split="train",
            streaming=cfg.streaming,
            cache_dir=str(cache_dir() / "datasets") if local else None,
        )
        columns = ds.column_names if ds.column_names is not None else list(next(iter(ds)))
    except Exception as e:  # datasets raises many types; the user needs the first line and a way out
        raise MinitfError(
            f"could not load dataset {spec!r} ({type(e).__name__}: {first_line(e)}); "
            f"check the name and config, {_LOCAL}"
        ) from e
    if cfg.text_field not in columns:
        raise MinitfError(
            f"dataset {spec!r} has no column {cfg.text_field!r} (it has {', '.join(columns)}); "
            f"set data.text_field to the one holding the text"
        )
    return ds


def _hf_documents(ds, cfg: DataConfig, log) -> Documents:
    """An hf: dataset (memory-mapped Arrow files, or a stream) as Documents, one per row."""
    import datasets

    ds = ds.select_columns([cfg.text_field])
    if cfg.max_documents is not None:
        ds = ds.take(cfg.max_documents)
    f, n = cfg.val_fraction, len(ds) if isinstance(ds, datasets.Dataset) else None
    if n == 1:
        text = ds[0][cfg.text_field] or ""
        cut = int(len(text) * (1 - f))
        log(f"data: {cfg.source}: 1 document of {len(text):,} characters; val is its last {f:.0%}")
        return Documents(
            lambda: iter([iter([text[:cut]]), iter([text[cut:]])]), lambda i: i == 1, len(text.encode("utf-8"))
        )

    def docs():
        for batch in ds.iter(batch_size=256):
            yield from (iter([t or ""]) for t in batch[cfg.text_field])

    log(
        f"data: {cfg.source}: {'streamed' if n is None else f'{n:,}'} documents; "
        f"{'the last' if n and n * f <= 0.5 else f'one in {1 / f:.3g}'} goes to val"
    )
    return Documents(docs, val_rule(n, f), ds.data.nbytes if n is not None else None)
