"""From logits to the next token: temperature, top-k, top-p, repetition penalty.

Choosing the next token from the logits: temperature, top-k, top-p (and a repetition penalty),
then one random draw. `sample_next_token` draws; `token_probs` and `sampler_distribution` say
what it draws from, through the same rules. Pure functions over logits (B, V); their settings
travel as one SampleConfig (generate_args.sample_settings). Also here: the context window past
block_size (`window_start`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SampleConfig, check_sampling

FLOAT32_SMALLEST = 2.0**-149  # the smallest positive float32 (a subnormal, 1.4e-45)


def sample_next_token(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    history: torch.Tensor | None = None,
    repetition_penalty: float = 1.0,
) -> torch.Tensor:
    """Pick the next token of each row from logits (B, V); returns ids (B,). A pure function.

    repetition_penalty (CTRL): tokens already in `history` (B, n) get their logit divided by it
    when positive, multiplied when negative. temperature 0 is greedy. top_k keeps the k likeliest
    tokens (0 or None = all); top_p keeps the smallest set whose probability reaches p.
    Settings that would make the logits nan are refused (a ConfigError), as SampleConfig does.
    """
    check_sampling(temperature, top_k, top_p, repetition_penalty)
    return draw_next_token(logits, temperature, top_k, top_p, generator, history, repetition_penalty)


def draw_next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
    history: torch.Tensor | None,
    repetition_penalty: float,
) -> torch.Tensor:
    """sample_next_token for settings already checked (a validated SampleConfig): the decoding
    loop draws every token here, without checking the same settings again each time."""
    # as floats: torch cannot divide a tensor by an int past 2**63 (in range as 2**64 is)
    temperature, repetition_penalty = float(temperature), float(repetition_penalty)
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


def _penalize(logits: torch.Tensor, history: torch.Tensor | None, repetition_penalty: float) -> torch.Tensor:
    if repetition_penalty != 1.0 and history is not None and history.numel():
        seen = logits.gather(1, history)  # (B, n)
        seen = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
        logits = logits.scatter(1, history, seen)
    return logits


def _kept_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None):
    """(probs, ids): the softmax of logits / temperature over the tokens top_k and top_p keep,
    (B, n) each; ids[b, j] is the token of column j (None: every token, column j is token j)."""
    # shifted so the largest is 0 before dividing: a tiny temperature then gives -inf for the rest
    # (a greedy pick), never inf - inf = nan. A temperature below float32's smallest number would be
    # 0 there, and 0 / 0 nan: it divides as that smallest number, the same greedy pick
    temperature = max(temperature, FLOAT32_SMALLEST)
    logits, ids = (logits - logits.amax(dim=-1, keepdim=True)) / temperature, None
    if top_k and top_k < logits.size(-1):  # sample among the k best only: cheaper than masking all V
        logits, ids = torch.topk(logits, top_k, dim=-1)  # (B, k) each, sorted descending
    if top_p is not None and top_p < 1.0:
        if ids is None:
            logits, ids = logits.sort(dim=-1, descending=True)  # (B, V) each
        probs = logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the mass before this token already reaches p
        # the likeliest token always stays: a p below float32's smallest number (1.4e-45) is 0
        # there, and 0 >= 0 would drop every token (nan). Any other p keeps it anyway (0 before it)
        drop[:, 0] = False
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1), ids


def token_probs(logits: torch.Tensor, settings: SampleConfig, history: torch.Tensor | None = None) -> torch.Tensor:
    """The probability of every token, (B, V), in the distribution sample_next_token draws from
    with these settings: after the repetition penalty, temperature, top_k and top_p (zero for the
    tokens they drop). At temperature 0 (greedy) the softmax of the penalized logits."""
    s = settings
    logits = _penalize(logits.float(), history, s.repetition_penalty)
    if s.temperature == 0:
        return logits.softmax(dim=-1)
    return _drawn_probs(logits, s.temperature, s.top_k, s.top_p)


def _drawn_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """_kept_probs over the whole vocabulary, (B, V): zero for the tokens top_k and top_p drop."""
    probs, ids = _kept_probs(logits, temperature, top_k, top_p)
    return probs if ids is None else torch.zeros_like(logits).scatter(1, ids, probs)


@dataclass
class SamplerDistribution:
    """What the sampler makes of one step's logits, each (B, V), stage by stage."""

    model: torch.Tensor  # softmax of the logits (after the repetition penalty): the model's own distribution
    tempered: torch.Tensor  # softmax of the logits / temperature, every token kept (greedy: all on the argmax)
    probs: torch.Tensor  # what sample_next_token draws from: tempered, cut by top_k and top_p, renormalised
    kept: torch.Tensor  # bool: the tokens that can be drawn (probs > 0); the others are cut


def sampler_distribution(
    logits: torch.Tensor, settings: SampleConfig, history: torch.Tensor | None = None
) -> SamplerDistribution:
    """The distribution sample_next_token draws from with these settings, and the two it comes
    from, computed by the very functions it uses (the penalty, then temperature, top_k, top_p).
    At temperature 0 the sampler is greedy: all the probability is on the likeliest token."""
    s = settings
    logits = _penalize(logits.float(), history, s.repetition_penalty)  # (B, V)
    model = logits.softmax(dim=-1)
    if s.temperature == 0:
        probs = tempered = torch.zeros_like(logits).scatter(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    else:
        tempered = _drawn_probs(logits, s.temperature, None, None)
        probs = _drawn_probs(logits, s.temperature, s.top_k, s.top_p)
    return SamplerDistribution(model=model, tempered=tempered, probs=probs, kept=probs > 0)


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
