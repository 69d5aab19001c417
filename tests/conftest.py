"""Shared fixtures: a small local corpus (tests never need the network), a private token cache, a
trained tiny run (and a copy of it whose weights hold a NaN), the explorer serving it, and the
runs of the tiny test recipe (tiny_config) that many training tests start from, each trained once
per session: a test that writes to one works on its own copy (tests.support.runs.copy_run)."""

import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

import minitf
from minitf.run_dir import WEIGHTS
from tests.support import ROOT
from tests.support.corpus import make_play
from tests.support.runs import QUIET, poison, tiny_config

# One intra-op thread for torch in this process (unless OMP_NUM_THREADS says otherwise): the
# tests' models are tiny, so a second thread buys them little (the unit tier on 2 idle cores: 40 s
# on two threads, 44 s on one), and on 2 cores doing anything else torch's two threads wait for
# each other at every op (under load: 242 s on two, 60 s on one; the tiny run's evaluate_text 18 to
# 48 s on two, 1.7 s on one). The scripts the tests start keep torch's default: some compile or
# benchmark larger models, and the GPU script's dry run took 65 s on two threads, 79 s on one.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))

# where every extra is installed (.ci/run's main run), a test that skips for a missing one fails
pytest_plugins = ["tests.support.extras"]


def pytest_xdist_auto_num_workers(config) -> int:
    """What -n auto (pyproject's addopts) means: one process per core this process may use, at most
    4. Each holds torch, transformers and the session's trained runs (up to 1.3 GB here), and past 4 the
    files that take longest (the GPU script's dry run, the notebook, torchrun) set the time anyway."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path_factory.getbasetemp() / "minitf-cache"))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    for i in range(4):
        (d / f"play{i}.txt").write_text(make_play(i))
    return d


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, corpus) -> Path:
    """A trained run directory (a few seconds of training), shared by the tests that only read it."""
    base = tmp_path_factory.getbasetemp()
    mp = pytest.MonkeyPatch()
    mp.setenv("MINITF_CACHE", str(base / "minitf-cache"))
    try:
        return minitf.train(
            tiny_config(
                base / "runs" / "tiny", corpus, "train.max_steps=30", "train.eval_every=15", "train.ckpt_every=15"
            ),
            log=lambda *a: None,
        )
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory, corpus) -> Path:
    """A chat run: a tiny base run (128-token context) fine-tuned for a few steps on 2,000 of the
    generated chat corpus's conversations (ChatML's tokens added), shared by the tests that only read it."""
    base = tmp_path_factory.getbasetemp()
    mp = pytest.MonkeyPatch()
    mp.setenv("MINITF_CACHE", str(base / "minitf-cache"))
    quiet = {"log": lambda *a: None}
    pretrained = minitf.train(tiny_config(base / "runs" / "chat-base", corpus, "model.block_size=128"), **quiet)
    overrides = [
        f"run.out_dir={base / 'runs' / 'chat'}",
        f"run.init_from={pretrained}",
        "data.max_documents=2000",
        "data.skip_invalid=true",
        "train.max_steps=12",
        "train.max_seconds=null",
        "train.eval_every=12",
        "train.ckpt_every=12",
        "train.eval_batches=2",
        "train.batch_size=8",
        "train.dtype=float32",
    ]
    try:
        return minitf.train(minitf.load_config(ROOT / "configs" / "chat.yaml", overrides), **quiet)
    finally:
        mp.undo()


def _session_run(tmp_path_factory, corpus: Path, name: str, *overrides) -> Path:
    """tiny_config(..., *overrides) trained once, in <basetemp>/runs/<name>/run (a copy at
    tmp_path / "run" is then the run that test would have trained there), on the session's cache."""
    base = tmp_path_factory.getbasetemp()
    mp = pytest.MonkeyPatch()
    mp.setenv("MINITF_CACHE", str(base / "minitf-cache"))
    try:
        return minitf.train(tiny_config(base / "runs" / name / "run", corpus, *overrides), **QUIET)
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def run_4_steps(tmp_path_factory, corpus) -> Path:
    """tiny_config(tmp_path / "run", corpus, "train.max_steps=4") as trained; read it, or copy_run it to write."""
    return _session_run(tmp_path_factory, corpus, "4-steps", "train.max_steps=4")


@pytest.fixture(scope="session")
def run_8_steps(tmp_path_factory, corpus) -> Path:
    """tiny_config(tmp_path / "run", corpus) (8 steps) as trained; read it, or copy_run it to write."""
    return _session_run(tmp_path_factory, corpus, "8-steps")


@pytest.fixture
def nan_run(tmp_path, tiny_run):
    """A copy of the trained tiny run whose model.safetensors holds one NaN (best.safetensors is intact)."""
    run = tmp_path / "nan"
    shutil.copytree(tiny_run, run)
    poison(run / WEIGHTS)
    return run


@pytest.fixture(scope="session")
def explore_server(tiny_run):
    """The explorer over tiny_run on a free port of 127.0.0.1, in a thread; its log lines in .logs."""
    from minitf.web.explore import Explorer, ExploreServer

    logs = []
    srv = ExploreServer(Explorer(tiny_run), "127.0.0.1", 0, log=logs.append)
    srv.logs = logs
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.close()
    thread.join(5)
