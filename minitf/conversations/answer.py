"""Talking to a chat model: `chat` (the answer to a conversation), `chat_stream` (the answer piece
by piece) and `exact_match` (the share of questions answered exactly, for the generated corpus).

A conversation is a list of {"role", "content"} messages, as OpenAI's API takes them. It is
rendered with the model's chat template (chat_template.py) and the generation prompt, then
sampled as any prompt is (generate.py), until the model ends its turn. A run fine-tuned with
data.format=chat keeps its template beside its weights; `minitf.load_run` hands it over as
`tokenizer.chat_template`.

    model, tok, _ = minitf.load_run("runs/chat")
    minitf.chat(model, tok, [{"role": "user", "content": "What is 2 plus 3?"}], temperature=0)
"""

from __future__ import annotations

from collections import Counter

from ..chat_template import ChatTemplate
from ..config import SampleConfig
from ..errors import ConfigError, MinitfError
from ..generate import text_steps
from ..generation.args import check_arguments, sample_settings
from .rules import BadConversation, check_question


def chat(
    model,
    tokenizer,
    messages: list[dict],
    settings: SampleConfig | None = None,
    *,
    template: ChatTemplate | str | None = None,
    stop=None,
    num_samples: int = 1,
    use_cache: bool = True,
    compile: bool = False,
    info: dict | None = None,
    **overrides,
):
    """The assistant's answer to `messages` (a list of num_samples answers when > 1). Settings and
    overrides are generate's (max_new_tokens, temperature, top_k, top_p, repetition_penalty,
    seed); the answer ends at the template's end-of-turn token, max_new_tokens or a stop string.
    `template` (a ChatTemplate, or a Jinja source) stands in for the model's own."""
    ids, ends, settings = _prepare("chat", model, tokenizer, messages, template, stop, num_samples, settings, overrides)
    out = [""] * num_samples
    for step in text_steps(model, tokenizer, ids, settings, stop, num_samples, use_cache, compile, info, ends):
        out = [o + p for o, p in zip(out, step)]
    return out[0] if num_samples == 1 else out


def chat_stream(
    model,
    tokenizer,
    messages: list[dict],
    settings: SampleConfig | None = None,
    *,
    template: ChatTemplate | str | None = None,
    stop=None,
    use_cache: bool = True,
    compile: bool = False,
    info: dict | None = None,
    **overrides,
):
    """Like chat, but yields the answer in pieces as they are decoded, never half a character."""
    ids, ends, settings = _prepare("chat_stream", model, tokenizer, messages, template, stop, 1, settings, overrides)
    for step in text_steps(model, tokenizer, ids, settings, stop, 1, use_cache, compile, info, ends):
        if step[0]:
            yield step[0]


def _prepare(fn, model, tokenizer, messages, template, stop, num_samples, settings, overrides):
    """(prompt ids, end-of-turn ids, settings) of a chat call, every argument checked."""
    check_arguments(fn, model, tokenizer, "", stop, num_samples)
    if isinstance(template, str):
        template = ChatTemplate(template, origin=f"{fn}()'s template argument")
    elif template is not None and not isinstance(template, ChatTemplate):
        raise ConfigError(
            f"{fn}(): template must be a ChatTemplate or a Jinja source (a str), got {type(template).__name__}"
        )
    template = template or getattr(tokenizer, "chat_template", None)
    if template is None:
        raise MinitfError(
            f"{fn}(): this model has no chat template, so it is not a chat model; fine-tune it on "
            f"conversations (minitf train --config chat) and load that run"
        )
    messages = checked_prompt(fn, _as_list(messages))
    return (
        template.prompt_ids(tokenizer, messages),
        (template.end_of_turn(tokenizer),),
        sample_settings(settings, **overrides),
    )


def _as_list(messages):
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    return list(messages)


def checked_prompt(fn: str, messages: list) -> list[dict]:
    """A conversation to answer (conversations.check_question); a ConfigError naming `fn` otherwise."""
    try:
        return check_question(messages, "the conversation")
    except BadConversation as bad:
        raise ConfigError(f"{fn}(): {bad.where}: {bad.why}") from None


def exact_match(model, tokenizer, conversations: list[list[dict]], task_of=None, max_new_tokens: int = 12) -> dict:
    """The share of conversations whose last answer the model gives exactly, greedily, from the
    conversation before it: {"all": share, <task>: share, ...} (tasks named by task_of(question)).
    A conversation too long for the model's context is left out."""
    right, seen = Counter(), Counter()
    for messages in conversations:
        *before, answer = messages
        try:
            got = chat(model, tokenizer, before, temperature=0.0, max_new_tokens=max_new_tokens)
        except ConfigError:  # longer than the model's context: not a question it can be asked
            continue
        for name in ("all", task_of(before[-1]["content"]) if task_of else None):
            if name is not None:
                seen[name] += 1
                right[name] += got.strip() == answer["content"].strip()
    return {name: right[name] / seen[name] for name in seen}
