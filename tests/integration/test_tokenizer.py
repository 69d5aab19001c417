"""The tokenizer across processes and libraries: training is byte-for-byte deterministic in a fresh
process, and transformers loads it."""

import os
import subprocess
import sys

import pytest

from minitf.tokenizer import Tokenizer
from tests.support import ROOT
from tests.support.corpus import HARD_STRINGS as HARD
from tests.support.corpus import tokenizer_corpus as corpus

# Byte-level BPE: lossless round trips, determinism, the tokenizer.json format, bad input.


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(corpus(), vocab_size=400)


def test_training_is_deterministic_byte_for_byte(tok, tmp_path):
    again = Tokenizer.train(iter(corpus()), vocab_size=400)  # an iterator works as well as a list
    assert again.to_json() == tok.to_json() and again.hash == tok.hash
    # in a fresh process too, where the Rust HashMaps get other random seeds
    code = (
        f"import random, sys; sys.path.insert(0, {str(ROOT)!r}); "
        "from tests.support.corpus import tokenizer_corpus as corpus; "
        "from minitf.tokenizer import Tokenizer; "
        "Tokenizer.train(corpus(), vocab_size=400).save(sys.argv[1])"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t.json")], check=True, env={**os.environ, "PYTHONHASHSEED": "123"}
    )
    assert (tmp_path / "t.json").read_text(encoding="utf-8") == tok.to_json()
    assert Tokenizer.train(corpus(seed=5), vocab_size=400).hash != tok.hash


def test_transformers_can_load_it(tok, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    tok.save(tmp_path / "tokenizer.json")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for s in HARD:
        ids = fast.encode(s, add_special_tokens=False)
        assert ids == tok.encode(s)
        assert fast.decode(ids, clean_up_tokenization_spaces=False) == s
