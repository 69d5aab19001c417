"""Supervised fine-tuning's set-up (data.format=chat): the model to start from, its chat template, and
the template's tokens in its vocabulary.

A chat run starts from a trained model (run.init_from: a minitf run or a Hugging Face directory).
A downloaded Llama or Qwen3 brings its own template and tokens. A minitf base model gets ChatML:
its two markers, <|im_start|> and <|im_end|>, are added to the tokenizer as special tokens after
its vocabulary, and the model grows an embedding row (and an output row) for each. A new row
starts at the mean of the trained rows: the new token then looks to the first layer like an
average token, and its logit starts at an average logit. A random row of the initial scale would
be an outlier the model has never seen, and a row of zeros gives every new token the same
direction; the mean is what Hugging Face's resize_token_embeddings uses too. The run keeps its
template as chat_template.jinja beside tokenizer.json.

Under LoRA (train.lora_rank) the model is frozen but its adapters, so ChatML's two rows would keep
the mean, and the model could never learn to end its turn: `template_tokens` names them, and their
rows train beside the adapters (training/lora.py). A model that brought its own template has rows for
its markers, trained with it, and nothing more trains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..chat_template import CHATML, IM_END, IM_START, add_chat_tokens, chatml
from ..config import Config
from ..errors import ConfigError, MinitfError
from ..model import Transformer
from ..system.sizes import padded_vocab
from ..tokenizer import Tokenizer
from .template_files import load_template


def chat_model(
    cfg: Config, pretrained: Transformer | None, tokenizer: Tokenizer | None, run_dir: Path | None, log: Callable
) -> tuple[Transformer | None, Tokenizer]:
    """(model, tokenizer) for a chat run: a resume's own (run_dir), or the pretrained model with a
    chat template, ChatML's tokens added when it has none."""
    if run_dir is not None:  # a resume: the template the run recorded
        tokenizer.chat_template = load_template(run_dir)
        if tokenizer.chat_template is None:
            raise MinitfError(
                f"{run_dir} has no chat_template.jinja, so it is not a chat run; resume it with its own config"
            )
        return pretrained, tokenizer
    if pretrained is None:
        raise ConfigError(
            "data.format=chat fine-tunes a trained model: set run.init_from to a minitf run (e.g. runs/shakespeare, "
            "from python scripts/train.py) or a Hugging Face directory"
        )
    if tokenizer.chat_template is not None:
        log(f"chat: the template of {cfg.run.init_from}, ending each answer with {_end_word(tokenizer)}")
        return pretrained, tokenizer
    grown = add_chat_tokens(tokenizer)
    grown.chat_template = chatml()
    if grown.vocab_size != tokenizer.vocab_size:
        pretrained = grow_vocab(pretrained, grown.vocab_size)
        log(
            f"chat: ChatML; {IM_START} and {IM_END} added as tokens {tokenizer.vocab_size}..{grown.vocab_size - 1}, "
            f"their embedding rows starting at the mean of the trained rows"
        )
    return pretrained, grown


def grow_vocab(model: Transformer, vocab_size: int) -> Transformer:
    """model with vocab_size tokens: the old rows as they were, each new one the mean of the old (the
    embedding, and the output matrix when it is not tied). Every other tensor is model's own, shared,
    not copied: a downloaded model is not held twice (model is not used again)."""
    old, C = model.config.vocab_size, model.config.n_embd
    state = dict(model.state_dict())
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # the embedding, once more: tied again to the grown one
    for name in ("wte.weight", "lm_head.weight"):
        if name not in state:
            continue
        rows = state[name].new_zeros(padded_vocab(vocab_size), C)  # (padded V', C)
        rows[:old] = state[name][:old]
        rows[old:vocab_size] = state[name][:old].mean(dim=0)  # (C,) broadcast over the new rows
        state[name] = rows
    grown = Transformer.holding(dataclasses.replace(model.config, vocab_size=vocab_size), state)
    return grown.train(model.training)


def template_tokens(tokenizer: Tokenizer) -> list[int]:
    """The ids of the tokens minitf gave a chat run for its template, whose rows must learn even
    where nothing else does (LoRA): ChatML's two markers when the run's template is minitf's ChatML
    (a base model's, added by chat_model); [] for a model with a template of its own, or no chat."""
    template = tokenizer.chat_template
    if template is None or template.source != CHATML:
        return []
    return [tokenizer.backend.token_to_id(IM_START), tokenizer.backend.token_to_id(IM_END)]


def _end_word(tokenizer: Tokenizer) -> str:
    eot = tokenizer.chat_template.end_of_turn(tokenizer)
    return f"{tokenizer.decode([eot])!r} (id {eot})"
