"""Answering a checked completion request (request.py): sampling its tokens with minitf's own
sampler, scoring its prompt, and shaping both as OpenAI's completions response.

The tokens come from `generate_tokens` (the sampler of `minitf.generate`, with the same settings
and seed the same tokens), turned into text by the same assembler, so a completion equals
`minitf.generate(...)` for the same prompt, settings and seed; each request's seed makes its own
random generator (the process-wide torch generator is never used). The completion may be longer
than block_size: the window slides as it does in minitf.generate.

- logprobs: N (0..20): for every generated token, its logprob and the N likeliest of its step,
  in the distribution it was drawn from (after repetition_penalty, temperature, top_k, top_p:
  a token these drop has no entry; at temperature 0, the model's own softmax). <|endoftext|>
  has no text and no entry, except with echo.
- echo with logprobs (how lm-evaluation-harness scores a continuation): the prompt's own
  logprobs first, one entry per prompt token, in the model's own softmax computed in float32;
  the first token's is null (nothing predicts it). The last block_size tokens are scored in one
  window, the block_size ids before the last (as the harness's hf backend scores a left-truncated
  context); a longer token prompt's earlier tokens in strided windows, each token seeing at
  least block_size / 2 ids (a perplexity over a long text). Then one entry per generated token,
  <|endoftext|> included. top_logprobs come from the same tensor as the token's own value, so
  "is this token the argmax" is an exact comparison.
- choice p*n+j is prompt p's j-th; usage.completion_tokens counts every token sampled, the
  <|endoftext|> or the token that completed a stop string included; finish_reason is "stop"
  (either) or "length".
"""

from __future__ import annotations

import contextlib
import itertools
import math
import secrets
import threading
import time
from collections.abc import Callable

import torch

from ...generate import generate_tokens, token_probs
from ...generation.stop_strings import TextAssembler
from ...model import Transformer
from ...tokenizer import Tokenizer
from .request import APIError, Request


class Cancelled(Exception):
    """The client went away: its completion stopped."""


class Engine:
    """Completions of one loaded model, sampled and scored.

    The model is only read: each completion makes its own KV cache and random generator inside
    generate_tokens, so several may run at once in different threads. `max_generations` bounds how
    many: a completion waits up to `wait` seconds for a slot, then is refused as busy (503).
    on_token(completion_id, steps), when given, is called after every sampled step (tests use it
    to hold a generation at a known point); on_finish(summary) when a completion ends, however it
    ends (summary: id, completion tokens sampled, reason: "done" or "cancelled").
    """

    def __init__(
        self,
        model: Transformer,
        tok: Tokenizer,
        name: str,
        max_generations: int = 4,
        wait: float = 60.0,
        on_token: Callable[[str, int], None] | None = None,
        on_finish: Callable[[dict], None] | None = None,
    ):
        self.model, self.tok, self.name, self.block = model, tok, name, model.config.block_size
        self.slots, self.wait = threading.BoundedSemaphore(max_generations), wait
        self.on_token, self.on_finish = on_token, on_finish

    def complete(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """The whole response; cancelled() is asked after every token (a client that went away)."""
        cid, created = new_id(), int(time.time())
        choices = [{"text": "", "index": i, "logprobs": None, "finish_reason": None} for i in range(n_choices(req))]
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        for event in self.events(req, cid, cancelled, usage):
            c = choices[event["index"]]
            c["text"] += event["text"]
            c["finish_reason"] = event["finish_reason"] or c["finish_reason"]
            if event["logprobs"] is not None:
                if c["logprobs"] is None:
                    c["logprobs"] = no_logprobs()
                for k, v in event["logprobs"].items():
                    c["logprobs"][k] += v
        if req.logprobs is not None:  # a choice cut short by a stop string keeps the offsets inside its text
            for c in choices:
                lp = c["logprobs"] or no_logprobs()
                lp["text_offset"] = [min(o, len(c["text"])) for o in lp["text_offset"]]
                c["logprobs"] = lp
        return {**header(cid, created, self.name), "choices": choices, "usage": total(usage)}

    def stream(self, req: Request, cancelled: Callable[[], bool] = lambda: False):
        """The chunks of a streamed response (dicts), one per piece of text of one choice; the
        last of each choice carries its finish_reason. The caller writes each as a server-sent
        event and ends with [DONE]; closing this generator stops the generation."""
        cid, created = new_id(), int(time.time())
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        for event in self.events(req, cid, cancelled, usage):
            yield {**header(cid, created, self.name), "choices": [event]}
        if req.include_usage:
            yield {**header(cid, created, self.name), "choices": [], "usage": total(usage)}

    def events(self, req: Request, cid: str, cancelled, usage: dict):
        """Choice events {"text", "index", "logprobs", "finish_reason"}: the prompts one after the
        other, each sampled n times at once (one batch), as minitf.generate(num_samples=n) does."""
        reason = "cancelled"
        try:
            with self.slot():
                yield from self._events(req, cid, cancelled, usage)
            reason = "done"
        finally:
            if self.on_finish:
                self.on_finish({"id": cid, "tokens": usage["completion_tokens"], "reason": reason})

    @contextlib.contextmanager
    def slot(self):
        """One of the max_generations slots, held for the block: generation, scoring and the
        tokenizer routes all take one, so no kind of request can crowd out the others. Waits up to
        `wait` seconds, then refuses the request as busy (503)."""
        if not self.slots.acquire(timeout=self.wait):
            raise APIError(
                "The server is busy with other completions; retry in a moment", 503, "server_error", code="busy"
            )
        try:
            yield
        finally:
            self.slots.release()

    def _events(self, req: Request, cid: str, cancelled, usage: dict):
        """events' own work, in a slot."""
        for p, (prompt, ids) in enumerate(zip(req.prompts, req.ids)):
            usage["prompt_tokens"] += len(ids)
            first, base = p * req.n, len(prompt) if req.echo else 0  # base: where the completion's text begins
            if req.echo:
                scored = None if req.logprobs is None else self._prompt_logprobs(ids, req.logprobs, cid, cancelled)
                for j in range(req.n):
                    yield event(first + j, prompt, scored)
            if req.max_tokens == 0:  # the prompt alone, scored
                for j in range(req.n):
                    yield event(first + j, "", None if req.logprobs is None else no_logprobs(), "length")
                continue
            for step in self._sample(req, ids[-self.block :], cid, cancelled, usage, base):
                for j, text, logprobs, finish in step:
                    yield event(first + j, text, logprobs, finish)

    @torch.inference_mode()
    def _sample(self, req: Request, ids: list[int], cid: str, cancelled, usage: dict, base: int = 0):
        """Per sampled step, a list of (row, new text, logprobs or None, finish_reason or None)
        for the rows still going; ends when every row has finished. base: where the completion's
        text begins in the choice's text (after the echoed prompt), for the logprobs' offsets."""
        s, n = req.settings, req.n
        texts = [TextAssembler(self.tok, req.stop, req.ends) for _ in range(n)]
        history = torch.tensor([ids], device=next(self.model.parameters()).device).repeat(n, 1)  # (n, P)
        tokens = generate_tokens(self.model, ids, s, n, with_logits=True)
        try:
            for count, (nxt, logits) in enumerate(tokens, 1):
                # the distribution each token was drawn from, as the sampler saw it: (n, V)
                probs = token_probs(logits, s, history) if req.logprobs is not None else None
                out = []
                for j, (t, i) in enumerate(zip(texts, nxt.tolist())):
                    if t.done:
                        continue
                    offset = base + len(t.text)  # where this token's text begins in the choice
                    piece = t.push(i)
                    usage["completion_tokens"] += 1
                    lp = None if probs is None else self._logprobs(probs[j], i, offset, req)
                    out.append((j, piece, lp, "stop" if t.done else None))
                history = torch.cat([history, nxt[:, None]], dim=1)
                if self.on_token:
                    self.on_token(cid, count)
                if out:
                    yield out
                if all(t.done for t in texts):
                    return
                if cancelled():
                    raise Cancelled(cid)
            lp = None if req.logprobs is None else no_logprobs()
            yield [(j, t.flush(), lp, "length") for j, t in enumerate(texts) if not t.done]
        finally:
            tokens.close()  # the model back in its mode, the cache freed

    def _logprobs(self, probs: torch.Tensor, token: int, offset: int, req: Request) -> dict:
        """OpenAI's completions logprobs for one token: its own, and the req.logprobs likeliest
        of its step plus itself, in the distribution it was drawn from (probs: (V,)).
        <|endoftext|> (and a chat's end of turn) has no text in the completion, so it has no entry,
        except with echo: a scoring client (lm-evaluation-harness) counts one entry per generated token."""
        if (token == self.tok.eot_id or token in req.ends) and not req.echo:
            return no_logprobs()
        best = probs.topk(min(req.logprobs, probs.numel())) if req.logprobs else None
        top = {}
        if best is not None:
            for p, j in zip(best.values.tolist(), best.indices.tolist()):
                if p > 0:  # a token top_k or top_p dropped has no logprob (log 0)
                    top.setdefault(self.tok.decode([j]), math.log(p))  # tokens of the same text: the likeliest's
        text, own = self.tok.decode([token]), math.log(float(probs[token]))
        top.setdefault(text, own)
        return {"tokens": [text], "token_logprobs": [own], "top_logprobs": [top], "text_offset": [offset]}

    @torch.inference_mode()
    def _prompt_logprobs(self, ids: list[int], top_n: int, cid: str, cancelled) -> dict:
        """The prompt's own logprobs (echo with logprobs), in the model's own softmax in float32;
        the first token has none (nothing predicts it). The last block_size tokens are scored in
        one forward pass over the block_size ids before the last, as lm-evaluation-harness's hf
        backend scores a left-truncated context; the tokens before them (a prompt longer than
        block_size) in strided windows, each seeing at least block_size / 2 ids before it.
        cancelled() is asked before each window: a client that left, or a server that stops,
        ends the scoring (Cancelled) within one forward pass.

        tokens and text_offset follow the text (see echo_pieces): the tokens join into it and
        every offset is a character index within it."""
        pieces = echo_pieces(self.tok, ids)
        lp = {
            "tokens": pieces, "token_logprobs": [None], "top_logprobs": [None],
            "text_offset": list(itertools.accumulate((len(t) for t in pieces[:-1]), initial=0)),
        }  # fmt: skip
        starts, stride = [max(1, len(ids) - self.block)], max(1, self.block // 2)  # the last window's first target
        while starts[0] > 1:  # the windows before it, their targets stride ids each
            starts.insert(0, max(1, starts[0] - stride))
        for start, end in zip(starts, [*starts[1:], len(ids)]):  # targets ids[start:end]
            if start >= end:  # a one-token prompt: nothing to score
                continue
            if cancelled():
                raise Cancelled(cid)
            window = ids[max(0, end - 1 - self.block) : end - 1]
            for value, top in self._scored(window, ids[start:end], pieces[start:end], top_n):
                lp["token_logprobs"].append(value)
                lp["top_logprobs"].append(top)
        return lp

    def _scored(self, window: list[int], targets: list[int], texts: list[str], top_n: int) -> list[tuple[float, dict]]:
        """(logprob, top_logprobs) of each target, the last len(targets) ids the window predicts;
        texts: the targets' tokens as echo gives them (the key of each target's own entry, so a
        client's "is the token the top entry" compares like with like)."""
        device = next(self.model.parameters()).device
        logits = self.model(torch.tensor([window], device=device))[0][0, -len(targets) :]  # (T, V)
        logprobs = logits.float().log_softmax(dim=-1)  # (T, V)
        own = logprobs.gather(1, torch.tensor(targets, device=device)[:, None])[:, 0].tolist()  # (T,)
        # the top values come from the same tensor as the token's own, so "is it the argmax" is an exact comparison
        best = logprobs.topk(min(top_n, logprobs.size(-1)), dim=-1) if top_n else None  # (T, top_n) each
        out = []
        for k, (target, text, value) in enumerate(zip(targets, texts, own)):
            top = {}
            if best is not None:
                for v, j in zip(best.values[k].tolist(), best.indices[k].tolist()):
                    top.setdefault(text if j == target else self.tok.decode([j]), v)  # same text: the likeliest's
            top.setdefault(text, value)
            out.append((value, top))
        return out


def echo_pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Each prompt token's piece of the prompt's text, so that the pieces join into the text
    (tok.decode(ids)) and each token's text_offset is the character its bytes begin in. A byte-level
    token can end in the middle of a UTF-8 character: its piece is "" and the token that completes
    the character carries it whole (as the streamed text hands out whole characters only)."""
    pieces, pending = [], []
    for k, i in enumerate(ids):
        pending.append(i)
        text = tok.decode(pending)
        if text.endswith("\ufffd") and len(pending) < 4 and k + 1 < len(ids):  # a character cut in two
            pieces.append("")
            continue
        pieces.append(text)
        pending = []
    return pieces


def no_logprobs() -> dict:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def n_choices(req: Request) -> int:
    return len(req.prompts) * req.n


def event(index: int, text: str, logprobs: dict | None = None, finish: str | None = None) -> dict:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def header(cid: str, created: int, model: str) -> dict:
    return {"id": cid, "object": "text_completion", "created": created, "model": model}


def total(usage: dict) -> dict:
    return {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def new_id(prefix: str = "cmpl-") -> str:
    return prefix + secrets.token_hex(12)
