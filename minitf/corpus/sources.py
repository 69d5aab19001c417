"""Where documents come from: the default Shakespeare corpus, local text files, a Hugging Face
dataset, or the generated repeats corpus (repeats.py), each as a stream of documents, plus the
train/val split rule.

- A document arrives as an iterator of text blocks of bounded size, so one 1 GB file is never a
  1 GB string. Text files are read by minitf itself in universal-newline mode (\\r\\n and \\r
  read as \\n, as datasets' text loader reads them); hf: datasets go through HF `datasets`.
- Split: one document -> its contiguous tail, cut by characters, is val (nanoGPT's convention, so
  numbers compare); a single file is read twice, first to count its characters. Several ->
  whole documents, spread evenly: document i is val when ceil((i+1)f - 1/2) > ceil(if - 1/2),
  f = val_fraction, so n*f rounded (half down) of n are; if that is none (n*f <= 1/2), the last is.
- Invalid UTF-8 in a file is an error naming the file and byte offset, never a silent replacement.
  Empty files are skipped with a note.
- A directory walk reads each real file once: a symlinked directory is entered once (a link loop,
  or a second link to a directory already walked, is skipped) and a file reached by several
  names (links, hard links) is one document, under its link-free name when it has one. Reading a
  copy twice would put training text into val.
- The fingerprint that keys the token cache covers the content: the sha256 of each file, so an
  edit of the same size with the mtime put back still makes a new cache. Hashes are remembered
  per file (device, inode, size, mtime, ctime: a write or utime always moves the ctime), so only
  new or changed files are read again. Each pass that reads a file hashes what it reads and
  refuses the file if that is not the content the cache was keyed with (it changed meanwhile).
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import glob
import hashlib
import io
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import DataConfig
from ..errors import ConfigError, MinitfError, first_line
from . import chat_corpus, repeats, shakespeare
from .split import val_rule

BLOCK_CHARS = 1 << 20  # text is read and handed on in blocks of at most this many characters
READ_BYTES = 1 << 20  # and read from the file this many bytes at a time
# a file's remembered hash is trusted only while its ctime is unchanged; one whose ctime is this
# recent when hashed is not remembered, as a same-size write in the same clock tick (timestamps are
# coarse, a few ms) would leave every stat field as it was
RACY_NS = 2_000_000_000
HASH_LOG_BYTES = 256 << 20  # hashing more than this says so in the log (about 0.25 s per 256 MB)
_LOCAL = shakespeare.LOCAL
# every kind of data.source, as the user writes it; a new kind is added here and in Source
KINDS = {
    "shakespeare": "shakespeare",
    "repeats": "repeats",
    "chat": "chat",
    "file": "file:<path, directory or glob>",
    "hf": "hf:<dataset>[:<config>] or hf:<local dataset directory>",
}
WORDS_ALONE = ("shakespeare", "repeats", "chat")  # the kinds named by their word alone, with nothing after it


def cache_dir() -> Path:
    """$MINITF_CACHE, else ~/.cache/minitf: the token caches, tokenizers and file hashes. A path
    that is (or lies under) a file, or cannot be made or written, is refused in one line naming
    the variable; a missing directory is made."""
    env = os.environ.get("MINITF_CACHE")
    path = Path(env or Path.home() / ".cache" / "minitf").expanduser()
    for there in (path, *path.parents):  # the nearest part of the path that exists must be a directory
        if there.exists() or there.is_symlink():
            if not there.is_dir():
                what = f"MINITF_CACHE={env}" if env else f"the token cache {path}"
                where = "is a file" if there == path else f"lies under {there}, which is a file"
                raise MinitfError(
                    f"{what} {where}, not a directory; "
                    + ("point MINITF_CACHE at a directory (made if missing), or unset it" if env else "move that file")
                )
            break
    _check_writable(path, f"MINITF_CACHE={env}" if env else f"the cache directory {path}", bool(env))
    return path


def _check_writable(path: Path, what: str, from_env: bool) -> None:
    """The cache is written to at once (the corpus, the tokenizer, the token cache): a directory that
    cannot be made or written (a read-only file system, /sys) is said now, in one line."""
    fix = "point MINITF_CACHE at a writable directory" if from_env else "set MINITF_CACHE to a writable directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinitfError(f"{what} cannot be made ({e.strerror or e}); {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise MinitfError(f"{what} is not writable; {fix}")


@dataclass
class Documents:
    """A corpus ready to read: docs() starts a fresh pass (each document an iterator of text
    blocks); is_val(i) says whether document i is held out; nbytes is about how many bytes of
    text a pass reads (None when unknown), for progress bars."""

    docs: Callable[[], Iterator[Iterator[str]]]
    is_val: Callable[[int], bool]
    nbytes: int | None


class Source:
    """Where the documents come from. The fingerprint covers the names and content of the files
    (sha256, remembered between runs while a file's stat fields are unchanged), so it is cheap
    to take again and changes with any edit."""

    def __init__(self, cfg: DataConfig, log: Callable[[str], None] = lambda line: None):
        self.kind, _, self.spec = cfg.source.partition(":")
        if self.kind not in KINDS or (self.kind in WORDS_ALONE) != (cfg.source in WORDS_ALONE):
            raise ConfigError(f"data.source must be {', '.join(repr(k) for k in KINDS.values())}; got {cfg.source!r}")
        if self.kind not in WORDS_ALONE and not self.spec.strip():
            raise ConfigError(
                f"data.source={cfg.source} names no {'path' if self.kind == 'file' else 'dataset'}; "
                f"write it as {KINDS[self.kind]}"
            )
        root = Path(self.spec).expanduser()
        self.local = self.kind == "hf" and (root.exists() or self.spec.startswith(("/", ".", "~")))
        self.files: list[Path] = []
        self.empty: list[Path] = []
        self.aliases: list[tuple[Path, Path]] = []  # (a name skipped, the name of the same file that is read)
        if self.kind == "file":
            # a directory means its *.txt, or for conversations its *.jsonl
            self.files, self.empty, self.aliases = _text_files(
                self.spec, "*.txt" if cfg.format == "text" else "*.jsonl"
            )
        elif self.kind == "repeats":  # generated once into the cache, then read as files
            self.files = repeats.repeats_files(cache_dir(), log)
        elif self.kind == "chat":  # the generated conversations (data.format=chat), likewise
            self.files = chat_corpus.chat_files(cache_dir(), log)
        elif self.local:  # hf:<local dataset directory>, read without the network
            if not root.is_dir():
                raise MinitfError(
                    f"data.source={cfg.source}: no such directory; hf: takes a hub dataset "
                    f"name or a local dataset directory (one text file goes in file:PATH)"
                )
            self.spec = str(root)
            self.files = sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.relative_to(root).parts)
        self.hashes = file_hashes(self.files, cfg.source, log)  # {path: sha256 of its bytes}
        salt = shakespeare.SHAKESPEARE_SHA256 if self.kind == "shakespeare" else ""
        h = hashlib.sha256(f"{cfg.source}\0{salt}".encode())
        for f in self.files:  # names as listed, not resolved: a moved or copied corpus keeps its cache
            h.update(f"\0{f}\0{self.hashes[f]}".encode())
        self.fingerprint = h.hexdigest()

    def load(self, cfg: DataConfig, log) -> Documents:
        if self.kind == "hf":
            return _hf_documents(load_hf(self.spec, cfg, self.local), cfg, log)
        if self.empty:
            log(f"data: skipping {len(self.empty)} empty file(s): {', '.join(map(str, self.empty[:3]))}")
        if self.aliases:
            link, kept = self.aliases[0]
            log(
                f"data: {len(self.aliases)} name(s) lead to a file already in the corpus, which is read "
                f"once (e.g. {link} is {kept})"
            )
        files = shakespeare.shakespeare_files(cache_dir(), log) if self.kind == "shakespeare" else self.files
        files, f = files[: cfg.max_documents], cfg.val_fraction
        nbytes = sum(p.stat().st_size for p in files)

        def read(p: Path) -> Iterator[str]:
            return read_blocks(p, sha=self.hashes.get(p))

        if len(files) == 1:
            n = sum(map(len, read(files[0])))  # a first, cheap pass: the split needs the length
            cut = int(n * (1 - f))
            log(f"data: {cfg.source}: 1 document of {n:,} characters; val is its last {f:.0%}")
            return Documents(lambda: iter(_split_blocks(read(files[0]), cut)), lambda i: i == 1, nbytes)
        log(
            f"data: {cfg.source}: {len(files):,} documents; "
            f"{'the last' if len(files) * f <= 0.5 else f'one in {1 / f:.3g}'} goes to val"
        )
        return Documents(lambda: (read(p) for p in files), val_rule(len(files), f), nbytes)


def read_blocks(path: Path, size: int | None = None, sha: str | None = None) -> Iterator[str]:
    """The text of a UTF-8 file, in blocks of at most `size` characters. With `sha` (the sha256
    of the bytes the caller expects), the bytes read are hashed on the way and a file whose
    content is not that is refused once it is read to its end."""
    size = size or BLOCK_CHARS
    h = hashlib.sha256() if sha else None
    try:
        raw = open(path, "rb", buffering=0)
        stream = io.BufferedReader(_Hashing(raw, h) if h else raw, READ_BYTES)
        with io.TextIOWrapper(stream, encoding="utf-8") as f:  # newline=None: \r\n and \r read as \n
            f._CHUNK_SIZE = READ_BYTES  # the bytes it decodes at a time (8 KiB by default)
            while block := f.read(size):
                yield block
    except UnicodeDecodeError:
        _explain_utf8(path)
        raise
    if h is not None and h.hexdigest() != sha:
        raise MinitfError(
            f"{path} changed while it was being read for tokenizing (its content is not what it was "
            f"when the token cache was keyed), so nothing was cached; run again once nothing writes to it"
        )


class _Hashing(io.RawIOBase):
    """A raw binary file that feeds every byte read through it to a hash."""

    def __init__(self, raw, h):
        self.raw, self.h = raw, h

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.raw.readinto(b)
        if n:
            self.h.update(memoryview(b)[:n])
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def file_hashes(files: list[Path], source: str, log: Callable[[str], None]) -> dict[Path, str]:
    """{file: sha256 of its bytes}. A file whose device, inode, size, mtime and ctime are those
    remembered from an earlier call (cache_dir()/hashes/, one small JSON per data.source) keeps
    its remembered hash; the others are read. Remembering is best-effort: an unwritable cache
    only means hashing again next time."""
    memo_file = cache_dir() / "hashes" / f"{hashlib.sha256(source.encode()).hexdigest()[:20]}.json"
    try:
        memo = json.loads(memo_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    hashes, keep, todo = {}, {}, []
    for f in files:
        try:
            real, st = os.path.realpath(f), os.stat(f)
        except OSError as e:  # gone since it was listed
            raise MinitfError(f"could not read {f}: {e.strerror or e}; is something changing data.source?") from None
        sig = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        entry = memo.get(real)
        if isinstance(entry, list) and len(entry) == 6 and entry[:5] == sig:
            hashes[f], keep[real] = entry[5], entry
        else:
            todo.append((f, real, sig))
    if sum(sig[2] for _, _, sig in todo) > HASH_LOG_BYTES:
        nbytes = sum(sig[2] for _, _, sig in todo)
        log(f"data: reading {len(todo):,} new or changed file(s) ({nbytes / 1e6:,.0f} MB) to fingerprint the corpus")
    for f, real, sig in todo:
        try:
            with open(f, "rb") as fh:
                hashes[f] = hashlib.file_digest(fh, "sha256").hexdigest()
                st = os.fstat(fh.fileno())
        except OSError as e:
            raise MinitfError(
                f"could not read {f}: {e.strerror or e}; make it readable or leave it out of data.source"
            ) from None
        after = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        if after == sig and time.time_ns() - st.st_ctime_ns >= RACY_NS:  # else: hashed again next time
            keep[real] = [*sig, hashes[f]]
    if keep != memo:
        tmp = memo_file.with_name(f".{memo_file.name}.{os.getpid()}.tmp")
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(keep), encoding="utf-8")
            os.replace(tmp, memo_file)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return hashes


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


def _text_files(spec: str, kind: str = "*.txt") -> tuple[list[Path], list[Path], list[tuple[Path, Path]]]:
    """file:<path|dir|glob> -> (non-empty files, empty files, (skipped name, kept name) of files
    reached twice), sorted; a directory means its files of `kind`. A path that exists is taken as
    it is written, so a name with glob characters in it (notes[1].txt) means that file, not a pattern."""
    p = Path(spec).expanduser()
    if p.is_dir():
        found = _glob(os.path.join(glob.escape(str(p)), "**", kind))
    else:
        found = [str(p)] if p.is_file() else _glob(str(p))
    files, aliases = _once(found)
    if not files:
        what = f"is a directory with no {kind} files" if p.is_dir() else "matches no files"
        raise MinitfError(
            f"data.source=file:{spec} {what}; point it at a UTF-8 file, a directory "
            f"of {kind} files or a glob such as 'file:notes/**/*.md'"
        )
    empty = [f for f in files if f.stat().st_size == 0]
    if len(empty) == len(files):
        raise MinitfError(f"data.source=file:{spec}: all {len(files)} file(s) are empty; add some text")
    return [f for f in files if f not in empty], empty, aliases


def _glob(pattern: str) -> list[str]:
    """glob.glob(pattern, recursive=True), except that `**` enters each directory once.

    Python's glob follows symlinked directories under `**` without remembering where it has
    been, so a link loop yields every file once per level until the path is too long (40 times).
    Patterns without `**` cannot loop and go to glob itself."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part) and not _escaped(part))
    root, segs = _unescape(os.sep.join(parts[:first])) or ("" if first == 0 else os.sep), parts[first:]
    hidden = any(s.startswith(".") for s in segs)  # as glob: wildcards skip dot-names unless written
    found = []
    for path in _walk(root or os.curdir, hidden):
        rel = os.path.relpath(path, root or os.curdir)
        if _match(rel.split(os.sep), segs):
            found.append(os.path.join(root, rel) if root else rel)
    return found


def _escaped(part: str) -> bool:
    """A name glob.escape wrote: every *, ? and [ in it stands for itself ([*], [?], [[])."""
    return not glob.has_magic(re.sub(r"\[([*?[])\]", "", part))


def _unescape(path: str) -> str:
    return re.sub(r"\[([*?[])\]", r"\1", path)


def _walk(root: str, hidden: bool) -> Iterator[str]:
    """Every path of a non-directory under root, entering each directory once: first the real
    tree, then symlinked directories whose target has not been walked (a loop, or a second link
    to one directory, is skipped), so files get their link-free names where they have them."""
    seen, pending = set(), [root]
    with contextlib.suppress(OSError):
        seen.add(_identity(root))
    while pending:
        links: list[str] = []
        for top in pending:
            for dirpath, dirnames, filenames in os.walk(top):  # does not descend into links
                keep = []
                for d in sorted(dirnames):
                    full = os.path.join(dirpath, d)
                    if not hidden and d.startswith("."):
                        continue
                    if os.path.islink(full):
                        links.append(full)
                        continue
                    with contextlib.suppress(OSError):
                        if _identity(full) not in seen:  # (a bind mount can show a directory twice)
                            seen.add(_identity(full))
                            keep.append(d)
                dirnames[:] = keep
                yield from (os.path.join(dirpath, f) for f in sorted(filenames) if hidden or not f.startswith("."))
        pending = []
        for link in sorted(links):
            with contextlib.suppress(OSError):  # a dangling link leads nowhere
                if _identity(link) not in seen:
                    seen.add(_identity(link))
                    pending.append(link)


def _match(names: list[str], segs: list[str]) -> bool:
    """Whether a relative path (its names) matches glob segments, `**` being any number of names."""
    if not segs:
        return not names
    if segs[0] == "**":  # as glob: it spans no dot-names
        ends = range(next((i for i, n in enumerate(names) if n.startswith(".")), len(names)) + 1)
        return any(_match(names[i:], segs[1:]) for i in ends)
    if not names or (names[0].startswith(".") and not segs[0].startswith(".")):
        return False
    return fnmatch.fnmatch(names[0], segs[0]) and _match(names[1:], segs[1:])


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _once(paths: list[str]) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """The files among paths, one name per real file (the link-free name if there is one, else the
    first), sorted; and each skipped name with the name kept for it."""
    names: dict[tuple[int, int], list[str]] = {}
    for p in sorted(paths):
        if os.path.isfile(p):
            names.setdefault(_identity(p), []).append(p)
    files, aliases = [], []
    for group in names.values():
        kept = min(group, key=lambda p: (os.path.realpath(p) != os.path.abspath(p), p))
        files.append(Path(kept))
        aliases += [(Path(p), Path(kept)) for p in group if p != kept]
    return sorted(files), sorted(aliases)


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


def load_hf(spec: str, cfg: DataConfig, local: bool, column: str | None = None, text: bool = True):
    """hf:<dataset>[:<config>] from the hub (failing in seconds when it is unreachable, where
    datasets itself retries for ~20 s) into the user's HF cache, or hf:<local dataset directory>
    without the network, its Arrow copy under our cache. It must have the column (data.text_field
    unless named), holding text unless `text` is false (a chat dataset's messages)."""
    column = column or cfg.text_field
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
    if column not in columns:
        fix = "set data.text_field to the one holding the text" if text else "a chat dataset holds them in 'messages'"
        raise MinitfError(f"dataset {spec!r} has no column {column!r} (it has {', '.join(columns)}); {fix}")
    kind = _column_kind((ds.features or {}).get(column))
    if text and kind not in (None, "string", "large_string"):
        raise _not_text(spec, cfg.text_field, kind, ds.features)
    return ds


def _column_kind(feature) -> str | None:
    """A datasets feature's type name: "string", "int64", "list", ... (None: not known, as for some streams)."""
    if feature is None:
        return None
    return getattr(feature, "dtype", None) or type(feature).__name__.lower()


def _not_text(spec: str, field: str, kind: str, features=None) -> MinitfError:
    texts = [n for n, f in (features or {}).items() if _column_kind(f) in ("string", "large_string")]
    other = f"its text columns: {', '.join(texts)}" if texts else "it has no text column"
    return MinitfError(
        f"dataset {spec!r} column {field!r} holds {kind} values, not text; set data.text_field to the "
        f"column with the text ({other})"
    )


def _hf_documents(ds, cfg: DataConfig, log) -> Documents:
    """An hf: dataset (memory-mapped Arrow files, or a stream) as Documents, one per row."""
    import datasets

    ds = ds.select_columns([cfg.text_field])
    if cfg.max_documents is not None:
        ds = ds.take(cfg.max_documents)
    f, n = cfg.val_fraction, len(ds) if isinstance(ds, datasets.Dataset) else None
    if n == 1:
        text = ds[0][cfg.text_field] or ""
        if not isinstance(text, str):
            raise _not_text(cfg.source[3:], cfg.text_field, type(text).__name__)
        cut = int(len(text) * (1 - f))
        log(f"data: {cfg.source}: 1 document of {len(text):,} characters; val is its last {f:.0%}")
        return Documents(
            lambda: iter([iter([text[:cut]]), iter([text[cut:]])]), lambda i: i == 1, len(text.encode("utf-8"))
        )

    def docs():
        for batch in ds.iter(batch_size=256):
            for t in batch[cfg.text_field]:
                if t is not None and not isinstance(t, str):  # a stream whose types were not declared
                    raise _not_text(cfg.source[3:], cfg.text_field, type(t).__name__)
                yield iter([t or ""])

    log(
        f"data: {cfg.source}: {'streamed' if n is None else f'{n:,}'} documents; "
        f"{'the last' if n and n * f <= 0.5 else f'one in {1 / f:.3g}'} goes to val"
    )
    return Documents(docs, val_rule(n, f), ds.data.nbytes if n is not None else None)
