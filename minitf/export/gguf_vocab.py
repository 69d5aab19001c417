"""The tokenizer inside a GGUF file, as one of the two vocabularies llama.cpp tokenizes with, chosen so
that llama.cpp turns every text into the ids minitf does (tests/integration/test_gguf_llamacpp.py checks
both against llama.cpp itself):

- byte-level BPE, llama.cpp's "gpt2" vocabulary: minitf's own tokenizer and the downloaded ones built the
  same way (GPT-2's, Llama 3's, Qwen's, SmolLM's). The file holds the tokens, their merges and the name
  llama.cpp gives the tokenizer's split of text into words (its "pre-tokenizer"), since llama.cpp
  implements each known split in code rather than reading it from the file.
- SentencePiece-style BPE, llama.cpp's "llama" vocabulary: Mistral's, Llama 2's and Gemma's, whose
  tokenizer.json spells a space as ▁, falls back to <0xXX> byte tokens for a character it lacks, and
  has a merge for every way of cutting a token in two, ranked by the token (what transformers writes
  from a SentencePiece model). llama.cpp merges the adjacent pair whose joined text is the token of the
  highest score, so each token's score is minus the rank of its first merge: the order in which minitf's
  BPE applies them (_first_ranks says where the two can still differ). Whether a space is put before
  the text (Mistral's, Llama 2's; not Gemma's) is add_space_prefix.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from ..errors import MinitfError
from ..tokenizer import Tokenizer

# the name llama.cpp gives the GPT-2 regex split, which HF tokenizers' ByteLevel(use_regex=True)
# performs: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2_PRE = "gpt-2"
# a downloaded tokenizer's own split (a Split regex, then ByteLevel without GPT-2's regex), by the name
# llama.cpp gives it, and whether its BPE takes a whole word found in the vocabulary before any merge
# (ignore_merges: llama.cpp's llama-bpe does, its qwen2 does not). Llama 3 groups digits by three, Qwen
# splits them one by one; both keep a newline run apart from the spaces before a word.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|{digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NAMED_SPLITS = {
    _SPLIT.replace("{digits}", r"\p{N}{1,3}"): ("llama-bpe", True),  # Llama 3.x
    _SPLIT.replace("{digits}", r"\p{N}"): ("qwen2", False),  # Qwen2, Qwen2.5, Qwen3
}
SPACE = "▁"  # SentencePiece's visible space (U+2581)
SENTENCEPIECE = "llama"  # llama.cpp's name for the SentencePiece-style vocabulary
_REPLACE_SPACE = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
# SentencePiece-style text preparation in tokenizer.json (normalizer, pre-tokenizer) -> add_space_prefix:
# Gemma's (spaces only; transformers adds a split at spaces, which are all ▁ by then; also written as a
# Metaspace that never prepends) and Mistral's and Llama 2's as transformers writes them (a ▁ before
# each text between special tokens, where llama.cpp puts a space). A Metaspace that prepends is not
# llama.cpp's: it puts no ▁ before a text that starts with a space.
_AT_SPACES = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
_PREFIXES = (
    (_REPLACE_SPACE, None, False),
    (_REPLACE_SPACE, _AT_SPACES, False),
    (None, {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "never", "split": False}, False),
    ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, _REPLACE_SPACE]}, None, True),
)


def gguf_package():
    try:
        import gguf
    except ImportError:
        raise MinitfError("the gguf package is not installed; pip install -e '.[gguf]' (or pip install gguf)") from None
    return gguf


class Vocabulary(NamedTuple):
    """A tokenizer as checked for llama.cpp: its kind (the byte-level split's llama.cpp name, or
    SENTENCEPIECE), its parsed tokenizer.json, and a SentencePiece-style one's first merge ranks."""

    kind: str
    spec: dict
    first_ranks: dict[str, int] | None


def check_tokenizer(tokenizer: Tokenizer) -> str:
    """How llama.cpp tokenizes exactly as `tokenizer` does: the name of its byte-level BPE split
    (GPT-2's; a downloaded Llama 3's or Qwen's, NAMED_SPLITS; SmolLM's digits, then GPT-2's split),
    or SENTENCEPIECE; MinitfError naming what differs otherwise. Qwen's NFC normalizer is taken too,
    as llama.cpp's own converter takes it: llama.cpp does not normalize, which changes nothing for
    text already in NFC."""
    return checked_vocabulary(tokenizer).kind


def checked_vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    """check_tokenizer's check, keeping what add_tokenizer writes from (parsed and ranked once)."""
    spec = json.loads(tokenizer.to_json())
    model = spec.get("model") or {}
    unsupported = ("dropout", "continuing_subword_prefix", "end_of_word_suffix")
    why = [f"BPE {key}={model[key]!r}" for key in unsupported if model.get(key)]
    name, first = None, None
    if model.get("type") != "BPE":
        why.append(f"a {model.get('type')} model")
    elif model.get("byte_fallback"):
        name, first = SENTENCEPIECE, _first_ranks(model)
        why += _sentencepiece_differences(spec, first)
    else:
        name, more = _byte_level_differences(spec)
        why += more
    if why:
        raise MinitfError(
            f"this tokenizer has {', '.join(why)}; llama.cpp knows byte-level BPE pre-tokenizers by name and "
            f"minitf writes GPT-2's ({GPT2_PRE!r}: ByteLevel, no prefix space, no normalizer), Llama 3's "
            f"('llama-bpe'), Qwen's ('qwen2') and SmolLM's ('smollm'), and SentencePiece-style BPE as "
            f"transformers writes Mistral's and Gemma's, so this run cannot be exported to GGUF; export it "
            f"with `minitf export` (Hugging Face) instead"
        )
    return Vocabulary(name, spec, first)


def _byte_level_differences(spec: dict) -> tuple[str | None, list[str]]:
    """(llama.cpp's name for this byte-level tokenizer's split, what keeps llama.cpp from tokenizing as it does)."""
    pre, model, normalizer = spec.get("pre_tokenizer") or {}, spec["model"], spec.get("normalizer")
    name, ignore_merges = _named_split(pre)
    why = []
    if normalizer and not (name == "qwen2" and normalizer.get("type") == "NFC"):
        why.append(f"a {normalizer.get('type')} normalizer")
    if name is None:
        why.append(f"the pre-tokenizer {json.dumps(pre, sort_keys=True)}")
    elif bool(model.get("ignore_merges")) != ignore_merges:
        have, its = (str(x).lower() for x in (bool(model.get("ignore_merges")), ignore_merges))
        why.append(f"BPE ignore_merges={have} where llama.cpp's {name} has {its}")
    return name, why


def _named_split(pre: dict) -> tuple[str | None, bool]:
    """(llama.cpp's name, its ignore_merges) for a pre-tokenizer it knows, else (None, False)."""
    if pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space") and pre.get("use_regex", True):
        return GPT2_PRE, False
    parts = pre.get("pretokenizers") or []
    if pre.get("type") != "Sequence" or len(parts) != 2:
        return None, False
    split, level = parts
    if split == {"type": "Digits", "individual_digits": True} and level.get("type") == "ByteLevel":
        # SmolLM's: each digit alone, then GPT-2's split
        return ("smollm", False) if not level.get("add_prefix_space") and level.get("use_regex") else (None, False)
    regex = (split.get("pattern") or {}).get("Regex") if split.get("type") == "Split" else None
    plain = split.get("behavior") == "Isolated" and not split.get("invert")
    bytes_only = level.get("type") == "ByteLevel" and not level.get("add_prefix_space") and not level.get("use_regex")
    return NAMED_SPLITS.get(regex, (None, False)) if plain and bytes_only else (None, False)


def _sentencepiece_differences(spec: dict, first_ranks: dict[str, int] | None) -> list[str]:
    """What keeps llama.cpp's SentencePiece-style vocabulary from tokenizing as this byte-fallback BPE
    does (first_ranks: _first_ranks' answer)."""
    model, why = spec["model"], []
    if _space_prefix(spec) is None:
        shown = {k: spec.get(k) for k in ("normalizer", "pre_tokenizer")}
        why.append(
            f"byte_fallback with {json.dumps(shown, ensure_ascii=False)} (llama.cpp's SentencePiece-style "
            f"vocabulary writes each space as {SPACE} and puts one before every text or before none)"
        )
    if model.get("ignore_merges"):
        why.append("byte_fallback with ignore_merges=true")
    vocab = model.get("vocab", {})
    # a byte llama.cpp may need as <0xXX>: one of a character the vocabulary lacks (Gemma's tab is "\t" itself)
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab and not (b < 128 and chr(b) in vocab)]
    if missing:
        why.append(f"byte_fallback without the byte token {missing[0]}")
    if first_ranks is None:
        why.append("byte_fallback with merges that are not one for each cut of a token in two")
    return why


def _space_prefix(spec: dict) -> bool | None:
    """llama.cpp's add_space_prefix for a SentencePiece-style tokenizer's text preparation; None for
    one it does not follow."""
    found = (p for n, pre, p in _PREFIXES if spec.get("normalizer") == n and spec.get("pre_tokenizer") == pre)
    return next(found, None)


def _first_ranks(model: dict) -> dict[str, int] | None:
    """Token -> the rank of the first merge that makes it; None unless there is a merge for every cut
    of a token into two tokens, as transformers writes SentencePiece's: llama.cpp joins any adjacent
    pair whose text is a token, the best-scored first, so a cut without a merge would be joined there
    and not here. The order is then minitf's wherever a piece's merges come together in the list,
    which they do but for pieces of equal SentencePiece score (Gemma's whitespace runs, say): there
    llama.cpp, like SentencePiece itself, takes the leftmost pair where minitf takes the earlier merge."""
    vocab, first, cuts = model.get("vocab", {}), {}, {}
    for rank, merge in enumerate(model.get("merges", [])):
        token = "".join(merge.split(" ", 1) if isinstance(merge, str) else merge)
        first.setdefault(token, rank)
        cuts[token] = cuts.get(token, 0) + 1
    for token in vocab:
        if cuts.get(token, 0) != sum(token[:k] in vocab and token[k:] in vocab for k in range(1, len(token))):
            return None
    return first


def _merges(spec: dict) -> list[str]:
    """BPE merges as "left right" strings, in rank order (tokenizers writes pairs or strings)."""
    return [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]


def add_tokenizer(writer, tokenizer: Tokenizer, vocabulary: Vocabulary) -> None:
    """Write the tokenizer's vocabulary (checked_vocabulary's), its end-of-text (and chat) tokens and its template."""
    kind, spec, first = vocabulary
    tokens, types = _tokens_and_types(tokenizer, spec, sentencepiece=kind == SENTENCEPIECE)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if kind == SENTENCEPIECE:
        writer.add_tokenizer_model(SENTENCEPIECE)
        writer.add_token_scores([-float(first[t]) if t in first else 0.0 for t in tokens])
        writer.add_add_space_prefix(_space_prefix(spec))
        unk = tokenizer.backend.token_to_id(spec["model"].get("unk_token") or "")
        if unk is not None:
            writer.add_unk_token_id(unk)
    else:
        writer.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
        writer.add_tokenizer_pre(kind)
        writer.add_token_merges(_merges(spec))
    template = getattr(tokenizer, "chat_template", None)
    # a downloaded template's own bos_token (Llama 3's <|begin_of_text|>, which it writes first), else the end of text
    bos = tokenizer.backend.token_to_id(template.special.get("bos_token", "")) if template is not None else None
    writer.add_bos_token_id(tokenizer.eot_id if bos is None else bos)
    if template is None:
        writer.add_eos_token_id(tokenizer.eot_id)
    else:  # a chat model: llama.cpp's chat renders the template and ends the answer at the end of its turn
        writer.add_chat_template(template.source)
        writer.add_eos_token_id(template.end_of_turn(tokenizer))
        writer.add_eot_token_id(template.end_of_turn(tokenizer))
    writer.add_add_bos_token(False)  # minitf adds no special token around a prompt
    writer.add_add_eos_token(False)


def _tokens_and_types(tokenizer: Tokenizer, spec: dict, sentencepiece: bool) -> tuple[list[str], list]:
    """Every token's text, in id order, and its llama.cpp type: special added tokens (<|endoftext|>, <s>)
    control generation, other added ones are user text matched whole; a SentencePiece-style vocabulary's
    <0xXX> tokens are bytes and its unk token is UNKNOWN."""
    gguf = gguf_package()
    added = tokenizer.backend.get_added_tokens_decoder()  # {id: AddedToken}
    unk = spec["model"].get("unk_token") if sentencepiece else None
    tokens, types = [], []
    for i in range(tokenizer.vocab_size):
        token = tokenizer.backend.id_to_token(i)
        if token is None:
            raise MinitfError(f"the tokenizer has no token with id {i}; its ids must run 0..{tokenizer.vocab_size - 1}")
        tokens.append(token)
        if sentencepiece and token == unk:
            types.append(gguf.TokenType.UNKNOWN)
        elif i in added:
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        elif sentencepiece and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, types
