"""The bounded tokenizing pipeline (minitf/corpus/token_cache.py) and what can go wrong around the token cache:
chunked builds equal whole ones, killed builds leave no temp directories or orphan workers,
damaged caches are rebuilt, write failures are one line, and the corpus download runs no code."""

import os

import pytest
import torch

import minitf.corpus.shakespeare
import minitf.corpus.sources
import minitf.corpus.token_cache
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.token_cache import pieces
from minitf.data import CacheError, TokenData
from minitf.errors import ConfigError, MinitfError
from minitf.tokenizer import Tokenizer
from tests.support.corpus import HARD, Log, bins, write_docs
from tests.support.corpus import doc_text as text


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


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


# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


@pytest.mark.parametrize("size,block", [(2048, 10**9), (700, 1000), (64, 97)])
def test_pieces_encode_exactly_like_the_whole(size, block):
    """Text with long runs, unicode, tabs, no whitespace and no newlines, cut and fed in blocks."""
    tok = Tokenizer.train([HARD], vocab_size=400)
    blocks = [HARD[i : i + block] for i in range(0, len(HARD), block)]
    cut = list(pieces(iter(blocks), size=size))
    assert len(cut) > 10 and "".join(cut) == HARD
    assert sum(tok.encode_batch(cut), []) == tok.encode(HARD)
    assert max(map(len, cut)) <= size + 9100  # bounded, but for the 9,000 x's that have no cut point
    assert all(p[0] == " " and not p[1].isspace() or not p[0].isspace() and p[0] != " " for p in cut[1:])
