"""Sampling text from a trained model: `generate_tokens` (ids, with a KV cache), `generate` (returns
the text), `stream` (yields it piece by piece) and `stream_tokens` (each token with its
probability). The rules that pick a token are in sampling.py.

With the cache the prompt is run through the model once (prefill) and each new token after that
costs one position, not the whole context. Past block_size the context window slides: when it
is full, the oldest tokens are dropped so that the newest block_size // 2 remain, and the cache
is refilled from those once. The uncached path uses the very same window, so greedy decoding
gives identical tokens with and without the cache.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import torch

from .config import SampleConfig
from .errors import ConfigError, MinitfError
from .kv_cache import KVCache
from .model import Transformer, padded_vocab
from .sampling import draw_next_token, sample_next_token, sample_settings, token_probs, window_start  # noqa: F401 (re-exported)
from .system.memory import physical_memory, size_words
from .system.runtime import eval_mode
from .tokenizer import Tokenizer, check_vocab


def _decode_step(model: Transformer, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model(idx, cache=cache)[0][:, -1]  # (B, V): the logits of the one new position


# one compiled decode step per model, dropped with the model; made on first use, since importing
# the compiler takes seconds
_compiled_steps: weakref.WeakKeyDictionary[Transformer, object] = weakref.WeakKeyDictionary()


def _compiled_step(model: Transformer, idx: torch.Tensor, cache: KVCache, checked: bool) -> torch.Tensor:
    """`_decode_step` under torch.compile, compiled once per model and batch size: a static
    KVCache keeps every shape fixed. checked: a step of this generation has already run with
    torch.compile's guards checked; the next ones see the same model and cache, so checking
    again on every token (a real cost next to a small model's step on a CPU) is skipped."""
    step = _compiled_steps.get(model)
    if step is None:
        import torch._inductor.config as inductor_config

        # no per-call size and alignment asserts on the ~60 inputs: in Python they cost more than a
        # small model's kernels, and the guards have checked those shapes once per generation
        # already. (Only the switches this torch has: older ones lack alignment_asserts.)
        off = {k: False for k in ("size_asserts", "alignment_asserts") if hasattr(inductor_config, k)}
        step = _compiled_steps[model] = torch.compile(_decode_step, dynamic=False, options=off)
    with torch.compiler.set_stance(skip_guard_eval_unsafe=checked):
        return step(model, idx, cache)


# float32 (B, V) tensors a decoding step holds per row at its peak: the step's logits, their
# penalized and shifted copies, the probabilities, the exponential race and its quotient
SAMPLER_COPIES = 6


def sample_row_bytes(model: Transformer) -> int:
    """The memory one more sample takes while decoding: its row of the KV cache (block_size keys
    and values of every layer) and of the sampler's float32 logits."""
    cfg, p = model.config, next(model.parameters())
    cache = 2 * cfg.n_layer * cfg.kv_heads * cfg.block_size * cfg.head_dim * p.element_size()
    return cache + SAMPLER_COPIES * 4 * padded_vocab(cfg.vocab_size)


def check_num_samples(model: Transformer, num_samples: int, name: str = "num_samples") -> None:
    """Refuse, in one line, a number of samples below 1 or beyond this machine's memory, before a
    byte is allocated: the rows are allocated at once after the prompt's prefill, so
    num_samples=2_000_000 would otherwise fail deep in torch (or swap) after 32 GB.
    name: how the caller's user names it (--num-samples, n)."""
    if num_samples < 1:
        raise ConfigError(f"{name} must be at least 1, got {num_samples}")
    row, have = sample_row_bytes(model), physical_memory()
    if have is not None and num_samples * row > have:
        raise ConfigError(
            f"{name}={num_samples} needs {size_words(num_samples * row)} for the KV cache and logits of that many "
            f"samples, more than this machine's {size_words(have)} of memory; ask for at most {have // row}"
        )


def generate_tokens(
    model: Transformer,
    prompt_ids: list[int],
    settings: SampleConfig,
    num_samples: int = 1,
    use_cache: bool = True,
    compile: bool = False,
    with_logits: bool = False,
):
    """Yield the next token ids (num_samples,) one step at a time, for a non-empty prompt.
    with_logits: yield (ids, logits) instead, the logits (num_samples, V) the ids were drawn from.

    settings: max_new_tokens and how to sample (temperature, top_k, top_p, repetition_penalty,
    seed); settings.prompt is not used. compile=True decodes with a static KV cache and a
    torch.compile'd step (with use_cache only): the first call for a model pays for compilation
    (seconds), later tokens come faster. The tokens are those of the eager path up to float rounding.
    The model runs in eval mode (no dropout, so a seed always gives the same tokens); the caller's
    mode is restored when the generator ends. num_samples beyond memory: a ConfigError.
    """
    check_num_samples(model, num_samples)
    with eval_mode(model):
        yield from _tokens(model, prompt_ids, settings, num_samples, use_cache, compile, with_logits)


@torch.inference_mode()  # as a decorator it holds only while the generator runs, not between tokens
def _tokens(
    model: Transformer,
    prompt_ids: list[int],
    settings: SampleConfig,
    num_samples: int,
    use_cache: bool,
    compile: bool,
    with_logits: bool,
):
    block = model.config.block_size
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(settings.seed) if settings.seed is not None else None
    compile = compile and use_cache
    seq = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, n)
    cache, cache_start, checked, nxt = None, None, False, None
    for _ in range(settings.max_new_tokens):
        start = window_start(seq.size(1), block)
        if not use_cache:
            logits = model(seq[:, start:])[0][:, -1]  # (B, V): the whole window, every step
        elif start != cache_start:  # first step, or the window jumped: fill the cache afresh (eager)
            cache = KVCache(model, seq.size(0), static=compile) if cache is None else cache
            cache.reset()
            logits = model(seq[:, start:], cache=cache)[0][:, -1]
            cache_start = start
        else:
            last = nxt[:, None]  # (B, 1): the token sampled last
            logits = _compiled_step(model, last, cache, checked) if compile else _decode_step(model, last, cache)
            checked = True
        if seq.size(0) < num_samples:  # after the shared prefill, branch into num_samples rows
            seq, logits = seq.repeat(num_samples, 1), logits.repeat(num_samples, 1)
            cache = cache.repeat(num_samples) if cache is not None else None
        s = settings  # a SampleConfig: its settings were checked when it was made
        nxt = draw_next_token(logits, s.temperature, s.top_k, s.top_p, generator, seq, s.repetition_penalty)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        yield (nxt, logits) if with_logits else nxt


class _TextAssembler:
    """One sample's ids -> text pieces: whole characters only, cut at <|endoftext|> or a stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]):
        self.tok, self.stop = tokenizer, [s for s in stop if s]
        self.pending: list[int] = []  # ids whose bytes do not yet end on a whole character
        self.text, self.emitted, self.done = "", 0, False
        self.tokens = 0  # ids pushed: the sampled tokens, <|endoftext|> included

    def push(self, token: int) -> str:
        self.tokens += 1
        if token == self.tok.eot_id:
            self.done = True
            return self.flush()
        self.pending.append(token)
        piece = self.tok.decode(self.pending)
        if piece.endswith("\ufffd") and len(self.pending) < 4:  # a UTF-8 character cut in two
            return ""
        start = len(self.text)
        self.text += piece
        self.pending = []
        for s in self.stop:  # only where the new piece could complete a stop string
            i = self.text.find(s, max(0, start - len(s) + 1))
            if i >= 0:
                self.text, self.done = self.text[:i], True
        return self._emit(final=self.done)

    def flush(self) -> str:
        """Everything not yet handed out, held-back tail included: generation has ended."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        safe = len(self.text)
        if not final:  # hold back a tail that could still become a stop string
            for s in self.stop:
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        safe = min(safe, len(self.text) - k)
                        break
        out, self.emitted = self.text[self.emitted : safe], max(self.emitted, safe)
        return out


def check_prompt_text(prompt: str) -> None:
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8 on the command line
        raise MinitfError(
            f"the prompt is not valid UTF-8 text (at character {e.start}); re-encode it as UTF-8"
        ) from None


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
    from .errors import shown

    return (
        f"{type(value).__name__} {shown(value, 40)}"
        if isinstance(value, (str, int, float, bytes))
        else type(value).__name__
    )


def _text_steps(
    model,
    tokenizer,
    prompt: str,
    settings: SampleConfig,
    stop,
    num_samples: int,
    use_cache: bool,
    compile: bool,
    info: dict | None = None,
):
    """Yield, per step, the new text of every sample (until all samples are done); info, when
    given, gets "tokens": how many tokens each sample drew (re-encoding its text can differ)."""
    check_num_samples(model, num_samples)  # before the num_samples text assemblers below
    check_vocab(tokenizer, model.config.vocab_size, "use the tokenizer of the model's run")
    ids = prompt_ids(tokenizer, prompt, model.config.block_size)
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    texts = [_TextAssembler(tokenizer, stop) for _ in range(num_samples)]
    try:
        for nxt in generate_tokens(model, ids, settings, num_samples, use_cache, compile):
            yield [t.push(int(i)) if not t.done else "" for t, i in zip(texts, nxt.tolist())]
            if all(t.done for t in texts):
                return
        yield [t.flush() for t in texts]
    finally:
        if info is not None:
            info["tokens"] = [t.tokens for t in texts]


def generate(
    model,
    tokenizer,
    prompt: str = "",
    settings: SampleConfig | None = None,
    *,
    stop=None,
    num_samples: int = 1,
    use_cache: bool = True,
    compile: bool = False,
    info: dict | None = None,
    **overrides,
):
    """The text that follows `prompt` (not including it); a list of num_samples texts when > 1.

    settings: a SampleConfig (default: SampleConfig()); keyword overrides of its fields
    (max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed) apply on top, e.g.
    generate(model, tok, "Romeo.\\n", max_new_tokens=100, temperature=0.8, top_k=50, seed=0).
    Generation ends at max_new_tokens, at <|endoftext|>, or as soon as the text contains a stop
    string (the text before it is returned). An empty prompt starts a new document.
    compile=True: a torch.compile'd decode step, see generate_tokens. info: a dict that gets
    "tokens", the number of tokens each sample drew.
    """
    check_arguments("generate", model, tokenizer, prompt, stop, num_samples)
    settings = sample_settings(settings, **overrides)
    out = [""] * num_samples
    for step in _text_steps(model, tokenizer, prompt, settings, stop, num_samples, use_cache, compile, info):
        out = [o + p for o, p in zip(out, step)]
    return out[0] if num_samples == 1 else out


def stream(
    model,
    tokenizer,
    prompt: str = "",
    settings: SampleConfig | None = None,
    *,
    stop=None,
    use_cache: bool = True,
    compile: bool = False,
    info: dict | None = None,
    **overrides,
):
    """Like generate, but yields text pieces as they are decoded, never half a character."""
    check_arguments("stream", model, tokenizer, prompt, stop)
    settings = sample_settings(settings, **overrides)
    for step in _text_steps(model, tokenizer, prompt, settings, stop, 1, use_cache, compile, info):
        if step[0]:
            yield step[0]


@dataclass
class TokenStep:
    """One sampled token, as stream_tokens yields it."""

    text: str  # its text; "" while a character is cut in two (the token that completes it has it whole)
    id: int
    prob: float  # the probability it was drawn with (see token_probs)
    top: list[tuple[str, float]]  # the likeliest tokens of that step, each decoded alone, and their probabilities


def stream_tokens(
    model,
    tokenizer,
    prompt: str = "",
    settings: SampleConfig | None = None,
    *,
    top: int = 5,
    use_cache: bool = True,
    compile: bool = False,
    **overrides,
):
    """Like stream, but yields a TokenStep per sampled token: its text, id, the probability it was
    drawn with and the `top` likeliest tokens of that step. The tokens and their texts are those of
    stream and generate with the same settings and seed: the same logits, the same draws.
    No stop strings, so that every piece of text belongs to one token; <|endoftext|> is yielded
    (with text "") and ends the stream.
    """
    check_arguments("stream_tokens", model, tokenizer, prompt)
    settings = sample_settings(settings, **overrides)
    check_vocab(tokenizer, model.config.vocab_size, "use the tokenizer of the model's run")
    ids = prompt_ids(tokenizer, prompt, model.config.block_size)
    history = torch.tensor([ids], device=next(model.parameters()).device)  # (1, n): what the sampler saw
    text = _TextAssembler(tokenizer, [])
    steps = generate_tokens(model, ids, settings, use_cache=use_cache, compile=compile, with_logits=True)
    for nxt, logits in steps:
        probs = token_probs(logits, settings, history)[0]  # (V,)
        best = probs.topk(min(top, probs.numel()))
        i = int(nxt[0])
        yield TokenStep(
            text.push(i),
            i,
            float(probs[i]),
            [(tokenizer.decode([j]), float(p)) for p, j in zip(best.values.tolist(), best.indices.tolist()) if p > 0],
        )
        if text.done:
            return
        history = torch.cat([history, nxt[:, None]], dim=1)
