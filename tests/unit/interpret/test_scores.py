"""minitf.interpret's head scores on hand-built heads whose patterns are known, and against
TransformerLens's head_detector definitions written out as that file writes them."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import minitf
from minitf.interpret import head_scores, in_context_score, repeated_tokens, scores

from .interpret_models import SLOT, induction_model

N = 5  # the repeated sequence's length: ids are <|endoftext|>, then 5 tokens, then the same 5
T = 2 * N + 1


def bos_repeated(batch=3, seed=0):
    """repeated_tokens behind a first token (0) that never repeats, as TransformerLens prepends BOS."""
    ids = repeated_tokens(SLOT, N, batch=batch, seed=seed)  # (B, 2N)
    return torch.cat([torch.zeros(batch, 1, dtype=torch.long), ids], dim=1)  # (B, T)


def uniform_share(rows) -> float:
    """The score of a head attending uniformly to the tokens so far, when each of `rows` has one
    pattern entry: row i gives it 1 / (i + 1); TransformerLens divides by the weights' sum, T."""
    return sum(1 / (i + 1) for i in rows) / T


def test_repeated_tokens_repeat_distinct_ids_and_never_endoftext():
    ids = repeated_tokens(50, 20, batch=4, seed=3)
    assert ids.shape == (4, 40) and ids.dtype == torch.long
    assert torch.equal(ids[:, :20], ids[:, 20:])
    assert int(ids.min()) >= 1 and int(ids.max()) <= 49
    assert all(len(set(row[:20].tolist())) == 20 for row in ids)
    assert torch.equal(ids, repeated_tokens(50, 20, batch=4, seed=3))
    assert not torch.equal(ids, repeated_tokens(50, 20, batch=4, seed=4))
    assert repeated_tokens(5, 10, batch=2).min() >= 1  # longer than the vocabulary: drawn with replacement


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_hand_built_heads_score_what_their_patterns_give(norm):
    s = head_scores(induction_model(norm), bos_repeated())
    assert set(s) == {"previous_token", "duplicate_token", "induction"}
    assert all(v.shape == (2, 2) for v in s.values())
    second_half = range(N + 1, T)
    uniform_previous = uniform_share(range(1, T))  # head 1 of both layers: uniform attention
    expected = {
        # layer 0 head 0 looks at i - 1 from every row but the first: (T - 1) / T; layer 1 head 0 attends
        # uniformly on the first half (no earlier copy), then at the token after the copy (i - N + 1)
        "previous_token": [[(T - 1) / T, uniform_previous], [uniform_share(range(1, N + 1)), uniform_previous]],
        "duplicate_token": [[0.0, uniform_share(second_half)], [0.0, uniform_share(second_half)]],
        # a perfect induction head on N tokens repeated: N rows of T have somewhere to look
        "induction": [[0.0, uniform_share(second_half)], [N / T, uniform_share(second_half)]],
    }
    for name, want in expected.items():
        torch.testing.assert_close(s[name], torch.tensor(want), atol=1e-6, rtol=0, msg=name)


def transformer_lens_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three detection patterns as transformer_lens/head_detector.py computes them (numpy, roll, cat)."""
    n = tokens.shape[-1]
    previous = torch.zeros(n, n)
    previous[1:, :-1] = torch.eye(n - 1)
    token_pattern = tokens.repeat(n, 1).numpy()
    eq_mask = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq_mask, 0)
    duplicate = torch.tril(torch.as_tensor(eq_mask).float())
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    induction = torch.tril(torch.cat((torch.zeros(n, 1), shifted[:, 1:]), dim=1))
    return {"previous_token": torch.tril(previous), "duplicate_token": duplicate, "induction": induction}


def test_scores_of_a_random_model_on_text_follow_transformer_lens_head_detector(monkeypatch):
    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=40, block_size=32, n_layer=2, n_head=3, n_embd=24)
    model = minitf.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    # a text with repeats at several distances, as a tokenizer would give: one sequence, (T,)
    ids = torch.tensor([3, 7, 7, 9, 3, 7, 12, 9, 3, 3, 21, 7, 12, 5])
    s = head_scores(model, ids)
    ins_weights = []
    with torch.no_grad():
        x = model.wte(ids[None])  # (1, T, C); rope adds no position vector
        for blk in model.blocks:
            ins_weights.append(blk.attn.steps(blk.ln_1(x), model.rope)["weights"][0])  # (H, T, T)
            x = x + blk.attn(blk.ln_1(x), rope=model.rope)
            x = x + blk.mlp(blk.ln_2(x))
    for name, pattern in transformer_lens_patterns(ids).items():
        want = torch.tensor([[float((w[h] * pattern).sum() / w[h].sum()) for h in range(3)] for w in ins_weights])
        torch.testing.assert_close(s[name], want, atol=1e-6, rtol=0, msg=name)
    # a batch is the mean of its sequences' scores
    batch = torch.stack([ids, ids.flip(0)])
    both = head_scores(model, batch)
    torch.testing.assert_close(both["induction"], (s["induction"] + head_scores(model, ids.flip(0))["induction"]) / 2)
    # a batch too big for one pass's weights goes in chunks, with the same scores
    monkeypatch.setattr(scores, "WEIGHTS_BUDGET", 1)
    for name, v in head_scores(model, batch).items():
        torch.testing.assert_close(v, both[name], atol=1e-6, rtol=0)


def test_in_context_score_is_the_late_loss_minus_the_early_one():
    model = induction_model()
    ids = repeated_tokens(SLOT, 7, batch=3)  # (3, 14): late = 12, early = 1
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])  # (3, 13, V)
    losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (3, 13)
    score = in_context_score(model, ids)
    assert score == pytest.approx(float(losses[:, 12].mean() - losses[:, 1].mean()), abs=1e-5)
    # the induction head predicts the second half: the late token is far easier than the early one
    assert score < -3
    assert in_context_score(model, ids, early=0, late=8) == pytest.approx(
        float(losses[:, 8].mean() - losses[:, 0].mean()), abs=1e-5
    )


def test_mistakes_are_refused_in_one_line():
    model = induction_model()
    with pytest.raises(minitf.ConfigError, match="block_size=16"):
        head_scores(model, torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(minitf.ConfigError, match="outside 0..15"):
        head_scores(model, torch.tensor([1, 2, 16]))
    with pytest.raises(minitf.ConfigError, match="at least 12 tokens"):
        in_context_score(model, torch.tensor([1, 2, 3, 4]))
    with pytest.raises(minitf.ConfigError, match="late=13"):
        in_context_score(model, repeated_tokens(SLOT, 7), late=13)
