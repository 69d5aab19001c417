"""A SentencePiece-style tokenizer.json as transformers writes Mistral's, Llama 2's and Gemma's (their
real files are hundreds of thousands of tokens and need the network): spaces as ▁, special tokens
first, the 256 <0xXX> byte tokens, then pieces; a merge for every cut of a piece into two pieces,
ranked by the piece; byte_fallback for a character the vocabulary lacks."""

import json

import minitf

SPACE = "▁"
# the text preparations of tokenizer.json that mean "a ▁ before the text" (Mistral's, Llama 2's) or not
# (Gemma's): (normalizer, pre_tokenizer)
_REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
STYLES = {
    "gemma": (_REPLACE, None),
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


def sentencepiece_style(texts: list[str], pieces: int, style: str, added: dict | None = None) -> minitf.Tokenizer:
    """A tokenizer of about `pieces` learned pieces plus <unk>, the `added` tokens ({text: special}; the
    style's own by default) and the bytes, in `style` (STYLES)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    # learn pieces as SentencePiece does: words start with ▁ and no piece spans two words
    learn = Tokenizer(models.BPE())
    learn.normalizer = normalizers.Replace(" ", SPACE)
    learn.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    learn.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=pieces, show_progress=False))
    learned = [t for t, _ in sorted(learn.get_vocab().items(), key=lambda kv: kv[1])]
    added = {"<unk>": True, **(added or ADDED.get(style, ADDED["mistral"]))}
    specials = list(added)
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)] + learned)}
    merges = sorted(
        (vocab[t], vocab[t[:k]], vocab[t[k:]], t[:k], t[k:])
        for t in learned
        for k in range(1, len(t))
        if t[:k] in vocab and t[k:] in vocab
    )
    normalizer, pre = STYLES[style]
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}, {"type": "ByteFallback"}]
    decoders.append({"type": "Fuse"})
    if style in PREFIXED:  # the ▁ put before the text is taken off again
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    added_tokens = [
        dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=added[t])
        for i, t in enumerate(specials)
    ]
    model = dict(type="BPE", dropout=None, unk_token="<unk>")
    model.update(continuing_subword_prefix=None, end_of_word_suffix=None, fuse_unk=True, byte_fallback=True)
    model.update(ignore_merges=False, vocab=vocab, merges=[[a, b] for *_, a, b in merges])
    spec = dict(version="1.0", truncation=None, padding=None, added_tokens=added_tokens, normalizer=normalizer)
    spec.update(pre_tokenizer=pre, post_processor=None, decoder={"type": "Sequence", "decoders": decoders})
    return minitf.Tokenizer.load_str(json.dumps({**spec, "model": model}))
