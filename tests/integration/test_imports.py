"""What importing minitf loads, in a fresh process: datasets only for the sources that need it."""

import os
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.processes import default_sigint, two_at_a_time

# The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors.


def test_datasets_is_imported_only_for_hf_sources(tmp_path):
    """Configuring, training's imports and preparing a local text never import datasets (a slow
    import); an hf: source (here a local parquet directory) does."""
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow comes with datasets")
    import pyarrow as pa

    text = "To be, or not to be, that is the question.\n" * 200
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table({"text": [text, text]}), tmp_path / "shards" / "part0.parquet")
    code = (
        "import sys, minitf\n"
        "minitf.load_config()\n"
        "import minitf.trainer, minitf.generate, minitf.evaluate, minitf.cli.train\n"
        "from minitf.corpus.prepare import prepare_data\n"
        "quiet = lambda *a: None\n"
        f"prepare_data(minitf.DataConfig(source='file:{tmp_path / 'a.txt'}', vocab_size=300), log=quiet)\n"
        "print('datasets' in sys.modules)\n"
        f"prepare_data(minitf.DataConfig(source='hf:{tmp_path / 'shards'}', vocab_size=300), log=quiet)\n"
        "print('datasets' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MINITF_CACHE": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "True"]


# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_importing_minitf_data_does_not_import_datasets():
    code = "import sys, minitf.data, minitf.tokenizer; assert 'datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_minitf_does_not_import_the_compiler():
    """torch._dynamo is about 1.5 s of a process: minitf imports it only when something compiles
    (fused_attention.constant_while_compiling, called by compile_regions and compile_decode)."""
    code = (
        "import sys, minitf, minitf.trainer, minitf.fast.decoding; assert 'torch._dynamo' not in sys.modules\n"
        "m = minitf.Transformer(minitf.ModelConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16))\n"
        "m.compile_regions(); assert 'torch._dynamo' in sys.modules\n"
        "from minitf.fast.fused_attention import flash_gpu; assert flash_gpu._dynamo_marked_constant"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_program_that_imports_minitf_keeps_its_sigint_handler(tmp_path):
    """Only the minitf command sets its Ctrl-C handler at import (minitf/cli/start.py): a program, -c
    code or another module run with -m keeps Python's. Each process says its handler as it exits
    (a sitecustomize, imported before anything: the one way to watch `python -m minitf.errors`)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, signal\n"
        "atexit.register(lambda: print('SIGINT', 'kept' if signal.getsignal(signal.SIGINT) is "
        "signal.default_int_handler else signal.getsignal(signal.SIGINT)))\n"
    )
    (tmp_path / "prog.py").write_text("import minitf\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    runs = [[str(tmp_path / "prog.py")], ["-c", "import minitf"], ["-m", "minitf.errors"]]
    done = two_at_a_time(
        lambda args: subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, preexec_fn=default_sigint
        ),
        runs,
    )
    for args, r in zip(runs, done):
        assert r.returncode == 0, (args, r.stderr[-2000:])
        assert r.stdout.splitlines()[-1:] == ["SIGINT kept"], (args, r.stdout[-500:])
