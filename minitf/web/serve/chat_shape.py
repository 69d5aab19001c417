"""A chat completion in OpenAI's shapes: the engine's choice events (engine.py, the same sampling
as a completion's) as a chat.completion, or as chat.completion.chunk events to stream.

A choice's message is the assistant's answer, cut at the template's end of turn (finish_reason
"stop"), at a stop string ("stop") or at max_tokens ("length"). Its logprobs, when asked, are
OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]},
one entry per token of the answer (the end-of-turn token has none), the values those of the
distribution the token was drawn from, as for completions; bytes are the UTF-8 of the token's
text (a token that is part of a character shows, and counts, as U+FFFD).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .engine import Engine, new_id, total
from .request import Request


def chat_complete(engine: Engine, req: Request, cancelled: Callable[[], bool]) -> dict:
    """The whole chat.completion; cancelled() is asked after every token."""
    cid, created = new_id("chatcmpl-"), int(time.time())
    choices = [
        {"index": i, "message": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(req.n)
    ]
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for event in engine.events(req, cid, cancelled, usage):
        c = choices[event["index"]]
        c["message"]["content"] += event["text"]
        c["finish_reason"] = event["finish_reason"] or c["finish_reason"]
        if req.logprobs is not None:
            c["logprobs"] = c["logprobs"] or {"content": []}
            c["logprobs"]["content"] += content_logprobs(event["logprobs"], req.logprobs)
    return {**_header(cid, created, engine.name, "chat.completion"), "choices": choices, "usage": total(usage)}


def chat_chunks(engine: Engine, req: Request, cancelled: Callable[[], bool]):
    """The chat.completion.chunk dicts of a streamed answer: a choice's first says its role, each
    carries a piece of its text, its last its finish_reason; then the usage, if asked."""
    cid, created = new_id("chatcmpl-"), int(time.time())
    head, begun = _header(cid, created, engine.name, "chat.completion.chunk"), set()
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    for event in engine.events(req, cid, cancelled, usage):
        i, delta = event["index"], {}
        if i not in begun:
            begun.add(i)
            delta["role"] = "assistant"
        if event["text"] or not event["finish_reason"]:
            delta["content"] = event["text"]
        logprobs = None if req.logprobs is None else {"content": content_logprobs(event["logprobs"], req.logprobs)}
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": event["finish_reason"]}
        yield {**head, "choices": [choice]}
    if req.include_usage:
        yield {**head, "choices": [], "usage": total(usage)}


def content_logprobs(logprobs: dict | None, top_n: int) -> list[dict]:
    """The engine's completions-shaped logprobs (tokens, token_logprobs, top_logprobs) as chat's
    content entries, each with its top_n likeliest, likeliest first."""
    if logprobs is None:
        return []
    out = []
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        best = sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
        out.append({**_entry(token, value), "top_logprobs": [_entry(t, v) for t, v in best]})
    return out


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _header(cid: str, created: int, model: str, kind: str) -> dict:
    return {"id": cid, "object": kind, "created": created, "model": model}
