"""Generation: the prompt once, then one token at a time through the KV cache.

Sampling text from a trained model: `generate_tokens` (ids, with a KV cache), `generate` (returns
the text), `stream` (yields it piece by piece) and `stream_tokens` (each token with its
probability). The rules that pick a token are in sampling.py.

With the cache the prompt is run through the model once (prefill) and each new token after that
costs one position, not the whole context. Past block_size the context window slides: when it
is full, the oldest tokens are dropped so that the newest block_size // 2 remain, and the cache
is refilled from those once. The uncached path uses the very same window, so greedy decoding
gives identical tokens with and without the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SampleConfig
from .fast.decoding import compiled_decode_step, decode_step
from .generation.args import chat_prompt_ids, check_arguments, prompt_ids, sample_settings
from .generation.stop_strings import TextAssembler
from .kv_cache import KVCache
from .model import Transformer
from .sampling import draw_next_token, sample_next_token, token_probs, window_start  # noqa: F401 (re-exported)
from .system.runtime import eval_mode
from .system.sizes import check_num_samples
from .tokenizer import check_vocab


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
        start = window_start(seq.size(1), block)  # past block_size the window slides (sampling.py)
        if not use_cache:  # the whole window through the model, every step
            logits = model(seq[:, start:])[0][:, -1]  # (B, V)
        elif start != cache_start:  # the prompt once (and again when the window jumps): fill the cache
            cache = KVCache(model, seq.size(0), static=compile) if cache is None else cache
            cache.reset()
            logits = model(seq[:, start:], cache=cache)[0][:, -1]  # (B, V), eager
            cache_start = start
        else:  # then one token at a time: its own query against the cached keys and values
            last = nxt[:, None]  # (B, 1): the token sampled last
            logits = compiled_decode_step(model, last, cache, checked) if compile else decode_step(model, last, cache)
            checked = True
        if seq.size(0) < num_samples:  # after the shared prefill, branch into num_samples rows
            seq, logits = seq.repeat(num_samples, 1), logits.repeat(num_samples, 1)
            cache = cache.repeat(num_samples) if cache is not None else None
        s = settings  # a SampleConfig: its settings were checked when it was made
        nxt = draw_next_token(logits, s.temperature, s.top_k, s.top_p, generator, seq, s.repetition_penalty)
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        yield (nxt, logits) if with_logits else nxt


def text_steps(
    model,
    tokenizer,
    prompt: str,
    settings: SampleConfig,
    stop,
    num_samples: int,
    use_cache: bool,
    compile: bool,
    info: dict | None = None,
    ends: tuple[int, ...] = (),
):
    """Yield, per step, the new text of every sample (until all samples are done): the loop under
    generate and stream (a text prompt) and conversations.answer's chat and chat_stream (a chat's
    prompt ids and its end-of-turn tokens). The caller has checked its arguments (check_arguments)
    and made `settings` (sample_settings).

    `prompt` is text, or token ids already (a chat's); a sample also ends at a token of `ends`, at
    <|endoftext|> or a stop string. info, when given, gets "tokens": how many tokens each sample
    drew (re-encoding its text can differ)."""
    check_num_samples(model, num_samples)  # before the num_samples text assemblers below
    check_vocab(tokenizer, model.config.vocab_size, "use the tokenizer of the model's run")
    block = model.config.block_size
    ids = prompt_ids(tokenizer, prompt, block) if isinstance(prompt, str) else chat_prompt_ids(prompt, block)
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    texts = [TextAssembler(tokenizer, stop, ends) for _ in range(num_samples)]
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
    for step in text_steps(model, tokenizer, prompt, settings, stop, num_samples, use_cache, compile, info):
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
    for step in text_steps(model, tokenizer, prompt, settings, stop, 1, use_cache, compile, info):
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
    ends: tuple[int, ...] = (),
    **overrides,
):
    """Like stream, but yields a TokenStep per sampled token: its text, id, the probability it was
    drawn with and the `top` likeliest tokens of that step. The tokens and their texts are those of
    stream and generate with the same settings and seed: the same logits, the same draws.
    No stop strings, so that every piece of text belongs to one token; <|endoftext|> (or a token of
    `ends`, such as a chat's end of turn) is yielded (with text "") and ends the stream.
    """
    check_arguments("stream_tokens", model, tokenizer, prompt)
    settings = sample_settings(settings, **overrides)
    check_vocab(tokenizer, model.config.vocab_size, "use the tokenizer of the model's run")
    ids = prompt_ids(tokenizer, prompt, model.config.block_size)
    yield from token_steps(model, tokenizer, ids, settings, top, use_cache, compile, ends)


def token_steps(
    model,
    tokenizer,
    ids: list[int],
    settings: SampleConfig,
    top: int = 5,
    use_cache: bool = True,
    compile: bool = False,
    ends: tuple[int, ...] = (),
):
    """stream_tokens from prompt ids already (a chat's, from its template's prompt_ids; at most
    block_size of them), with settings a SampleConfig: the loop under stream_tokens, for a caller
    that has checked its arguments and the tokenizer's vocabulary (check_vocab)."""
    history = torch.tensor([ids], device=next(model.parameters()).device)  # (1, n): what the sampler saw
    text = TextAssembler(tokenizer, [], ends)
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
