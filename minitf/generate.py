"""Sampling text from a trained model: a preallocated KV cache, a pure `sample_next_token`,
`generate` (returns the text) and `stream` (yields it piece by piece).

With the cache the prompt is run through the model once (prefill) and each new token after that
costs one position, not the whole context. Past block_size the context window slides: when it
is full, the oldest tokens are dropped so that the newest block_size // 2 remain, and the cache
is refilled from those once. The uncached path uses the very same window, so greedy decoding
gives identical tokens with and without the cache.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from dataclasses import dataclass

import torch

from .cache import KVCache
from .config import ConfigError, SampleConfig
from .model import Transformer
from .tokenizer import Tokenizer


def window_start(n: int, block_size: int) -> int:
    """Index of the first token the model sees when predicting token n (the context window).

    Up to block_size tokens it sees them all. Then the window jumps: it keeps the newest
    block_size // 2, grows back to block_size, and jumps again.
    """
    if n <= block_size:
        return 0
    keep = max(1, block_size // 2)
    period = block_size - keep + 1
    return n - keep - (n - block_size - 1) % period


def _penalize(logits: torch.Tensor, history: torch.Tensor | None, repetition_penalty: float) -> torch.Tensor:
    if repetition_penalty != 1.0 and history is not None and history.numel():
        seen = logits.gather(1, history)  # (B, n)
        seen = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
        logits = logits.scatter(1, history, seen)
    return logits


def _kept_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """(probs, ids): the softmax of logits / temperature over the tokens top_k and top_p keep,
    (B, n) each; ids[b, j] is the token of column j (None: every token, column j is token j)."""
    logits, ids = logits / temperature, None
    if top_k and top_k < logits.size(-1):  # sample among the k best only: cheaper than masking all V
        logits, ids = torch.topk(logits, top_k, dim=-1)  # (B, k) each, sorted descending
    if top_p is not None and top_p < 1.0:
        if ids is None:
            logits, ids = logits.sort(dim=-1, descending=True)  # (B, V) each
        probs = logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the mass before this token already reaches p
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1), ids


def sample_next_token(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None, generator: torch.Generator | None = None,
                      history: torch.Tensor | None = None, repetition_penalty: float = 1.0) -> torch.Tensor:
    """Pick the next token of each row from logits (B, V); returns ids (B,). A pure function.

    repetition_penalty (CTRL): tokens already in `history` (B, n) get their logit divided by it
    when positive, multiplied when negative. temperature 0 is greedy. top_k keeps the k likeliest
    tokens (0 or None = all); top_p keeps the smallest set whose probability reaches p.
    """
    logits = _penalize(logits.float(), history, repetition_penalty)
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    probs, ids = _kept_probs(logits, temperature, top_k, top_p)
    # the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with probability p_i. It is
    # what torch.multinomial does for one draw (same stream, same ids) without its input checks,
    # which cost more than the draw itself when decoding one token at a time
    race = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(torch.finfo(probs.dtype).tiny)
    choice = (probs / race).argmax(dim=-1, keepdim=True)  # (B, 1)
    return (choice if ids is None else ids.gather(1, choice)).squeeze(1)  # (B,)


def _decode_step(model: Transformer, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model(idx, cache=cache)[0][:, -1]  # (B, V): the logits of the one new position


# one compiled decode step per model, dropped with the model; made on first use, since importing
# the compiler takes seconds
_compiled_steps: "weakref.WeakKeyDictionary[Transformer, object]" = weakref.WeakKeyDictionary()


def _compiled_step(model: Transformer, idx: torch.Tensor, cache: KVCache, checked: bool) -> torch.Tensor:
    """`_decode_step` under torch.compile, compiled once per model and batch size: a static
    KVCache keeps every shape fixed. checked: a step of this generation has already run with
    torch.compile's guards checked; the next ones see the same model and cache, so checking
    again (a quarter of a millisecond per token on a CPU) is skipped."""
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


def sample_settings(settings: SampleConfig | None = None, **overrides) -> SampleConfig:
    """settings (default: SampleConfig()) with keyword overrides applied, validated as a whole."""
    settings = settings or SampleConfig()
    known = {f.name for f in dataclasses.fields(SampleConfig)}
    for name in overrides:
        if name not in known:
            raise ConfigError(f"unknown sampling setting {name!r}; valid: {', '.join(sorted(known))}")
    return dataclasses.replace(settings, **overrides) if overrides else settings


@torch.inference_mode()
def generate_tokens(model: Transformer, prompt_ids: list[int], settings: SampleConfig, num_samples: int = 1,
                    use_cache: bool = True, compile: bool = False, with_logits: bool = False):
    """Yield the next token ids (num_samples,) one step at a time, for a non-empty prompt.
    with_logits: yield (ids, logits) instead, the logits (num_samples, V) the ids were drawn from.

    settings: max_new_tokens and how to sample (temperature, top_k, top_p, repetition_penalty,
    seed); settings.prompt is not used. compile=True decodes with a static KV cache and a
    torch.compile'd step (with use_cache only): the first call for a model pays for compilation
    (seconds), later tokens come faster. The tokens are those of the eager path up to float rounding.
    """
    s = settings
    block = model.config.block_size
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(s.seed) if s.seed is not None else None
    compile = compile and use_cache
    seq = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, n)
    cache, cache_start, checked, nxt = None, None, False, None
    for _ in range(s.max_new_tokens):
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
        nxt = sample_next_token(logits, s.temperature, s.top_k, s.top_p, generator, seq, s.repetition_penalty)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        yield (nxt, logits) if with_logits else nxt


class _TextAssembler:
    """One sample's ids -> text pieces: whole characters only, cut at <|endoftext|> or a stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]):
        self.tok, self.stop = tokenizer, [s for s in stop if s]
        self.pending: list[int] = []  # ids whose bytes do not yet end on a whole character
        self.text, self.emitted, self.done = "", 0, False

    def push(self, token: int) -> str:
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


def prompt_ids(tokenizer: Tokenizer, prompt: str, block_size: int) -> list[int]:
    """The ids generation starts from: the prompt's, or <|endoftext|> for an empty one (a new
    document); a prompt longer than block_size keeps its last block_size (with a warning)."""
    ids = tokenizer.encode(prompt) if prompt else [tokenizer.eot_id]
    if len(ids) > block_size:
        warnings.warn(f"prompt is {len(ids)} tokens, longer than block_size {block_size}; "
                      f"keeping its last {block_size}")
        ids = ids[-block_size:]
    return ids


def _text_steps(model, tokenizer, prompt: str, settings: SampleConfig, stop, num_samples: int,
                use_cache: bool, compile: bool):
    """Yield, per step, the new text of every sample (until all samples are done)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be at least 1, got {num_samples}")
    ids = prompt_ids(tokenizer, prompt, model.config.block_size)
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    texts = [_TextAssembler(tokenizer, stop) for _ in range(num_samples)]
    for nxt in generate_tokens(model, ids, settings, num_samples, use_cache, compile):
        yield [t.push(int(i)) if not t.done else "" for t, i in zip(texts, nxt.tolist())]
        if all(t.done for t in texts):
            return
    yield [t.flush() for t in texts]


def generate(model, tokenizer, prompt: str = "", settings: SampleConfig | None = None, *, stop=None,
             num_samples: int = 1, use_cache: bool = True, compile: bool = False, **overrides):
    """The text that follows `prompt` (not including it); a list of num_samples texts when > 1.

    settings: a SampleConfig (default: SampleConfig()); keyword overrides of its fields
    (max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed) apply on top, e.g.
    generate(model, tok, "ROMEO:", max_new_tokens=100, temperature=0.8, top_k=50, seed=0).
    Generation ends at max_new_tokens, at <|endoftext|>, or as soon as the text contains a stop
    string (the text before it is returned). An empty prompt starts a new document.
    compile=True: a torch.compile'd decode step, see generate_tokens.
    """
    settings = sample_settings(settings, **overrides)
    out = [""] * num_samples
    for step in _text_steps(model, tokenizer, prompt, settings, stop, num_samples, use_cache, compile):
        out = [o + p for o, p in zip(out, step)]
    return out[0] if num_samples == 1 else out


def stream(model, tokenizer, prompt: str = "", settings: SampleConfig | None = None, *, stop=None,
           use_cache: bool = True, compile: bool = False, **overrides):
    """Like generate, but yields text pieces as they are decoded, never half a character."""
    settings = sample_settings(settings, **overrides)
    for step in _text_steps(model, tokenizer, prompt, settings, stop, 1, use_cache, compile):
        if step[0]:
            yield step[0]


@dataclass
class TokenStep:
    """One sampled token, as stream_tokens yields it."""

    text: str     # its text; "" while a character is cut in two (the token that completes it has it whole)
    id: int
    prob: float   # the probability it was drawn with (see token_probs)
    top: list[tuple[str, float]]  # the likeliest tokens of that step, each decoded alone, and their probabilities


def token_probs(logits: torch.Tensor, settings: SampleConfig, history: torch.Tensor | None = None) -> torch.Tensor:
    """The probability of every token, (B, V), in the distribution sample_next_token draws from
    with these settings: after the repetition penalty, temperature, top_k and top_p (zero for the
    tokens they drop). At temperature 0 (greedy) the softmax of the penalized logits."""
    s = settings
    logits = _penalize(logits.float(), history, s.repetition_penalty)
    if s.temperature == 0:
        return logits.softmax(dim=-1)
    probs, ids = _kept_probs(logits, s.temperature, s.top_k, s.top_p)
    return probs if ids is None else torch.zeros_like(logits).scatter(1, ids, probs)


def stream_tokens(model, tokenizer, prompt: str = "", settings: SampleConfig | None = None, *, top: int = 5,
                  use_cache: bool = True, compile: bool = False, **overrides):
    """Like stream, but yields a TokenStep per sampled token: its text, id, the probability it was
    drawn with and the `top` likeliest tokens of that step. The tokens and their texts are those of
    stream and generate with the same settings and seed: the same logits, the same draws.
    No stop strings, so that every piece of text belongs to one token; <|endoftext|> is yielded
    (with text "") and ends the stream.
    """
    settings = sample_settings(settings, **overrides)
    ids = prompt_ids(tokenizer, prompt, model.config.block_size)
    history = torch.tensor([ids], device=next(model.parameters()).device)  # (1, n): what the sampler saw
    text = _TextAssembler(tokenizer, [])
    steps = generate_tokens(model, ids, settings, use_cache=use_cache, compile=compile, with_logits=True)
    for nxt, logits in steps:
        probs = token_probs(logits, settings, history)[0]  # (V,)
        best = probs.topk(min(top, probs.numel()))
        i = int(nxt[0])
        yield TokenStep(text.push(i), i, float(probs[i]),
                        [(tokenizer.decode([j]), float(p)) for p, j in zip(best.values.tolist(), best.indices.tolist())
                         if p > 0])
        if text.done:
            return
        history = torch.cat([history, nxt[:, None]], dim=1)
