"""Generated corpora (repeats.py, chat_corpus.py): written once into the cache, checked on every use.

A generated corpus is text drawn from a fixed seed, so it could be drawn again on every run; it is
written once instead, into a folder of minitf's cache, and read from there like any file: source.
What is read must be what was drawn, as a downloaded corpus must be what its hash says: the folder
holds a manifest (SHA256SUMS, the format `sha256sum -c` reads) of every file's sha256, and every
use checks each file against it. A file emptied, cut short or edited, a file missing, a manifest
missing or unreadable, or a folder that is not a folder (a file, a link) is not trained on: the
corpus is drawn again and replaces what was there, and one line says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import MinitfError
from ..system.files import atomic_write_dir

MANIFEST = "SHA256SUMS"  # "<sha256>  <name>" per line, as sha256sum writes it
MAX_MANIFEST_BYTES = 1 << 20


def generated_files(
    folder: Path, names: list[str], texts: Callable[[], dict[str, str]], log: Callable[[str], None]
) -> list[Path]:
    """The paths folder/name for each of names, in that order, each checked against the manifest.

    folder: the corpus's own folder in the cache (a version in its name, e.g. cache/repeats-1).
    names: the file names the corpus has (plain names, no folders; not MANIFEST).
    texts: draws the whole corpus, {name: text} for exactly those names; called only when the
        folder is missing or broken, so it may be slow and may log what it writes.
    log: gets one line when a broken folder is replaced, saying what was wrong.
    The files are written as UTF-8, all at once (system.files.atomic_write_dir): a kill while
    writing leaves no folder, and the next use writes it again.
    """
    folder = Path(folder)
    if MANIFEST in names or any(Path(n).name != n or n in ("", ".", "..") for n in names):
        raise MinitfError(f"generated corpus {folder}: file names must be plain names other than {MANIFEST}")
    paths = [folder / n for n in names]
    problem = _problem(folder, names)
    if problem is None:
        return paths
    if problem:
        log(f"data: {problem}; drawing the generated corpus again")
    drawn = texts()
    if sorted(drawn) != sorted(names):
        raise MinitfError(f"generated corpus {folder}: its texts are named {sorted(drawn)[:3]}..., not {names[:3]}...")
    _discard(folder)
    atomic_write_dir(folder, lambda tmp: _write(tmp, {name: drawn[name] for name in names}))
    return paths


def _problem(folder: Path, names: list[str]) -> str | None:
    """Why folder is not the corpus ('' when it is simply not there yet), or None when every file
    matches the manifest."""
    if not folder.exists() and not folder.is_symlink():
        return ""
    if folder.is_symlink() or not folder.is_dir():
        return f"{folder} is {'a link' if folder.is_symlink() else 'a file'}, not the generated corpus's folder"
    manifest = folder / MANIFEST
    try:
        if manifest.is_symlink() or manifest.stat().st_size > MAX_MANIFEST_BYTES:
            return f"{manifest} is not a manifest minitf wrote"
        sums = dict(reversed(line.split("  ", 1)) for line in manifest.read_text("utf-8").splitlines())
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{manifest} is missing or unreadable"
    for name in names:
        path = folder / name
        if path.is_symlink() or not path.is_file():
            return f"{path} is missing"
        if name not in sums or _sha256(path) != sums[name]:
            return f"{path} is not the text that was generated (emptied, cut short or edited)"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _discard(folder: Path) -> None:
    """Move what is at folder out of the way and delete it (a broken folder, a file, a link; the
    link itself, never what it points at). A concurrent writer may have moved it already."""
    if not folder.exists() and not folder.is_symlink():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
    with contextlib.suppress(FileNotFoundError):
        os.replace(folder, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


def _write(tmp: Path, drawn: dict[str, str]) -> None:
    sums = []
    for name, text in drawn.items():
        data = text.encode("utf-8")
        (tmp / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    (tmp / MANIFEST).write_text("".join(sums), encoding="utf-8")
