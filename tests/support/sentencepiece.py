"""A SentencePiece-style tokenizer.json as transformers writes Mistral's, Llama 2's and Gemma's from
their SentencePiece models (the real files are hundreds of thousands of tokens and need the network):
spaces as ▁, special tokens first, the 256 <0xXX> byte tokens (Gemma's tab as "\t" itself), then
pieces, each with a score; a merge for every cut of a piece into two pieces, ordered as transformers'
generate_merges orders them (by the piece's score, then the longer left part), so that pieces of equal
score (Gemma's whitespace runs, user-defined at score 0) have their merges interleaved; byte_fallback
for a character the vocabulary lacks."""

import json

import minitf

SPACE = "▁"
# the text preparations of tokenizer.json that mean "a ▁ before the text" (Mistral's, Llama 2's) or not
# (Gemma's): (normalizer, pre_tokenizer)
_REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
_AT_SPACES = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
STYLES = {
    "gemma": (_REPLACE, _AT_SPACES),  # transformers' GemmaConverter
    "mistral": ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, _REPLACE]}, None),
    "metaspace-never": (None, {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "never", "split": False}),
    # transformers' newer Llama 2 conversion: a ▁ before the first text unless it starts with a space
    "metaspace-first": (None, {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "first", "split": False}),
}
PREFIXED = ("mistral", "metaspace-first")
ADDED = {  # the first tokens of Gemma's vocabulary and of Mistral's, all special
    "gemma": dict.fromkeys(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], True),
    "mistral": dict.fromkeys(["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], True),
}
RUNS = [SPACE * n for n in range(2, 6)] + ["\n" * n for n in range(2, 4)]  # Gemma's user-defined pieces


def sentencepiece_style(texts: list[str], pieces: int, style: str, added: dict | None = None) -> minitf.Tokenizer:
    """A tokenizer of about `pieces` learned pieces plus <unk>, the `added` tokens ({text: special}; the
    style's own by default) and the bytes, in `style` (STYLES)."""
    added = {"<unk>": True, **(added or ADDED.get(style, ADDED["mistral"]))}
    gemma = style == "gemma"
    byte_tokens = ["\t" if gemma and b == 9 else f"<0x{b:02X}>" for b in range(256)]
    runs = RUNS if gemma else []
    learned = [t for t in _learned(texts, pieces) if t not in {*added, *byte_tokens, *runs}]
    # (piece, score): SentencePiece scores a learned piece by its merge order, the others at 0
    scored = [(t, 0.0) for t in [*added, *byte_tokens, *runs]] + [(t, -float(i)) for i, t in enumerate(learned)]
    vocab = {t: i for i, (t, _) in enumerate(scored)}
    merges = []
    for piece, score in scored:
        cuts = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(score, left, right) for left, right in sorted(cuts, key=lambda c: (vocab[c[0]], vocab[c[1]]))]
    merges.sort(key=lambda m: (m[0], len(m[1]), len(m[2])), reverse=True)
    normalizer, pre = STYLES[style]
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}]
    decoders.append({"type": "Fuse"})
    if style in PREFIXED:  # the ▁ put before the text is taken off again
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    added_tokens = [
        dict(id=vocab[t], content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        for t, special in added.items()
    ]
    model = dict(type="BPE", dropout=None, unk_token="<unk>")
    model.update(continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True, byte_fallback=True)
    model.update(ignore_merges=False, vocab=vocab, merges=[[left, right] for _, left, right in merges])
    spec = dict(version="1.0", truncation=None, padding=None, added_tokens=added_tokens, normalizer=normalizer)
    spec.update(pre_tokenizer=pre, post_processor=None, decoder={"type": "Sequence", "decoders": decoders})
    return minitf.Tokenizer.load_str(json.dumps({**spec, "model": model}))


def _learned(texts: list[str], pieces: int) -> list[str]:
    """Pieces learned as SentencePiece learns them (a word starts with ▁, no piece spans two words), in
    the order they were learned."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    learn = Tokenizer(models.BPE())
    learn.normalizer = normalizers.Replace(" ", SPACE)
    learn.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    learn.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=pieces, show_progress=False))
    return [t for t, _ in sorted(learn.get_vocab().items(), key=lambda kv: kv[1])]
