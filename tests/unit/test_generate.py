"""Generation: the KV cache gives exactly the uncached tokens, sampling rules, text assembly; eval mode
for generate, evaluate and inspect, with the caller's mode given back."""

import contextlib
import itertools
import sys

import pytest
import torch

import minitf
import minitf.system.files
from minitf.config import SampleConfig
from minitf.corpus.prepare import prepare_data
from minitf.errors import MinitfError
from minitf.evaluate import evaluate, evaluate_text
from minitf.generate import generate_tokens, sample_next_token, token_probs, window_start
from minitf.kv_cache import KVCache
from minitf.sampling import sampler_distribution
from tests.support.models import spread_model as model_for

COMBOS = list(itertools.product(["learned", "sinusoidal", "rope"], ["layernorm", "rmsnorm"], ["gelu", "swiglu"]))


def tokens(m, prompt, n, use_cache, **settings):
    settings = SampleConfig(max_new_tokens=n, temperature=0, **settings)
    return torch.stack(list(generate_tokens(m, prompt, settings, use_cache=use_cache)), 1)


@pytest.mark.parametrize("positions, norm, ffn", COMBOS)
def test_greedy_cache_equals_no_cache_past_block_size(positions, norm, ffn):
    m = model_for(positions=positions, norm=norm, ffn=ffn)
    prompt = [5, 17, 3, 44, 2]
    # 45 tokens: the 16-token window jumps several times. The penalty keeps a random model from
    # repeating one token, so the comparison covers many different contexts.
    cached = tokens(m, prompt, 40, True, repetition_penalty=1.5)
    plain = tokens(m, prompt, 40, False, repetition_penalty=1.5)
    assert cached.tolist() == plain.tolist()
    assert len(set(cached[0].tolist())) > 3  # not a degenerate constant stream


@pytest.mark.parametrize(
    "options", [dict(qk_norm=True, positions="rope"), dict(ffn="relu2"), dict(logit_softcap=3.0, tie_embeddings=False)]
)
def test_greedy_cache_equals_no_cache_with_options(options):
    m = model_for(**options)
    prompt = [5, 17, 3, 44, 2]
    cached = tokens(m, prompt, 40, True, repetition_penalty=1.5)
    assert cached.tolist() == tokens(m, prompt, 40, False, repetition_penalty=1.5).tolist()
    assert len(set(cached[0].tolist())) > 3


def test_cache_logits_match_full_forward():
    m = model_for(positions="rope")
    x = torch.randint(0, 97, (2, 12))
    full, _ = m(x)
    cache = KVCache(m, batch_size=2)
    first, _ = m(x[:, :7], cache=cache)  # prefill 7, then 5 one at a time
    steps = [m(x[:, t : t + 1], cache=cache)[0] for t in range(7, 12)]
    torch.testing.assert_close(torch.cat([first] + steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.pos == 12


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_static_cache_logits_match_full_forward(positions):
    # the fixed-shape cache torch.compile uses: writes at a tensor position, attends behind a mask
    m = model_for(positions=positions)
    x = torch.randint(0, 97, (2, 12))
    full, _ = m(x)
    cache = KVCache(m, batch_size=2, static=True)
    first, _ = m(x[:, :7], cache=cache)
    steps = [m(x[:, t : t + 1], cache=cache)[0] for t in range(7, 12)]
    torch.testing.assert_close(torch.cat([first] + steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.pos.item() == 12 and cache.k[0].shape == (2, 2, 16, 16)  # every slot kept, block_size 16
    cache.reset()
    torch.testing.assert_close(m(x[:, :3], cache=cache)[0], full[:, :3], atol=1e-5, rtol=1e-5)


def test_window_start_rule():
    B = 8  # keep 4; the window grows from 4 to 8 tokens, then jumps
    got = [window_start(n, B) for n in range(1, 20)]
    assert got == [0] * 8 + [5, 5, 5, 5, 5, 10, 10, 10, 10, 10, 15]
    for n in range(1, 200):
        assert 0 < n - window_start(n, B) <= B  # never empty, never longer than the block


def test_sampled_batches_are_seeded_and_cached_equals_uncached():
    m = model_for()
    settings, kw = SampleConfig(temperature=1.0, top_k=20, seed=3, max_new_tokens=30), dict(num_samples=4)
    a = torch.stack(list(generate_tokens(m, [1, 2, 3], settings, use_cache=True, **kw)), 1)
    b = torch.stack(list(generate_tokens(m, [1, 2, 3], settings, use_cache=False, **kw)), 1)
    c = torch.stack(list(generate_tokens(m, [1, 2, 3], settings, use_cache=True, **kw)), 1)
    assert a.shape == (4, 30)
    assert torch.equal(a, c)  # same seed, same samples
    assert torch.equal(a, b)
    assert len({tuple(r) for r in a.tolist()}) > 1  # the samples differ from each other


def test_sample_next_token_rules():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    assert sample_next_token(logits, temperature=0).tolist() == [1]
    g = torch.Generator().manual_seed(0)
    draws = {sample_next_token(logits, 1.0, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {1, 2}
    # top_p: p(1)=0.665, p(2)=0.245 -> 0.5 keeps only token 1, 0.8 keeps tokens 1 and 2
    assert {sample_next_token(logits, 1.0, top_p=0.5, generator=g).item() for _ in range(100)} == {1}
    assert {sample_next_token(logits, 1.0, top_p=0.8, generator=g).item() for _ in range(300)} == {1, 2}
    # repetition penalty divides a positive seen logit: 3/4 < 2, so greedy switches to token 2
    hist = torch.tensor([[1]])
    assert sample_next_token(logits, 0, history=hist, repetition_penalty=4.0).tolist() == [2]
    # a negative seen logit is multiplied, pushed further down
    out = sample_next_token(torch.tensor([[-1.0, -1.5]]), 0, history=torch.tensor([[0]]), repetition_penalty=2.0)
    assert out.tolist() == [1]


def test_samples_follow_the_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    draws = torch.cat([sample_next_token(logits.expand(1000, 4), 1.0, generator=g) for _ in range(40)])
    freq = torch.bincount(draws, minlength=4) / draws.numel()  # 40,000 draws: standard error < 0.003
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.01, rtol=0)


def test_padded_ids_never_sampled():
    m = model_for()  # vocab 97, embedding rows padded to 128
    ids = torch.stack(
        list(
            generate_tokens(
                m, [1], SampleConfig(max_new_tokens=200, temperature=2.0, top_k=None, seed=0), num_samples=4
            )
        ),
        1,
    )
    assert ids.max() < 97


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.0, top_k=None),
        dict(temperature=0),
        dict(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.3),
    ],
)
def test_stream_tokens_are_the_tokens_of_generate(tiny_run, settings):
    model, tok, _ = minitf.load_run(tiny_run)
    s = SampleConfig(max_new_tokens=40, seed=7, **settings)
    steps = list(minitf.stream_tokens(model, tok, "ROMEO:", s))
    ids = [int(t) for t in generate_tokens(model, tok.encode("ROMEO:"), s)]
    assert len(steps) == (ids.index(tok.eot_id) + 1 if tok.eot_id in ids else 40)
    assert [t.id for t in steps] == ids[: len(steps)]
    assert "".join(t.text for t in steps) == minitf.generate(model, tok, "ROMEO:", s)


def test_stream_tokens_report_the_sampling_probabilities(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    prompt = tok.encode("JULIET: O")
    steps = list(minitf.stream_tokens(model, tok, "JULIET: O", max_new_tokens=12, temperature=1.0, top_k=None, seed=1))
    seq = prompt + [t.id for t in steps]
    with torch.no_grad():
        probs = model(torch.tensor([seq]))[0][0].softmax(-1)  # (T, V): the uncached forward's distributions
    for n, t in enumerate(steps):
        p = probs[len(prompt) - 1 + n]
        assert t.prob == pytest.approx(p[t.id].item(), abs=1e-5)
        assert [q for _, q in t.top] == pytest.approx(p.topk(5).values.tolist(), abs=1e-5)
        assert [s for s, _ in t.top] == [tok.decode([i]) for i in p.topk(5).indices.tolist()]
    # top_k=3 keeps three tokens: their probabilities sum to 1 and the sampled one is among them
    for t in minitf.stream_tokens(model, tok, "JULIET: O", max_new_tokens=12, temperature=0.7, top_k=3, seed=1):
        assert len(t.top) <= 3 and sum(q for _, q in t.top) == pytest.approx(1, abs=1e-5)
        assert t.prob > 0 and min(abs(t.prob - q) for _, q in t.top) < 1e-6


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_generate_evaluate_inspect_run_in_eval_mode_and_give_back_the_callers_mode(tiny_run, training):
    model, tok, cfg = minitf.load_run(tiny_run)
    data = prepare_data(cfg.data, tok, log=lambda *a: None)
    calls = {
        "generate": lambda: minitf.generate(model, tok, "ROMEO:", max_new_tokens=2, seed=0),
        "stream_tokens": lambda: list(minitf.stream_tokens(model, tok, "ROMEO:", max_new_tokens=2, seed=0)),
        "evaluate": lambda: evaluate(model, data, cfg, torch.device("cpu"), contextlib.nullcontext()),
        "evaluate_text": lambda: evaluate_text(model, tok, cfg.data, log=lambda *a: None, splits=("val",)),
        "inspect": lambda: minitf.inspect(model, tok, "ROMEO:"),
    }
    seen = []  # the mode of a feed-forward network each time it runs (inspect calls it directly)
    model.blocks[0].mlp.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    for name, call in calls.items():
        model.train(training)
        seen.clear()
        call()
        assert seen and not any(seen), name  # no dropout while it ran
        assert model.training is training and model.blocks[0].mlp.training is training, name


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.0, top_k=None, top_p=None),
        dict(temperature=0.5, top_k=3, top_p=None),
        dict(temperature=2.0, top_k=None, top_p=0.6),
        dict(temperature=1.3, top_k=4, top_p=0.9, repetition_penalty=1.5),
        dict(temperature=0.0, top_k=2),
    ],
)
def test_sampler_distribution_is_what_sample_next_token_draws_from(settings):
    torch.manual_seed(0)
    logits, history = torch.randn(1, 8) * 2, torch.tensor([[0, 3]])
    s = SampleConfig(**settings)
    d = sampler_distribution(logits, s, history)
    penalized = logits.clone()  # CTRL's penalty on the seen tokens 0 and 3, written out
    for i in (0, 3):
        x = penalized[0, i]
        penalized[0, i] = x / s.repetition_penalty if x > 0 else x * s.repetition_penalty
    torch.testing.assert_close(d.model, penalized.softmax(-1))
    if s.temperature:
        torch.testing.assert_close(d.tempered, (penalized / s.temperature).softmax(-1))
        torch.testing.assert_close(d.probs, token_probs(logits, s, history))  # the one filtered distribution
    assert abs(d.probs.sum().item() - 1) < 1e-6 and torch.equal(d.kept, d.probs > 0)
    if s.top_k:
        assert d.kept.sum() <= s.top_k
    # kept tokens: the tempered ones renormalised; cut tokens: never drawn
    kept = d.tempered * d.kept
    torch.testing.assert_close(d.probs, kept / kept.sum())
    g = torch.Generator().manual_seed(1)
    draws = sample_next_token(
        logits.expand(4000, 8), s.temperature, s.top_k, s.top_p, g, history.expand(4000, 2), s.repetition_penalty
    )
    freq = torch.bincount(draws, minlength=8) / 4000
    assert d.kept[0][draws].all() and (freq - d.probs[0]).abs().max() < 0.03


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_a_character_cut_across_tokens_streams_whole(monkeypatch, tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = tok.encode("a\U0001f389b") + [tok.eot_id, *tok.encode(" never")]
    assert len(ids) > 3  # the emoji's four bytes are spread over several byte-level tokens
    monkeypatch.setattr(
        sys.modules["minitf.generate"], "generate_tokens", lambda *a, **k: (torch.tensor([i]) for i in ids)
    )
    pieces = list(minitf.stream(model, tok, "x", max_new_tokens=len(ids)))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "a\U0001f389b"  # and nothing after <|endoftext|>


def test_greedy_text_is_the_argmax_of_each_forward(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = tok.encode("ROMEO:")
    with torch.no_grad():
        for _ in range(15):  # the plain loop, no cache, no sampler
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    new = ids[len(tok.encode("ROMEO:")) :]
    new = new[: new.index(tok.eot_id)] if tok.eot_id in new else new
    assert minitf.generate(model, tok, "ROMEO:", max_new_tokens=15, temperature=0) == tok.decode(new)


def test_an_empty_prompt_continues_from_a_document_boundary(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = [tok.eot_id]
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    new = ids[1:]
    new = new[: new.index(tok.eot_id)] if tok.eot_id in new else new
    assert minitf.generate(model, tok, "", max_new_tokens=20, temperature=0) == tok.decode(new)


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_generate_samples_in_eval_mode_and_restores_the_callers_mode(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    model.config.dropout = 0.5
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    eval_text = minitf.generate(model.eval(), tok, "ROMEO:", max_new_tokens=20, seed=0)
    model.train()
    assert minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=0) == eval_text
    assert "".join(minitf.stream(model, tok, "ROMEO:", max_new_tokens=20, seed=0)) == eval_text
    assert model.training


def test_a_tokenizer_of_another_size_is_refused(tiny_run):
    model, _, _ = minitf.load_run(tiny_run)
    other = minitf.Tokenizer.train(["some other text entirely " * 50], vocab_size=280)
    with pytest.raises(
        MinitfError,
        match=f"the tokenizer has {other.vocab_size} tokens but the model was trained "
        f"with 300; use the tokenizer of the model's run",
    ):
        minitf.generate(model, other, "hello", max_new_tokens=3)


# scripts/generate.py as a user runs it: defaults, options, and one-line errors for bad input.


def test_library_generate_and_stream_agree(tiny_run):
    model, tok, cfg = minitf.load_run(tiny_run)
    text = minitf.generate(model, tok, "ROMEO:", max_new_tokens=40, temperature=0)
    pieces = list(minitf.stream(model, tok, "ROMEO:", max_new_tokens=40, temperature=0))
    assert "".join(pieces) == text and len(text) > 0
    uncached = minitf.generate(model, tok, "ROMEO:", max_new_tokens=40, temperature=0, use_cache=False)
    assert uncached == text
    many = minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=1, num_samples=3, temperature=1.0)
    assert isinstance(many, list) and len(many) == 3
    assert many == minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=1, num_samples=3, temperature=1.0)


def test_stop_strings_and_empty_prompt(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    full = minitf.generate(model, tok, "", max_new_tokens=60, temperature=0)
    assert len(full) > 10
    stop = full[5:8]
    cut = minitf.generate(model, tok, "", max_new_tokens=60, temperature=0, stop=[stop])
    assert cut == full[: full.find(stop)]
    assert "".join(minitf.stream(model, tok, "", max_new_tokens=60, temperature=0, stop=stop)) == cut


def test_long_prompt_keeps_its_tail(tiny_run):
    model, tok, cfg = minitf.load_run(tiny_run)
    prompt = "ROMEO: O love, sweet night! " * 40  # far more than block_size tokens
    with pytest.warns(UserWarning, match="keeping its last 32"):
        text = minitf.generate(model, tok, prompt, max_new_tokens=10, temperature=0)
    tail_prompt = tok.decode(tok.encode(prompt)[-32:])
    assert text == minitf.generate(model, tok, tail_prompt, max_new_tokens=10, temperature=0)
