"""A completion request, checked: every field OpenAI's completions API takes, its type and range,
and the run's own settings for the fields left out.

Every field a request may send is checked and an unknown field is refused, as OpenAI's API does;
a problem raises APIError, which carries OpenAI's error shape and HTTP status, and names the field
(param). Fields left out (or null) take the run's `sample.*` settings (config.yaml), as
scripts/generate.py does: temperature, top_k, top_p, repetition_penalty, and max_tokens
(sample.max_new_tokens). The seed is the exception: without one, each request draws a fresh
random seed, so two requests without a seed differ, as they do on OpenAI's API.

- prompt: a string, a list of strings, a list of token ids, or a list of lists of them (each
  completed n times); ids are checked against the vocabulary. "" starts a new document (from
  <|endoftext|>). A string prompt is at most block_size tokens (a longer one is refused,
  context_length_exceeded: the model would not see its start); token ids come from a client that
  tokenizes and truncates itself (lm-evaluation-harness), so the model sees their last block_size.
- max_tokens: 1 to the server's --max-tokens (default 1024); 0 with echo: the prompt alone,
  scored. Extensions: top_k (0 or null: off) and repetition_penalty, minitf's own.
- echo with logprobs: at most 16 x block_size prompt tokens scored per request (the work one
  request may ask for; a longer text is split across requests, as the harness's rolling windows do).
- logprobs: 0..20; stop: up to 32 strings (a task's stop strings plus <|endoftext|>, as the
  harness sends them); n: prompts x n at most 16.
- Refused with a clear 400: suffix, best_of > 1, frequency or presence penalties, logit_bias.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets

from ...config import INT_RANGE, SEED_RANGE, SampleConfig, check_sampling
from ...errors import ConfigError, MinitfError
from ...generate import check_num_samples, sample_settings
from ...tokenizer import check_ids, check_text
from ..fields import BadRequest, flag, number, whole

MAX_CHOICES = 16  # prompts x n in one request: each is a row of the batch and a KV cache
MAX_STOPS = 32  # OpenAI's API takes 4; lm-evaluation-harness sends a task's stop strings plus <|endoftext|>
MAX_LOGPROBS = 20
MAX_IDS = 1 << 16  # token ids in one prompt or /detokenize list (the 1 MiB body bounds them too)
MAX_TOKENS = 1024  # default bound on max_tokens; past block_size the window slides, as in minitf.generate
# echo with logprobs scores a request's prompt tokens in windows of block_size: at most this many
# contexts' worth per request, so the work one request asks for is bounded (a long text: split it)
SCORED_CONTEXTS = 16

# OpenAI's completion fields that minitf has no counterpart for: accepted only at their neutral value
NEUTRAL = {"frequency_penalty": (0, 0.0, None), "presence_penalty": (0, 0.0, None), "best_of": (1, None)}
KNOWN = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "n", "stop",
    "seed", "stream", "stream_options", "logprobs", "echo", "user", "suffix", "logit_bias", *NEUTRAL,
}  # fmt: skip


@dataclasses.dataclass(kw_only=True)  # ten fields, several of one type: named, never in an order
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
    ends: tuple[int, ...] = ()  # tokens besides <|endoftext|> that end a choice: a chat's end of turn


class Requests:
    """What a request may ask of one loaded run: `parse` turns a body into a Request or raises APIError.

    served: the loaded run, as the server names it (name, model, tok, cfg); max_tokens: the
    server's bound on a request's max_tokens.
    """

    def __init__(self, served, max_tokens: int = MAX_TOKENS):
        self.name, self.model, self.tok, self.sample = served.name, served.model, served.tok, served.cfg.sample
        self.block, self.max_tokens = served.cfg.model.block_size, max_tokens

    def parse(self, body: dict) -> Request:
        with api_errors():
            return self._parse(body)

    def _parse(self, body: dict) -> Request:
        check_fields(body, KNOWN, self.name)
        if "model" not in body:
            raise bad("model", "you must provide a model parameter")
        unsupported(body)

        prompts, ids = self._prompts(body.get("prompt", ""))
        n = integer(body, "n", 1, MAX_CHOICES, default=1)
        if n * len(prompts) > MAX_CHOICES:
            raise bad("n", f"{len(prompts)} prompts x n={n} is {n * len(prompts)} completions; at most {MAX_CHOICES}")
        stream, echo = flag(body.get("stream"), "stream"), flag(body.get("echo"), "echo")
        max_tokens = integer(body, "max_tokens", 0 if echo else 1, self.max_tokens, default=None)
        settings = self.settings(body, max_tokens)
        self.check_n(n)

        stop, include_usage = stops(body), usage_option(body, stream)
        logprobs = integer(body, "logprobs", 0, MAX_LOGPROBS, default=None)
        max_tokens = settings.max_new_tokens if max_tokens is None else max_tokens
        if echo and logprobs is not None:
            self.check_scoring(ids)
        return Request(
            prompts=prompts,
            ids=ids,
            max_tokens=max_tokens,
            settings=settings,
            n=n,
            stop=stop,
            stream=stream,
            logprobs=logprobs,
            echo=echo,
            include_usage=include_usage,
        )

    def check_scoring(self, ids: list[list[int]]) -> None:
        """echo with logprobs: at most SCORED_CONTEXTS x block_size prompt tokens scored per request."""
        scored, most = sum(map(len, ids)), SCORED_CONTEXTS * self.block
        if scored > most:
            raise bad(
                "prompt",
                f"echo with logprobs scores at most {most} prompt tokens per request ({SCORED_CONTEXTS} x the "
                f"model's {self.block}-token context); this one has {scored}: split the text across requests",
            )

    def check_n(self, n: int) -> None:
        """Each prompt's n rows are sampled at once: the bound minitf.generate's num_samples has."""
        try:
            check_num_samples(self.model, n, "n")
        except ConfigError as e:
            raise bad("n", str(e)) from None

    def settings(self, body: dict, max_tokens: int | None) -> SampleConfig:
        """The request's sampling settings over the run's own: the request's types and OpenAI's
        ranges here, then minitf's sampler's ranges (check_sampling, as for minitf.generate)."""
        run = self.sample
        given = {"max_new_tokens": max(max_tokens, 1) if max_tokens is not None else None}
        if given["max_new_tokens"] is None:
            given["max_new_tokens"] = min(run.max_new_tokens, self.max_tokens)
        given["temperature"] = real(body, "temperature", 0, 2, default=run.temperature)
        given["top_p"] = real(body, "top_p", 0, 1, default=run.top_p, low_open=True)
        given["top_k"] = integer(body, "top_k", 0, INT_RANGE[1], default=run.top_k)
        given["repetition_penalty"] = real(body, "repetition_penalty", 0, None, run.repetition_penalty, low_open=True)
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
                ids.append(self.ids(p, "prompt"))
                texts.append(self.tok.decode(p))
                continue
            check_utf8(p)
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

    def ids(self, ids, param: str) -> list[int]:
        """A list of token ids, each checked against the vocabulary (tokenizer.check_ids)."""
        if not isinstance(ids, list):
            raise bad(param, f"{param} must be a list of token ids (whole numbers)")
        if len(ids) > MAX_IDS:
            raise bad(param, f"{param} has {len(ids)} token ids; at most {MAX_IDS}")
        try:
            check_ids(ids, self.tok.vocab_size, param)
        except ConfigError as e:
            raise bad(param, str(e)) from None
        return ids


class APIError(MinitfError):
    """A request that cannot be answered, in OpenAI's error shape: status is the HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(message, 400, param=param, code=code)


@contextlib.contextmanager
def api_errors():
    """A field that web/fields.py refuses (BadRequest), raised again as OpenAI's 400 naming the field."""
    try:
        yield
    except BadRequest as e:
        raise bad(e.param, str(e)) from None


def check_model(name, served: str) -> None:
    if name != served:
        raise APIError(
            f"The model {name!r} does not exist; this server has {served!r} (GET /v1/models lists it)",
            404,
            param="model",
            code="model_not_found",
        )


def check_fields(body: dict, known: set, served: str, required: set = frozenset()) -> None:
    """Every field of body is known, every required one is there, and the model, if named, is this server's."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad(unknown[0], f"Unrecognized request argument supplied: {unknown[0]}")
    for name in sorted(required - set(body)):
        raise bad(name, f"{name} is required")
    if "model" in body:
        check_model(body["model"], served)


def check_utf8(text: str, param: str = "prompt") -> None:
    """text has a UTF-8 form (tokenizer.check_text: no lone surrogate), or a 400 naming param."""
    try:
        check_text(text, param)
    except ConfigError as e:
        raise bad(param, str(e)) from None


def unsupported(body: dict) -> None:
    """The fields minitf has no counterpart for are absent or at their neutral value."""
    for name, neutral in NEUTRAL.items():
        if body.get(name) not in neutral:
            raise bad(name, f"{name} is not supported by minitf; leave it out")
    if body.get("suffix") not in (None, ""):
        raise bad("suffix", "suffix (insertion) is not supported by minitf; leave it out")
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias", "logit_bias is not supported by minitf; leave it out")
    if not isinstance(body.get("user", ""), str):
        raise bad("user", "user must be a string")


def stops(body: dict) -> list[str]:
    """body's stop: a string or a list of at most MAX_STOPS strings (null or absent: none)."""
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("stop", "stop must be a string or a list of strings")
    if len(stop) > MAX_STOPS:
        raise bad("stop", f"stop has {len(stop)} strings; at most {MAX_STOPS}")
    return stop


def usage_option(body: dict, stream: bool) -> bool:
    """stream_options.include_usage: a last chunk with the token counts (stream=true only)."""
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise bad("stream_options", 'stream_options is {"include_usage": true/false}, with stream=true only')
    return flag((options or {}).get("include_usage"), "include_usage")


def integer(body: dict, name: str, lo, hi, default):
    """body[name] as an int in [lo, hi] (hi None: no upper bound); null or absent: default."""
    x = body.get(name)
    return default if x is None else whole(x, name, lo, hi)


def real(body: dict, name: str, lo, hi, default, low_open: bool = False):
    """body[name] as a float in [lo, hi] ((lo, hi] with low_open; hi None: no upper bound); null or absent: default."""
    x = body.get(name)
    return default if x is None else number(x, name, lo, hi, low_open)
