"""minitf.data: the token dtype, get_batch's windows, bits per byte, and flat memory over many batches."""

import json
import math
import os

import numpy as np
import pytest
import tokenizers
import torch

from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.data import TokenData, bits_per_byte, token_dtype
from minitf.errors import MinitfError
from minitf.tokenizer import EOT, Tokenizer
from tests.support.corpus import Log, split_docs, write_docs

# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


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
