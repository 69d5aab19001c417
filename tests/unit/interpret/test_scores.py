"""minitf.interpret's head scores on hand-built heads whose patterns are known, and against
TransformerLens's head_detector definitions written out as that file writes them."""

import pytest
import torch
import torch.nn.functional as F

import minitf
from minitf.interpret import head_scores, in_context_score, repeated_tokens
from tests.interpret_models import SLOT, induction_model

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
    with pytest.raises(minitf.ConfigError, match=r"late is 13; pass an int in 0..12 \(a prediction position"):
        in_context_score(model, repeated_tokens(SLOT, 7), late=13)
