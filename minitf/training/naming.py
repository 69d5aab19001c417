"""What a new run's config.yaml says it is: its name, and a sample prompt in its corpus's style."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..config import Config, DataConfig, SampleConfig
from ..data import TokenData
from ..system.recipes import recipes

PROMPT_CHARS = 20  # about how much of a long line a fitting prompt takes: a few words


def name_and_prompt(cfg: Config, data: TokenData, log: Callable) -> None:
    """Name the run after its directory, and give a run on another text than Shakespeare's a prompt
    from its own validation text. A run.name or sample.prompt the user set is kept.

    run.out_dir=runs/novel alone names the run "novel", not the recipe's name. Shakespeare's
    "Romeo." would not fit another corpus, so generate and the explorer start from the start of a
    validation document instead (fitting_prompt).
    """
    name, shakespeare = Path(cfg.run.out_dir).name, _default(SampleConfig, "prompt")
    if name and cfg.run.name in recipes():  # a recipe's own name (each names itself), not the user's
        cfg.run.name = name
    if (
        cfg.sample.prompt != shakespeare
        or cfg.data.source == _default(DataConfig, "source")
        or data.tokenizer.chat_template is not None  # a chat model is asked questions, not given a prompt
    ):
        return
    prompt = fitting_prompt(data)
    if prompt:
        cfg.sample.prompt = prompt
        log(
            f"sample.prompt: {prompt!r}, the start of a validation document (Shakespeare's "
            f"{shakespeare!r} does not fit {cfg.data.source}); set sample.prompt to choose another"
        )


def fitting_prompt(data: TokenData) -> str:
    """A prompt in the corpus's own style, from the start of its validation text ("" if it has none).

    It is the first line, with its line break, when the line is short, else the line's first words
    (about PROMPT_CHARS characters). When the split may have cut a document mid-line (one document
    on each side), the text starts past its first line break.
    """
    ids = data.tokens("val")[:512].tolist()
    eot = data.tokenizer.eot_id
    text = data.tokenizer.decode(ids[: ids.index(eot)] if eot in ids else ids)
    splits = data.meta["splits"]
    if splits["train"]["documents"] == 1 == splits["val"]["documents"] and "\n" in text:
        text = text.split("\n", 1)[1]  # one document, cut by characters: begin at a line's start
    text = text.lstrip("\n")
    line, newline, _ = text.partition("\n")
    if len(line) <= 2 * PROMPT_CHARS and line.strip():
        return line + newline
    words = line[: PROMPT_CHARS + 1].rsplit(" ", 1)[0] if " " in line[:PROMPT_CHARS] else line[:PROMPT_CHARS]
    return words.strip() and words


def _default(section: type, key: str):
    """A config key's default value, as its dataclass declares it."""
    return next(f.default for f in dataclasses.fields(section) if f.name == key)
