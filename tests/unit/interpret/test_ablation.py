"""minitf.interpret.ablate: switching heads off, checked against hand computations."""

import numpy as np
import pytest
import torch

import minitf
from minitf.interpret import ablate, mean_head_outputs, repeated_tokens
from tests.interpret_models import SLOT, induction_model


def random_model(**kw) -> minitf.Transformer:
    """A small model whose every parameter (biases and norm weights too) is far from its init."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, block_size=32, n_layer=2, n_head=3, n_embd=24, positions="learned")
    model = minitf.Transformer(minitf.ModelConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


IDS = torch.tensor([[3, 7, 7, 9, 3, 7, 12, 9, 3, 3], [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]])


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_every_head_off_leaves_the_embeddings_biases_and_feed_forward_path(norm):
    model = random_model(norm=norm)
    every = [(layer, head) for layer in range(2) for head in range(3)]
    out = ablate(model, IDS, every)
    with torch.no_grad():  # by hand: attention adds only its output projection's bias
        x = model.wte(IDS) + model.wpe.wpe.weight[: IDS.size(1)]  # (B, T, C)
        for blk in model.blocks:
            x = x + blk.attn.c_proj.bias
            x = x + blk.mlp(blk.ln_2(x))
        want = model.logits(x)  # (B, T, V)
    torch.testing.assert_close(out.logits_after, want, atol=1e-6, rtol=0)
    assert out.heads == every
    torch.testing.assert_close(out.probs_after, torch.softmax(want[:, -1], dim=-1))
    loss = torch.nn.functional.cross_entropy(want[:, :-1].transpose(1, 2), IDS[:, 1:])
    assert out.loss_after == pytest.approx(float(loss), abs=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "reference"])
def test_no_head_off_is_the_models_own_forward(attention):
    model = random_model(attention=attention)
    with torch.no_grad():
        logits, _ = model(IDS)
    out = ablate(model, IDS, [])
    assert torch.equal(out.logits_before, logits) and torch.equal(out.logits_after, logits)
    assert out.loss_before == out.loss_after
    # a head's mean over a one-token text is its output there: on that text, nothing changes
    if attention == "reference":
        same = ablate(model, IDS, [(0, 1)], mode="mean", reference=IDS[:1, :1])  # a head's one-token mean
        assert not torch.equal(same.logits_after, logits)
        alone = ablate(model, IDS[:1, :1], [(0, 1)], mode="mean", reference=IDS[:1, :1])
        torch.testing.assert_close(alone.logits_after, logits[:1, :1], atol=1e-6, rtol=0)


def test_mean_ablation_puts_the_heads_mean_output_in_its_place():
    model = random_model()
    means = mean_head_outputs(model, IDS)  # (L, H, D)
    with torch.no_grad():
        x = model.wte(IDS) + model.wpe.wpe.weight[:10]
        heads0 = model.blocks[0].attn.steps(model.blocks[0].ln_1(x))["heads"]  # (B, H, T, D)
    torch.testing.assert_close(means[0], heads0.mean(dim=(0, 2)))
    out = ablate(model, IDS[1], [(1, 2)], mode="mean", reference=IDS)
    with torch.no_grad():
        x = model.wte(IDS[1:]) + model.wpe.wpe.weight[:10]
        for i, blk in enumerate(model.blocks):
            heads = blk.attn.steps(blk.ln_1(x))["heads"].clone()
            if i == 1:
                heads[:, 2] = means[1, 2]
            x = x + blk.attn.project(heads)
            x = x + blk.mlp(blk.ln_2(x))
    torch.testing.assert_close(out.logits_after, model.logits(x), atol=1e-6, rtol=0)


def test_the_induction_head_off_loses_the_second_half():
    model = induction_model()
    ids = repeated_tokens(SLOT, 7, batch=3)
    for head in [(1, 0), (0, 0)]:  # the induction head, or the previous-token head it reads
        out = ablate(model, ids, [head])
        assert out.loss_after > out.loss_before + 0.4  # the first half's losses (~log 15) stay as they were
    assert ablate(model, ids, [(1, 1)]).loss_after == pytest.approx(ablate(model, ids, []).loss_before, abs=1e-5)
    # on the second half the model is sure of the next token; without the head it is not
    out = ablate(model, ids[:, :-1], [(1, 0)])
    nxt = ids[:, -1]
    assert (out.probs_before[torch.arange(3), nxt] > 0.97).all()
    assert (out.probs_after[torch.arange(3), nxt] < 0.06).all()


def test_a_head_outside_the_model_is_refused_in_one_line():
    model = random_model()
    with pytest.raises(minitf.ConfigError, match=r"holding \(2, 0\), not in the model of 2 layers of 3 heads"):
        ablate(model, IDS, [(2, 0)])
    with pytest.raises(minitf.ConfigError, match="head 0..2"):
        ablate(model, IDS, [(0, 3)])
    with pytest.raises(minitf.ConfigError, match="'zero' or 'mean'"):
        ablate(model, IDS, [(0, 0)], mode="resample")
    assert ablate(model, IDS, [(-1, -1)]).heads == [(1, 2)]
    assert ablate(model, IDS, [(torch.tensor(1), np.int64(0))]).heads == [(1, 0)]  # integers of any kind


@pytest.mark.parametrize(
    "heads, got",
    [
        ([(0.9, 1.9)], "0.9 (a float)"),  # was rounded to (0, 1)
        (["01"], "'01' (a str), not a (layer, head) pair"),  # was read as (0, 1)
        ([(True, 1)], "True"),  # was head (1, 1)
        ([("0", "1")], "'0' (a str)"),
        (None, "None"),
        ((0, 1), "0 (an int), not a (layer, head) pair"),  # one pair, not a list of pairs
        ([(0, 1, 2)], "(0, 1, 2) (a tuple), not a (layer, head) pair"),
    ],
)
def test_heads_that_are_not_pairs_of_ints_are_refused_not_rounded(heads, got):
    with pytest.raises(minitf.ConfigError) as e:
        ablate(random_model(), IDS, heads)
    assert str(e.value).startswith("heads is ") and got in str(e.value)
    assert str(e.value).endswith("pass (layer, head) pairs of ints, layer 0..1 and head 0..2, e.g. [(0, 1)]")
