"""minitf.interpret.attribute: every part's direct share of a logit, adding up to the logit."""

import itertools

import pytest
import torch

import minitf
from minitf.interpret import attribute, repeated_tokens
from tests.interpret_models import SLOT, induction_model

IDS = torch.tensor([3, 7, 7, 9, 3, 7, 12, 9, 3, 3])


def random_model(**kw) -> minitf.Transformer:
    """A small model whose every parameter (biases and norm weights too) is far from its init."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, block_size=32, n_layer=2, n_head=3, n_embd=24)
    model = minitf.Transformer(minitf.ModelConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.mark.parametrize(
    "norm, bias, positions", list(itertools.product(["layernorm", "rmsnorm"], [True, False], ["learned", "rope"]))
)
def test_the_parts_add_up_to_the_models_logit(norm, bias, positions):
    model = random_model(norm=norm, bias=bias, positions=positions, tie_embeddings=bias)
    with torch.no_grad():
        logits, _ = model(IDS[None])  # (1, T, V)
    for token, position in [(5, -1), (39, 0), (3, 6)]:
        a = attribute(model, IDS, token, position=position)
        assert a.logit == pytest.approx(float(logits[0, position, token]), abs=1e-5)
        assert a.total() == pytest.approx(a.logit, abs=1e-5)
        assert a.heads.shape == (2, 3) and a.attn_bias.shape == (2,) and a.ffn.shape == (2,)
        if not bias:  # no biases: those parts are zero, not missing
            assert a.norm_bias == 0.0 and torch.equal(a.attn_bias, torch.zeros(2))
        if positions == "rope":
            assert a.positions == 0.0
        else:
            assert a.positions != 0.0


def test_a_logit_difference_is_the_difference_of_the_parts():
    model = random_model(ffn="swiglu", n_kv_head=1, positions="sinusoidal")
    a, b, diff = (attribute(model, IDS, 5), attribute(model, IDS, 7), attribute(model, IDS, 5, against=7))
    assert diff.total() == pytest.approx(diff.logit, abs=1e-5)
    assert diff.logit == pytest.approx(a.logit - b.logit, abs=1e-5)
    torch.testing.assert_close(diff.heads, a.heads - b.heads, atol=1e-5, rtol=0)
    assert diff.norm_bias == pytest.approx(a.norm_bias - b.norm_bias, abs=1e-6)


def test_with_a_soft_cap_the_logit_before_the_cap_is_split():
    model = random_model(logit_softcap=2.0)
    a = attribute(model, IDS, 5)
    with torch.no_grad():
        capped, _ = model(IDS[None])
    assert float(capped[0, -1, 5]) == pytest.approx(2.0 * torch.tanh(torch.tensor(a.logit / 2.0)).item(), abs=1e-5)
    assert a.total() == pytest.approx(a.logit, abs=1e-5)


def test_the_induction_head_writes_the_predicted_token():
    model = induction_model()
    ids = repeated_tokens(SLOT, 7, batch=1)[0, :-1]  # (13,): the last token is the second copy's 6th
    nxt = int(repeated_tokens(SLOT, 7, batch=1)[0, -1])
    a = attribute(model, ids, nxt)
    assert a.total() == pytest.approx(a.logit, abs=1e-5)
    # the layer-1 induction head is the only part that writes the next token (10x its one-hot);
    # nothing else touches the token slot but the current token's own embedding, a different id
    assert a.heads[1, 0] > 0.9 * a.logit > 0
    assert a.embedding == pytest.approx(0.0, abs=1e-6) and a.positions == pytest.approx(0.0, abs=1e-6)
    assert float(a.heads[0].abs().sum() + a.ffn.abs().sum() + a.heads[1, 1].abs()) < 1e-6


def test_mistakes_are_refused_in_one_line():
    model = random_model()
    with pytest.raises(minitf.ConfigError, match=r"token holds ids outside 0..39 \(min 40, max 40\)"):
        attribute(model, IDS, 40)
    with pytest.raises(minitf.ConfigError, match=r"position is 10; pass an int in -10..9 \(a position of the 10"):
        attribute(model, IDS, 1, position=10)
    with pytest.raises(minitf.ConfigError, match="ids is a batch of 2 sequences; pass one sequence"):
        attribute(model, torch.stack([IDS, IDS]), 1)
