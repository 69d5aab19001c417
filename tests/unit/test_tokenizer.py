"""Byte-level BPE: lossless round trips, determinism, the tokenizer.json format, bad input."""

import hashlib
import json
import random

import numpy as np
import pytest
import tokenizers
import torch

from minitf.config import DataConfig
from minitf.errors import ConfigError, MinitfError
from minitf.tokenizer import EOT, MAX_PIECE_BYTES, Tokenizer, check_ids, check_text
from tests.support.corpus import HARD_STRINGS as HARD
from tests.support.corpus import tokenizer_corpus as corpus


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(corpus(), vocab_size=400)


def test_round_trip_of_hard_strings(tok):
    for s in HARD:
        assert tok.decode(tok.encode(s)) == s, repr(s)
    assert tok.encode_batch(HARD) == [tok.encode(s) for s in HARD]
    assert tok.encode("") == []


def test_round_trip_of_random_code_points(tok):
    rng = random.Random(1)
    points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000][::97]  # no lone surrogates
    for _ in range(20):
        s = "".join(chr(rng.choice(points)) for _ in range(rng.randint(1, 200)))
        assert tok.decode(tok.encode(s)) == s


def test_every_byte_is_in_the_vocab_and_no_unknown_token(tok):
    alphabet = set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert len(alphabet) == 256 and alphabet <= set(tok.backend.get_vocab())
    assert tok.backend.model.unk_token is None
    assert len(tok.encode("ẞ")) == 3  # 3 UTF-8 bytes never seen in training: one byte token each


def test_vocab_size_and_eot(tok):
    assert tok.vocab_size == 400 == tok.backend.get_vocab_size()
    assert tok.eot_id == tok.backend.token_to_id(EOT)
    assert tok.encode(EOT) == [tok.eot_id] and tok.decode([tok.eot_id]) == EOT
    merged = tok.encode(" the")
    assert len(merged) == 1  # a frequent word became one token


def test_save_and_load_as_tokenizer_json(tok, tmp_path):
    tok.save(tmp_path / "tokenizer.json")
    data = (tmp_path / "tokenizer.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == tok.hash
    for where in (tmp_path / "tokenizer.json", tmp_path):  # the file, or its directory
        loaded = Tokenizer.load(where)
        assert loaded.hash == tok.hash and loaded.encode(HARD[2]) == tok.encode(HARD[2])
    plain = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert plain.encode(HARD[3], add_special_tokens=False).ids == tok.encode(HARD[3])
    (tmp_path / "run").mkdir()
    tok.save(tmp_path / "run")  # a directory gets a tokenizer.json inside
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == data


def test_decode_accepts_tensors_and_arrays(tok):
    ids = tok.encode("thou art fair")
    assert tok.decode(torch.tensor(ids)) == tok.decode(np.array(ids)) == tok.decode(tuple(ids)) == "thou art fair"
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(torch.tensor([ids]))
    with pytest.raises(ValueError, match=r"decode's input holds ids outside 0..399 \(min 1, max 400\)"):
        tok.decode([1, 400])


def test_decode_of_a_cut_character_gives_replacement_char(tok):
    ids = tok.encode("🎉")  # four bytes, four tokens: no merges learned for it
    assert len(ids) == 4
    assert tok.decode(ids[:2]) == "\ufffd" and tok.decode(ids[:2] + ids[2:]) == "🎉"


def test_bad_input_to_encode(tok):
    with pytest.raises(TypeError, match="encode takes str, got bytes"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("a\ud800b")
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode_batch(["fine", "bad \udcff"])


def test_vocab_smaller_than_the_byte_alphabet_is_refused():
    with pytest.raises(ConfigError, match=r"at least 257 \(256 bytes \+ <\|endoftext\|>\), got 256"):
        Tokenizer.train(["abc"], vocab_size=256)
    with pytest.raises(ConfigError, match="data.vocab_size must be at least 257"):
        DataConfig(vocab_size=200)


def test_small_corpus_gives_a_smaller_vocab():
    tiny = Tokenizer.train(["ab ab ab"], vocab_size=1000)
    assert 257 <= tiny.vocab_size < 1000
    assert tiny.decode(tiny.encode("ab ba")) == "ab ba"


def test_load_missing_or_corrupt(tmp_path):
    with pytest.raises(MinitfError, match="no tokenizer at"):
        Tokenizer.load(tmp_path / "nope.json")
    with pytest.raises(MinitfError, match="no tokenizer at"):
        Tokenizer.load(tmp_path)  # a directory without tokenizer.json
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(MinitfError, match="is not a valid tokenizer.json"):
        Tokenizer.load(tmp_path)
    plain = tokenizers.Tokenizer(tokenizers.models.BPE())
    plain.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(MinitfError, match="has no end-of-text token"):
        Tokenizer.load(tmp_path)


def _unbounded_train(texts: list[str], vocab_size: int) -> str:
    """tokenizer.json as Tokenizer.train made it before pieces were bounded: the plain GPT-2 split."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer)
    return backend.to_str(pretty=True)


def test_bounded_pieces_change_nothing_for_ordinary_text(tok):
    # no word or run in corpus() is near MAX_PIECE_BYTES: the learned merges and the saved file are
    # byte for byte what the unbounded GPT-2 split gives, so GGUF/HF exports tokenize as before
    assert tok.to_json() == _unbounded_train(corpus(), 400)
    assert json.loads(tok.to_json())["pre_tokenizer"] == {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }


def test_a_megabyte_without_whitespace_trains_and_round_trips():
    # one 1 MB "word" (a DNA-like or minified line): training was quadratic in its length (minutes)
    rng = random.Random(0)
    text = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=1 << 20))
    tok = Tokenizer.train([text, "and some ordinary words after it"], vocab_size=1024)
    assert tok.vocab_size == 1024
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) * 0.6  # merges were learned inside the long run
    longest = max(len(tok.backend.decode([i])) for i in range(tok.vocab_size) if i != tok.eot_id)
    assert 2 <= longest <= MAX_PIECE_BYTES


def test_check_ids_one_message_for_tensors_and_sequences():
    for ids in ([0, 5, 9], (3,), np.array([1, 2]), torch.tensor([[0, 9]]), [], torch.tensor([], dtype=torch.long)):
        check_ids(ids, 10)  # in range, or empty: nothing to refuse
    message = r"idx holds ids outside 0..9 \(min -1, max 10\); encode with the model's own tokenizer"
    for ids in ([-1, 10], np.array([-1, 10]), torch.tensor([[-1], [10]])):
        with pytest.raises(ConfigError, match=message):
            check_ids(ids, 10, "idx")
    for wrong in ([1, True], [1, 2.0], ["a"]):
        with pytest.raises(ValueError, match=r"ids holds .*, which is not a token id \(an int in 0..9\)"):
            check_ids(wrong, 10)


def test_check_text_names_the_lone_surrogate():
    check_text("café")
    with pytest.raises(ConfigError, match=r"the prompt is not valid UTF-8: a lone surrogate '\\udce9' at character 3"):
        check_text("caf\udce9", "the prompt")
