"""Text to ids and back: byte-level BPE, and the checks that ids fit a model.

Every string is first turned into UTF-8 bytes and each byte into one of 256 base tokens, so any
input encodes (no unknown token) and decode(encode(s)) == s. BPE merges are learned on top of
those bytes. One special token, <|endoftext|>, separates documents in the token stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from .errors import ConfigError, MinitfError, first_line, shown

EOT = "<|endoftext|>"
# the document separators a tokenizer may have, the first it has being its own: minitf's and GPT-2's
# (Qwen's, Phi's too), Llama 3's, Gemma's, Llama 2's and Mistral's end of text
SEPARATORS = (EOT, "<|end_of_text|>", "<eos>", "</s>")
MIN_VOCAB = 256 + 1  # every byte, plus <|endoftext|>
# While merges are learned, a pre-tokenized piece (a word, a run of spaces or of punctuation) longer
# than this many bytes is cut into pieces of at most this many. BPE training costs about
# (piece length x merges that touch it), so one long run without whitespace (a DNA sequence, a
# minified file) made it quadratic: 1 MB of letters took minutes, now seconds. Only training sees
# the cut: the saved tokenizer splits text exactly as GPT-2 (and llama.cpp's "gpt-2") do, and a
# token can never be longer than this, which no real word needs.
MAX_PIECE_BYTES = 256


class Tokenizer:
    """A trained byte-level BPE tokenizer; saved as a standard `tokenizer.json`.

    The file loads with `tokenizers.Tokenizer.from_file` and with transformers'
    `PreTrainedTokenizerFast(tokenizer_file=...)`. A literal "<|endoftext|>" inside a text
    encodes as the separator token (as GPT-2 in transformers does) and decodes back to itself.
    A downloaded model's tokenizer separates documents with its own end of text (`eot`, the first
    of SEPARATORS it has: Llama 3's <|end_of_text|>, Gemma's <eos>, Mistral's </s>).
    """

    def __init__(self, backend: HFTokenizer):
        self.eot = next((t for t in SEPARATORS if backend.token_to_id(t) is not None), None)
        if self.eot is None:
            raise MinitfError(
                f"this tokenizer has no end-of-text token ({', '.join(SEPARATORS)}); train one with "
                f"minitf.Tokenizer.train"
            )
        self.backend = backend  # the HF tokenizers object, for anything not wrapped here
        self._eot_id = backend.token_to_id(self.eot)
        self._hash: str | None = None
        self._as_text: HFTokenizer | None = None  # a copy that reads special tokens as text (encode_with_offsets)
        # a chat model's template (chat_template.ChatTemplate), set by whoever loads one: load_run, the HF reader
        self.chat_template = None

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> Tokenizer:
        """Learn BPE merges from `texts` (an iterable of documents) up to `vocab_size` tokens.

        The result can be smaller than `vocab_size` when the corpus runs out of pairs to merge.
        The same texts and vocab_size always give a byte-identical tokenizer.json.
        """
        if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
            raise ConfigError(f"vocab_size must be at least {MIN_VOCAB} (256 bytes + {EOT}), got {vocab_size}")
        backend = HFTokenizer(models.BPE())
        # use_regex splits words GPT-2 style, so merges never cross word/space boundaries
        gpt2_split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # each byte is one character after ByteLevel, so this cuts pieces at MAX_PIECE_BYTES bytes
        bounded = pre_tokenizers.Split(Regex(f".{{1,{MAX_PIECE_BYTES}}}"), behavior="isolated")
        backend.pre_tokenizer = pre_tokenizers.Sequence([gpt2_split, bounded])
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        )
        backend.train_from_iterator(texts, trainer)
        # encoding needs no bound (it merges a piece in n log n), and a plain ByteLevel is what
        # transformers, llama.cpp and every GPT-2 tokenizer.json expect
        backend.pre_tokenizer = gpt2_split
        return cls(backend)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer.json, or the tokenizer.json inside a directory (e.g. a run directory)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise MinitfError(
                f"no tokenizer at {path}; pass a tokenizer.json or a run directory that "
                f"holds one, or train a new one with minitf.Tokenizer.train"
            )
        try:
            backend = HFTokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as e:  # tokenizers raises plain Exception for malformed JSON
            raise MinitfError(
                f"{path} is not a valid tokenizer.json ({first_line(e)}); delete it and train a new tokenizer"
            ) from None
        return cls(backend)

    @classmethod
    def load_str(cls, text: str) -> Tokenizer:
        """A tokenizer from the text of a tokenizer.json."""
        return cls(HFTokenizer.from_str(text))

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json to `path` (a file path, or a directory to hold tokenizer.json)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        path.write_text(self.to_json(), encoding="utf-8")

    def to_json(self) -> str:
        return self.backend.to_str(pretty=True)

    @property
    def hash(self) -> str:
        """sha256 of the tokenizer.json text: equal hashes mean identical tokenization."""
        if self._hash is None:
            self._hash = hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()
        return self._hash

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()  # includes <|endoftext|>

    @property
    def eot_id(self) -> int:
        return self._eot_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no special tokens are added."""
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        except TypeError:  # tokenizers' message ("TextInputSequence must be str") hides the cause
            _check_texts([text])
            raise

    def encode_with_offsets(self, text: str, specials: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` and each token's (start, end) character span in it. specials=False:
        a special token's text (<|im_end|>) is encoded as the characters it is, not as the token."""
        check_text(text)
        backend = self.backend
        if not specials:  # a copy of its own, so that other threads' encodings never change
            if self._as_text is None:
                self._as_text = HFTokenizer.from_str(self.to_json())
                self._as_text.encode_special_tokens = True
            backend = self._as_text
        encoding = backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets

    def special_ids(self) -> set[int]:
        """The ids of the special tokens (<|endoftext|>, and a chat model's turn markers)."""
        return {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel threads."""
        texts = list(texts)
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we never use
        fast = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        try:
            return [e.ids for e in fast(texts, add_special_tokens=False)]
        except TypeError:
            _check_texts(texts)
            raise

    def decode(self, ids) -> str:
        """Text of a 1-D sequence of ids (list, tuple, numpy array or tensor).

        Byte sequences that are not valid UTF-8 (e.g. a character cut in half) come out as U+FFFD.
        """
        if hasattr(ids, "tolist"):  # tensor or numpy array, without importing either here
            ids = ids.tolist()
        ids = list(ids)
        if ids and not isinstance(ids[0], int):
            raise ValueError(f"decode takes a 1-D sequence of token ids, got elements of type {type(ids[0]).__name__}")
        check_ids(ids, self.vocab_size, "decode's input")
        return self.backend.decode(ids, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, hash={self.hash[:12]})"


def check_vocab(tokenizer: Tokenizer, vocab_size: int, fix: str, what: str = "the tokenizer") -> None:
    """Refuse a tokenizer whose vocabulary is not the model's (vocab_size): its ids would index the
    model's padding rows, or rows past them, and `fix` says what to use instead."""
    if tokenizer.vocab_size != vocab_size:
        raise MinitfError(
            f"{what} has {tokenizer.vocab_size} tokens but the model was trained with {vocab_size}; {fix}"
        )


def _check_texts(texts: list) -> None:
    """Explain why tokenizers refused a text: not a str, or a str that is not valid Unicode."""
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"encode takes str, got {type(text).__name__}")
        check_text(text)


def check_text(text: str, what: str = "text") -> None:
    """Refuse a str with a lone surrogate (e.g. from errors='surrogateescape' on bytes that were not
    UTF-8): it has no UTF-8 form, so no tokenizer can encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{what} is not valid UTF-8: a lone surrogate {text[e.start]!r} at character {e.start}; "
            f"re-encode it as UTF-8, or decode it with errors='replace'"
        ) from None


def check_ids(ids, vocab_size: int, what: str = "ids") -> None:
    """Refuse token ids outside 0 .. vocab_size - 1: they would index the model's padding rows, or
    crash deep inside torch. `ids` is a tensor (one pass: aminmax) or a sequence of ints."""
    if hasattr(ids, "aminmax"):  # a tensor, without importing torch here
        if not ids.numel():
            return
        low, high = (int(v) for v in ids.aminmax())
    else:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # a numpy array's ids as ints
        if not ids:
            return
        wrong = next((i for i in ids if isinstance(i, bool) or not isinstance(i, int)), None)
        if wrong is not None:
            raise ConfigError(
                f"{what} holds {shown(wrong)}, which is not a token id (an int in 0..{vocab_size - 1}); "
                f"encode with the model's own tokenizer"
            )
        low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        raise ConfigError(
            f"{what} holds ids outside 0..{vocab_size - 1} (min {low}, max {high}); "
            f"encode with the model's own tokenizer"
        )
