"""generate's arguments, checked: the prompt (its text has no lone surrogate; its ids are its last
block_size, or <|endoftext|> for an empty prompt), the sampling settings (a SampleConfig and
keyword overrides; SETTINGS, the ones the command line and the explorer take), and the types
of what generate, stream and stream_tokens are given (a TypeError naming the parameter, not an
AttributeError from deep inside).
"""

from __future__ import annotations

import dataclasses
import typing
import warnings

from ..config import SampleConfig
from ..errors import ConfigError, shown
from ..model import Transformer
from ..tokenizer import Tokenizer, check_text


def prompt_ids(tokenizer: Tokenizer, prompt: str, block_size: int) -> list[int]:
    """The ids generation starts from: the prompt's, or <|endoftext|> for an empty one (a new
    document); a prompt longer than block_size keeps its last block_size (with a warning)."""
    check_prompt_text(prompt)
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    if len(ids) > block_size:
        warnings.warn(
            f"prompt is {len(ids)} tokens, longer than block_size {block_size}; keeping its last {block_size}",
            stacklevel=2,
        )
        ids = ids[-block_size:]
    return ids


def chat_prompt_ids(ids: list[int], block_size: int) -> list[int]:
    """A chat's prompt ids: they must leave room for an answer, as cutting a conversation's start
    would cut its template (a ConfigError saying how long it is)."""
    if len(ids) >= block_size:
        raise ConfigError(
            f"the conversation is {len(ids)} tokens, which leaves no room for an answer in the model's "
            f"block_size of {block_size}; start a new conversation or shorten it"
        )
    return ids


def check_prompt_text(prompt: str) -> None:
    """A prompt with a lone surrogate (bytes that were not UTF-8 on the command line) has no tokens."""
    check_text(prompt, "the prompt")


def check_arguments(fn: str, model, tokenizer, prompt, stop=None, num_samples: int = 1) -> None:
    """A TypeError naming the parameter when a caller passes the wrong kind of thing (swapped
    model and tokenizer, a prompt that is not text, ...), instead of an AttributeError from deep
    inside. The settings are sample_settings' to check."""
    usage = f"{fn}(model, tokenizer, prompt, settings=None, **settings)"
    if not isinstance(model, Transformer) and not isinstance(getattr(model, "_orig_mod", None), Transformer):
        raise TypeError(
            f"{fn}(): model must be a minitf Transformer (from minitf.load_run), got {_kind(model)}; {usage}"
        )
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(
            f"{fn}(): tokenizer must be a minitf Tokenizer (from minitf.load_run), got {_kind(tokenizer)}; {usage}"
        )
    if not isinstance(prompt, str):
        hint = " (decode bytes first)" if isinstance(prompt, (bytes, bytearray)) else ""
        raise TypeError(f"{fn}(): prompt must be text (a str), got {_kind(prompt)}{hint}; {usage}")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise TypeError(f"{fn}(): stop must be a str or a list of str, got {_kind(stop)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int):
        raise TypeError(f"{fn}(): num_samples must be an int, got {_kind(num_samples)}")


def _kind(value) -> str:
    return (
        f"{type(value).__name__} {shown(value, 40)}"
        if isinstance(value, (str, int, float, bytes))
        else type(value).__name__
    )


def sample_settings(settings: SampleConfig | None = None, **overrides) -> SampleConfig:
    """settings (default: SampleConfig()) with keyword overrides applied, validated as a whole."""
    if settings is not None and not isinstance(settings, SampleConfig):
        hint = " (SampleConfig(**d), or the settings as keyword arguments)" if isinstance(settings, dict) else ""
        raise TypeError(f"settings must be a minitf SampleConfig or None, got {type(settings).__name__}{hint}")
    settings = settings or SampleConfig()
    known = {f.name for f in dataclasses.fields(SampleConfig)}
    for name in overrides:
        if name not in known:
            raise ConfigError(f"unknown sampling setting {name!r}; valid: {', '.join(sorted(known))}")
    return dataclasses.replace(settings, **overrides) if overrides else settings


def _settings() -> dict[str, tuple[type, bool]]:
    hints, out = typing.get_type_hints(SampleConfig), {}
    for f in dataclasses.fields(SampleConfig):
        args = typing.get_args(hints[f.name])  # (int, NoneType) for int | None, () for int
        if f.name != "prompt":
            out[f.name] = (next(t for t in args if t is not type(None)), True) if args else (hints[f.name], False)
    return out


# the settings of how to sample, read from SampleConfig (its prompt aside): name -> (int or float,
# whether null is allowed); the command line and the explorer take exactly these
SETTINGS: dict[str, tuple[type, bool]] = _settings()
