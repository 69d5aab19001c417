"""Sampling settings at their extremes: every value either samples from finite probabilities or is
refused in one line naming the setting and its range; and the number of samples is bounded by
memory before anything is allocated."""

import itertools
import math

import pytest
import torch

import minitf
import minitf.system.files
from minitf.config import SampleConfig
from minitf.errors import ConfigError
from minitf.generate import generate_tokens, sample_next_token, sample_settings, token_probs
from minitf.generation.args import SETTINGS
from minitf.sampling import sampler_distribution
from tests.support.models import spread_model

# 0, tiny (1e-300 is 0 in float32, 1e-45 its smallest), huge (inf in float32), not finite, negative
EXTREMES = [0, 1e-300, 1e-45, 1e-30, 1e30, 1e300, math.inf, -math.inf, math.nan, -1, -1e-300, 2**63 - 1, 2**64]


BASE = dict(max_new_tokens=4, temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.3, seed=0)


SAMPLER_ARGS = ("temperature", "top_k", "top_p", "repetition_penalty")  # sample_next_token's own


@pytest.fixture(scope="module")
def model():
    return spread_model()


def refused_in_one_line(error: Exception, name: str) -> None:
    message = str(error)
    assert isinstance(error, ConfigError) and "\n" not in message and name in message, message
    assert "got" in message, message  # the value it was given


def check_finite(probs: torch.Tensor) -> None:
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.size(0)))


@pytest.mark.parametrize("name, value", list(itertools.product(SETTINGS, EXTREMES)))
def test_every_setting_at_an_extreme_samples_finite_probabilities_or_is_refused_in_one_line(model, name, value):
    try:
        settings = sample_settings(SampleConfig(**BASE), **{name: value})
    except ConfigError as e:
        refused_in_one_line(e, f"sample.{name}")
        return
    prompt = [5, 17, 3, 44, 2, 5, 17]  # repeated tokens: the penalty applies from the first step
    history = torch.tensor([prompt, prompt])  # (2, n): what the sampler sees, row by row
    steps = itertools.islice(generate_tokens(model, prompt, settings, 2, with_logits=True), 3)
    for ids, logits in steps:  # the first 3 tokens only: max_new_tokens may be 2**63 - 1
        assert ids.shape == (2,) and 0 <= ids.min() and ids.max() < 97
        check_finite(token_probs(logits, settings, history))
        d = sampler_distribution(logits, settings, history)
        check_finite(d.probs), check_finite(d.tempered), check_finite(d.model)
        assert d.kept[torch.arange(2), ids].all()  # the tokens drawn are among those it says it keeps
        history = torch.cat([history, ids[:, None]], dim=1)


@pytest.mark.parametrize("name, value", list(itertools.product(SAMPLER_ARGS, EXTREMES)))
def test_sample_next_token_alone_refuses_what_would_make_nan(name, value):
    """The pure function takes raw numbers, not a SampleConfig: it checks them the same way."""
    logits = torch.tensor([[1e4, -1e4, 0.0, 3.0, -2.0]])
    args = {**{k: BASE[k] for k in SAMPLER_ARGS}, name: value}
    try:
        ids = sample_next_token(logits, history=torch.tensor([[0, 1, 2]]), **args)
    except ConfigError as e:
        refused_in_one_line(e, name)
        return
    assert ids.shape == (1,) and 0 <= int(ids) < 5


@pytest.mark.parametrize("temperature", [1e-30, 1.0, 1e30])
@pytest.mark.parametrize("penalty", [1e-30, 1.0, 1e30])
@pytest.mark.parametrize("top_p", [1e-300, 0.5, None])
def test_the_ranges_corners_keep_logits_of_1e4_finite(temperature, penalty, top_p):
    """The bounds' reason: a logit of +-1e4 (or 0) divided or multiplied by any penalty in range,
    then divided by any temperature in range, still gives finite probabilities; every token seen."""
    logits = torch.tensor([[1e4, -1e4, 0.0, 3.0, -2.0], [-1e4, -1e4, -3.0, -1e4, -5.0]])
    settings = SampleConfig(temperature=temperature, top_k=None, top_p=top_p, repetition_penalty=penalty)
    history = torch.arange(5).repeat(2, 1)
    check_finite(token_probs(logits, settings, history))
    g = torch.Generator().manual_seed(0)
    ids = sample_next_token(logits, temperature, None, top_p, g, history, penalty)
    assert token_probs(logits, settings, history)[torch.arange(2), ids].gt(0).all()  # drawn from what it says


def test_a_tiny_top_p_keeps_the_likeliest_token():
    """top_p 1e-300 is 0 in float32: without the likeliest token kept, every token was dropped (nan)."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    probs = token_probs(logits, SampleConfig(top_k=None, top_p=1e-300))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert sample_next_token(logits, 1.0, top_p=1e-300, generator=torch.Generator().manual_seed(0)).tolist() == [1]


def test_the_messages_name_the_range():
    with pytest.raises(
        ConfigError, match=r"^sample.repetition_penalty must be in \[1e-30, 1e30\] \(1 = off\), .*got 1e-300$"
    ):
        SampleConfig(repetition_penalty=1e-300)
    with pytest.raises(ConfigError, match=r"^sample.temperature must be at most 1e\+30 \(0 = greedy\), .*got 1e\+300$"):
        SampleConfig(temperature=1e300)


@pytest.mark.parametrize("temperature", [1e-300, 1e-46, 1e-45])
def test_a_temperature_below_float32s_smallest_picks_the_likeliest_token(temperature):
    """1e-300 is 0 in float32, and logits / 0 made nan: the sampler divides by float32's smallest
    number at least, which picks the likeliest token, as a tiny temperature means."""
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert sample_next_token(logits, temperature, top_k=None).tolist() == [1]
    check_finite(token_probs(logits, SampleConfig(temperature=temperature, top_k=None)))


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_temperature_half_draws_follow_the_sharpened_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    draws = torch.cat(
        [minitf.sample_next_token(logits.expand(1000, 4), 0.5, top_k=None, generator=g) for _ in range(40)]
    )
    freq = torch.bincount(draws, minlength=4) / draws.numel()
    torch.testing.assert_close(freq, (logits[0] / 0.5).softmax(-1), atol=0.01, rtol=0)


def test_top_k_and_top_p_together_allow_the_set_worked_out_by_hand():
    # probabilities 0.5, 0.2, 0.15, 0.1, 0.05: top_k=4 keeps the first four (renormalised over 0.95:
    # 0.526, 0.211, 0.158, 0.105); top_p=0.7 then keeps the smallest prefix reaching 0.7:
    # 0.526 + 0.211 = 0.737, so tokens 0 and 1 only
    logits = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]).log()
    g = torch.Generator().manual_seed(0)
    seen = {minitf.sample_next_token(logits, 1.0, top_k=4, top_p=0.7, generator=g).item() for _ in range(400)}
    assert seen == {0, 1}


def test_repetition_penalty_changes_exactly_the_seen_tokens(monkeypatch):
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    captured = []
    real_argmax = torch.Tensor.argmax
    monkeypatch.setattr(
        torch.Tensor, "argmax", lambda self, *a, **k: (captured.append(self.clone()), real_argmax(self, *a, **k))[1]
    )
    minitf.sample_next_token(logits, 0, history=torch.tensor([[0, 1, 1]]), repetition_penalty=2.0)
    torch.testing.assert_close(captured[0], torch.tensor([[1.0, -2.0, 0.5, 3.0, -2.0]]))


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_a_tiny_temperature_samples_the_likeliest_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    for temperature in (1e-45, 1e-30, 1e-8):
        assert minitf.sample_next_token(logits, temperature, top_k=None).tolist() == [1]
