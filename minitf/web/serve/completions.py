"""The OpenAI completions protocol over one loaded run: a request body (a dict) in, a response or a
stream of chunks (dicts) out. server.py carries them over HTTP; here everything is plain calls.

Every field a request may send is checked (type and range) and an unknown field is refused, as
OpenAI's API does; a problem raises APIError, which carries OpenAI's error shape and HTTP status.
The text is minitf's own: the tokens come from `generate_tokens` (the sampler of
`minitf.generate`, with the same settings and seed the same tokens), turned into text by the same
assembler, so a completion equals `minitf.generate(...)` for the same prompt, settings and seed.

Fields left out take the run's `sample.*` settings (config.yaml), as scripts/generate.py does:
temperature, top_k, top_p, repetition_penalty, and max_tokens (sample.max_new_tokens). The seed
is the exception: without one, each request draws a fresh random seed (the process-wide torch
generator is never used), so two requests without a seed differ, as they do on OpenAI's API.

What the fields mean here:
- prompt: a string, a list of strings, a list of token ids, or a list of lists of them (each
  completed n times; choice p*n+j is prompt p's j-th); ids are checked against the vocabulary.
  "" starts a new document (from <|endoftext|>). A string prompt is at most block_size tokens (a
  longer one is refused, context_length_exceeded: the model would not see its start); token ids
  come from a client that tokenizes and truncates itself (lm-evaluation-harness), so the model
  sees their last block_size, as a long generation's window does. The completion may be longer
  than block_size: the window slides as it does in minitf.generate.
- max_tokens: 1 to the server's --max-tokens (default 1024); 0 with echo: the prompt alone,
  scored. Extensions: top_k (0 or null: off) and repetition_penalty, minitf's own.
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
- stop: up to 32 strings (a task's stop strings plus <|endoftext|>, as the harness sends them).
- usage.completion_tokens counts every token sampled, the <|endoftext|> or the token that
  completed a stop string included; finish_reason is "stop" (either) or "length".
- Refused with a clear 400: suffix, best_of > 1, frequency or presence penalties, logit_bias.

The tokenizer routes (vLLM's, which the harness's local-completions finds at the server's root):
tokenizer_info() names the special tokens, tokenize() turns text into ids (no special tokens are
added; "<|endoftext|>" in the text is that token) and detokenize() ids into text.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ...config import INT_RANGE, SampleConfig, check_sampling
from ...errors import ConfigError, MinitfError
from ...generate import _TextAssembler, check_num_samples, generate_tokens, sample_settings, token_probs
from ...run_dir import BEST, WEIGHTS, load_run

MAX_CHOICES = 16  # prompts x n in one request: each is a row of the batch and a KV cache
MAX_STOPS = 32  # OpenAI's API takes 4; lm-evaluation-harness sends a task's stop strings plus <|endoftext|>
MAX_LOGPROBS = 20
MAX_IDS = 1 << 16  # token ids in one prompt or /detokenize list (the 1 MiB body bounds them too)
MAX_TOKENS = 1024  # default bound on max_tokens; past block_size the window slides, as in minitf.generate
SEED_RANGE = (0, 2**63 - 1)

# OpenAI's completion fields that minitf has no counterpart for: accepted only at their neutral value
NEUTRAL = {"frequency_penalty": (0, 0.0, None), "presence_penalty": (0, 0.0, None), "best_of": (1, None)}


class APIError(MinitfError):
    """A request that cannot be answered, in OpenAI's error shape: status is the HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


class Cancelled(Exception):
    """The client went away: its completion stopped."""


def bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(message, 400, param=param, code=code)


@dataclasses.dataclass
class Request:
    """A checked completion request."""

    prompts: list[str]  # each prompt's text (what echo returns)
    ids: list[list[int]]  # each prompt's token ids, whole (the model sees the last block_size)
    max_tokens: int  # 0: the prompt alone, scored (echo)
    settings: SampleConfig  # max_new_tokens = max_tokens (at least 1), and the seed every prompt starts from
    n: int
    stop: list[str]
    stream: bool
    logprobs: int | None  # how many top tokens per generated token; None = no logprobs
    echo: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


class Completions:
    """One loaded run and the completions asked of it.

    The model is only read: each completion makes its own KV cache and random generator inside
    generate_tokens, so several may run at once in different threads. `slots` bounds how many: a
    completion waits up to `wait` seconds for one, then is refused as busy (503).
    on_token(completion_id, steps), when given, is called after every sampled step (tests use it
    to hold a generation at a known point); on_finish(summary) when a completion ends, however it
    ends (summary: id, completion tokens sampled, reason: "done" or "cancelled").
    """

    def __init__(
        self,
        run_dir: str | Path,
        best: bool = False,
        device: str = "cpu",
        max_tokens: int = MAX_TOKENS,
        max_generations: int = 4,
        wait: float = 60.0,
        on_token: Callable[[str, int], None] | None = None,
        on_finish: Callable[[dict], None] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.model, self.tok, self.cfg = load_run(run_dir, best=best, device=device)
        self.name = self.run_dir.resolve().name
        self.created = int((self.run_dir / (BEST if best else WEIGHTS)).stat().st_mtime)
        self.max_tokens, self.block = max_tokens, self.cfg.model.block_size
        self.slots, self.wait = threading.BoundedSemaphore(max_generations), wait
        self.on_token, self.on_finish = on_token, on_finish

    # ---- /v1/models

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "minitf"}

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def check_model(self, name) -> None:
        if name != self.name:
            raise APIError(
                f"The model {name!r} does not exist; this server has {self.name!r} (GET /v1/models lists it)",
                404,
                param="model",
                code="model_not_found",
            )

    # ---- /v1/completions: checking a request

    def parse(self, body: dict) -> Request:
        known = {
            "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "n", "stop",
            "seed", "stream", "stream_options", "logprobs", "echo", "user", "suffix", "logit_bias", *NEUTRAL,
        }  # fmt: skip
        unknown = sorted(set(body) - known)
        if unknown:
            raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}")
        if "model" not in body:
            raise bad("model", "you must provide a model parameter")
        self.check_model(body["model"])
        for name, neutral in NEUTRAL.items():
            if body.get(name) not in neutral:
                raise bad(name, f"{name} is not supported by minitf; leave it out")
        if body.get("suffix") not in (None, ""):
            raise bad("suffix", "suffix (insertion) is not supported by minitf; leave it out")
        if body.get("logit_bias") not in (None, {}):
            raise bad("logit_bias", "logit_bias is not supported by minitf; leave it out")
        if not isinstance(body.get("user", ""), str):
            raise bad("user", "user must be a string")

        prompts, ids = self._prompts(body.get("prompt", ""))
        n = integer(body, "n", 1, MAX_CHOICES, default=1)
        if n * len(prompts) > MAX_CHOICES:
            raise bad("n", f"{len(prompts)} prompts x n={n} is {n * len(prompts)} completions; at most {MAX_CHOICES}")
        stream, echo = flag(body, "stream"), flag(body, "echo")
        max_tokens = integer(body, "max_tokens", 0 if echo else 1, self.max_tokens, default=None)
        settings = self._settings(body, max_tokens)
        try:  # each prompt's n rows are sampled at once; the bound minitf.generate's num_samples has
            check_num_samples(self.model, n, "n")
        except ConfigError as e:
            raise bad("n", str(e)) from None

        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("stop", "stop must be a string or a list of strings")
        if len(stop) > MAX_STOPS:
            raise bad("stop", f"stop has {len(stop)} strings; at most {MAX_STOPS}")
        logprobs = integer(body, "logprobs", 0, MAX_LOGPROBS, default=None)
        options = body.get("stream_options")
        if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
            raise bad("stream_options", 'stream_options is {"include_usage": true/false}, with stream=true only')
        include_usage = flag(options or {}, "include_usage")
        max_tokens = settings.max_new_tokens if max_tokens is None else max_tokens
        return Request(prompts, ids, max_tokens, settings, n, stop, stream, logprobs, echo, include_usage)

    def _settings(self, body: dict, max_tokens: int | None) -> SampleConfig:
        """The request's sampling settings over the run's own: the request's types and OpenAI's
        ranges here, then minitf's sampler's ranges (check_sampling, as for minitf.generate)."""
        run = self.cfg.sample
        given = {"max_new_tokens": max(max_tokens, 1) if max_tokens is not None else None}
        if given["max_new_tokens"] is None:
            given["max_new_tokens"] = min(run.max_new_tokens, self.max_tokens)
        given["temperature"] = number(body, "temperature", 0, 2, default=run.temperature)
        given["top_p"] = number(body, "top_p", 0, 1, default=run.top_p, low_open=True)
        given["top_k"] = integer(body, "top_k", 0, INT_RANGE[1], default=run.top_k)
        given["repetition_penalty"] = number(body, "repetition_penalty", 0, None, run.repetition_penalty, low_open=True)
        try:  # its messages start with the setting's name, the request's field
            check_sampling(given["temperature"], given["top_k"], given["top_p"], given["repetition_penalty"])
        except ConfigError as e:
            raise bad(str(e).split()[0], str(e)) from None
        seed = integer(body, "seed", *SEED_RANGE, default=None)
        given["seed"] = secrets.randbelow(SEED_RANGE[1]) if seed is None else seed
        return sample_settings(run, **given)

    def _prompts(self, prompt) -> tuple[list[str], list[list[int]]]:
        """(texts, token ids) of the prompts: a string, a list of strings, a list of token ids, or
        a list of lists of them."""
        is_ids = isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt)
        prompts = [prompt] if isinstance(prompt, str) or is_ids else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, (str, list)) for p in prompts):
            raise bad("prompt", "prompt must be a string, a list of strings, a list of token ids, or a list of those")
        if len(prompts) > MAX_CHOICES:
            raise bad("prompt", f"{len(prompts)} prompts in one request; at most {MAX_CHOICES}")
        texts, ids = [], []
        for p in prompts:
            if isinstance(p, list):  # token ids: the client tokenized and truncates; the model sees the last block_size
                if not p:
                    raise bad("prompt", "a prompt of token ids needs at least one id (<|endoftext|>: a new document)")
                ids.append(self._ids(p, "prompt"))
                texts.append(self.tok.decode(p))
                continue
            check_text(p)
            ids.append(self.tok.encode(p) if p else [self.tok.eot_id])  # the body's size bound keeps this short
            texts.append(p)
            if len(ids[-1]) > self.block:
                raise bad(
                    "prompt",
                    f"This model's maximum context length is {self.block} tokens (block_size), and your prompt is "
                    f"longer; shorten it, or send token ids, which keep their last {self.block}",
                    code="context_length_exceeded",
                )
        return texts, ids

    # ---- /v1/completions: answering

    def complete(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """The whole response; cancelled() is asked after every token (a client that went away)."""
        cid, created = new_id(), int(time.time())
        choices = [{"text": "", "index": i, "logprobs": None, "finish_reason": None} for i in range(n_choices(req))]
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        for event in self._events(req, cid, cancelled, usage):
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
        for event in self._events(req, cid, cancelled, usage):
            yield {**header(cid, created, self.name), "choices": [event]}
        if req.include_usage:
            yield {**header(cid, created, self.name), "choices": [], "usage": total(usage)}

    def _events(self, req: Request, cid: str, cancelled, usage: dict):
        """Choice events {"text", "index", "logprobs", "finish_reason"}: the prompts one after the
        other, each sampled n times at once (one batch), as minitf.generate(num_samples=n) does."""
        if not self.slots.acquire(timeout=self.wait):
            raise APIError(
                "The server is busy with other completions; retry in a moment", 503, "server_error", code="busy"
            )
        reason = "cancelled"
        try:
            for p, (prompt, ids) in enumerate(zip(req.prompts, req.ids)):
                usage["prompt_tokens"] += len(ids)
                first, base = p * req.n, len(prompt) if req.echo else 0  # base: where the completion's text begins
                if req.echo:
                    scored = None if req.logprobs is None else self._prompt_logprobs(ids, req.logprobs)
                    for j in range(req.n):
                        yield event(first + j, prompt, scored)
                if req.max_tokens == 0:  # the prompt alone, scored
                    for j in range(req.n):
                        yield event(first + j, "", None if req.logprobs is None else no_logprobs(), "length")
                    continue
                for step in self._sample(req, ids[-self.block :], cid, cancelled, usage, base):
                    for j, text, logprobs, finish in step:
                        yield event(first + j, text, logprobs, finish)
            reason = "done"
        finally:
            self.slots.release()
            if self.on_finish:
                self.on_finish({"id": cid, "tokens": usage["completion_tokens"], "reason": reason})

    @torch.inference_mode()
    def _sample(self, req: Request, ids: list[int], cid: str, cancelled, usage: dict, base: int = 0):
        """Per sampled step, a list of (row, new text, logprobs or None, finish_reason or None)
        for the rows still going; ends when every row has finished. base: where the completion's
        text begins in the choice's text (after the echoed prompt), for the logprobs' offsets."""
        s, n = req.settings, req.n
        texts = [_TextAssembler(self.tok, req.stop) for _ in range(n)]
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
        <|endoftext|> has no text in the completion, so it has no entry, except with echo: a
        scoring client (lm-evaluation-harness) counts one entry per generated token."""
        if token == self.tok.eot_id and not req.echo:
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
    def _prompt_logprobs(self, ids: list[int], top_n: int) -> dict:
        """The prompt's own logprobs (echo with logprobs), in the model's own softmax in float32;
        the first token has none (nothing predicts it). The last block_size tokens are scored in
        one forward pass over the block_size ids before the last, as lm-evaluation-harness's hf
        backend scores a left-truncated context; the tokens before them (a prompt longer than
        block_size) in strided windows, each seeing at least block_size / 2 ids before it."""
        tokens = [self.tok.decode([i]) for i in ids]
        lp = {
            "tokens": tokens, "token_logprobs": [None], "top_logprobs": [None],
            "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)),
        }  # fmt: skip
        starts, stride = [max(1, len(ids) - self.block)], max(1, self.block // 2)  # the last window's first target
        while starts[0] > 1:  # the windows before it, their targets stride ids each
            starts.insert(0, max(1, starts[0] - stride))
        for start, end in zip(starts, [*starts[1:], len(ids)]):  # targets ids[start:end]
            for value, top in self._scored(ids[max(0, end - 1 - self.block) : end - 1], ids[start:end], top_n):
                lp["token_logprobs"].append(value)
                lp["top_logprobs"].append(top)
        return lp

    def _scored(self, window: list[int], targets: list[int], top_n: int) -> list[tuple[float, dict]]:
        """(logprob, top_logprobs) of each target, the last len(targets) ids the window predicts."""
        device = next(self.model.parameters()).device
        logits = self.model(torch.tensor([window], device=device))[0][0, -len(targets) :]  # (T, V)
        logprobs = logits.float().log_softmax(dim=-1)  # (T, V)
        own = logprobs.gather(1, torch.tensor(targets, device=device)[:, None])[:, 0].tolist()  # (T,)
        # the top values come from the same tensor as the token's own, so "is it the argmax" is an exact comparison
        best = logprobs.topk(min(top_n, logprobs.size(-1)), dim=-1) if top_n else None  # (T, top_n) each
        out = []
        for k, (target, value) in enumerate(zip(targets, own)):
            top = {}
            if best is not None:
                for v, j in zip(best.values[k].tolist(), best.indices[k].tolist()):
                    top.setdefault(self.tok.decode([j]), v)  # tokens of the same text: the likeliest's
            top.setdefault(self.tok.decode([target]), value)
            out.append((value, top))
        return out

    # ---- /tokenizer_info, /tokenize, /detokenize (vLLM's, at the server's root)

    def tokenizer_info(self) -> dict:
        """What a client that tokenizes for this server needs (lm-evaluation-harness's remote
        tokenizer reads eos_token, bos_token and pad_token): <|endoftext|> ends, begins and pads."""
        eot = self.tok.decode([self.tok.eot_id])
        return {
            "eos_token": eot, "bos_token": eot, "pad_token": eot, "model_max_length": self.block,
            "vocab_size": self.tok.vocab_size, "tokenizer_class": "minitf",
        }  # fmt: skip

    def tokenize(self, body: dict) -> dict:
        """{"prompt": text} -> {"tokens": ids, "count", "max_model_len"}; no special tokens are ever
        added, so add_special_tokens either way gives the same ids ("<|endoftext|>" in the text is
        the token)."""
        self._check_fields(body, {"prompt"}, {"model", "add_special_tokens"})
        flag(body, "add_special_tokens")
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad("prompt", f"prompt must be a string, got {type(prompt).__name__}")
        check_text(prompt)
        ids = self.tok.encode(prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.block}

    def detokenize(self, body: dict) -> dict:
        """{"tokens": ids} -> {"prompt": their text}."""
        self._check_fields(body, {"tokens"}, {"model"})
        return {"prompt": self.tok.decode(self._ids(body["tokens"], "tokens"))}

    def _check_fields(self, body: dict, required: set, optional: set) -> None:
        unknown = sorted(set(body) - required - optional)
        if unknown:
            raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}")
        for name in sorted(required - set(body)):
            raise bad(name, f"{name} is required")
        if "model" in body:
            self.check_model(body["model"])

    def _ids(self, ids, param: str) -> list[int]:
        """A list of token ids, each checked against the vocabulary."""
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise bad(param, f"{param} must be a list of token ids (whole numbers)")
        if len(ids) > MAX_IDS:
            raise bad(param, f"{param} has {len(ids)} token ids; at most {MAX_IDS}")
        vocab = self.tok.vocab_size
        for i in ids:
            if not 0 <= i < vocab:
                raise bad(param, f"token id {i} is not in this model's vocabulary; ids are 0..{vocab - 1}")
        return ids

    # ---- /v1/chat/completions

    def chat(self, body: dict) -> None:
        """A minitf model is trained on plain text, with no chat format to continue: answered as
        OpenAI's API answers a completions-only model."""
        self.check_model(body.get("model"))
        raise APIError(
            "This is not a chat model and thus not supported in the v1/chat/completions endpoint. "
            "Did you mean to use v1/completions?",
            404,
            param="model",
        )


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


def new_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


def check_text(text: str, param: str = "prompt") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(param, f"the {param} is not valid UTF-8 text (a lone surrogate)") from None


def flag(body: dict, name: str) -> bool:
    x = body.get(name, False)
    if x is None:
        return False
    if not isinstance(x, bool):
        raise bad(name, f"{name} must be true or false, got {x!r}")
    return x


def integer(body: dict, name: str, lo, hi, default):
    """body[name] as an int in [lo, hi] (hi None: no upper bound); null or absent: default."""
    x = body.get(name)
    if x is None:
        return default
    if isinstance(x, bool) or not isinstance(x, int):
        raise bad(name, f"{name} must be a whole number, got {x!r}")
    if x < lo or (hi is not None and x > hi):
        raise bad(name, f"{name} is {x}; it must be {lo}..{hi}" if hi is not None else f"{name} must be >= {lo}")
    return x


def number(body: dict, name: str, lo, hi, default, low_open: bool = False):
    """body[name] as a float in [lo, hi] ((lo, hi] with low_open; hi None: no upper bound)."""
    x = body.get(name)
    if x is None:
        return default
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise bad(name, f"{name} must be a number, got {x!r}")
    if x < lo or (low_open and x == lo) or (hi is not None and x > hi):
        span = f"{'(' if low_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
        raise bad(name, f"{name} is {x}; it must be in {span}")
    return float(x)
