"""minitf.interpret's activation patching: the residual stream and head outputs of a clean prompt
patched into a corrupted one, on a hand-built induction model whose answer is known."""

import pytest
import torch

import minitf
from minitf.interpret import patch_heads, patch_residual, patching
from tests.interpret_models import induction_model
from tests.support.models import CLEAN, CORRUPTED, E, F


def test_residual_patching_recovers_the_answer_where_it_travels():
    got = patch_residual(induction_model(), CLEAN, CORRUPTED, answer=E, wrong=F)
    assert got.shape == (3, 10)
    # the embeddings and the stream after block 0 carry E at position 5, where the induction head
    # reads it; the last block's output only at the last position, where the head reads it
    want = torch.zeros(3, 10)
    want[0, 5] = want[1, 5] = want[2, 9] = 1.0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_head_patching_finds_the_induction_head():
    got = patch_heads(induction_model(), CLEAN, CORRUPTED, answer=E, wrong=F)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0], [1.0, 0.0]]), atol=1e-5, rtol=0)
    # one head at one position: only the induction head's output at the last position carries the answer
    by_position = patch_heads(induction_model(), CLEAN, CORRUPTED, answer=E, wrong=F, by_position=True)
    want = torch.zeros(2, 2, 10)
    want[1, 0, 9] = 1.0
    torch.testing.assert_close(by_position, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_on_any_model_the_last_stream_recovers_1_and_an_untouched_prefix_0(norm):
    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=40, block_size=32, n_layer=3, n_head=2, n_embd=16, norm=norm)
    model = minitf.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    clean = torch.tensor([5, 9, 2, 7, 7, 30, 11, 4])
    corrupted = clean.clone()
    corrupted[4] = 21  # positions 0..3 see the same tokens in both runs
    with torch.no_grad():  # the two tokens the change moves furthest apart: a logit difference well above rounding
        moved = model(clean[None])[0][0, -1] - model(corrupted[None])[0][0, -1]  # (V,)
    answer, wrong = int(moved.argmax()), int(moved.argmin())
    got = patch_residual(model, clean, corrupted, answer, wrong)
    assert got.shape == (4, 8)
    assert got[-1, -1] == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(got[-1, :-1], torch.zeros(7))  # nothing after the last block mixes positions
    assert torch.equal(got[:, :4], torch.zeros(4, 4))  # the same stream in both runs: patching changes nothing
    assert got[0, 4] == pytest.approx(1.0, abs=1e-5)  # the one different embedding, put back: the clean run
    heads = patch_heads(model, clean, corrupted, answer, wrong)
    assert heads.shape == (3, 2) and torch.isfinite(heads).all()
    by_position = patch_heads(model, clean, corrupted, answer, wrong, by_position=True)
    assert by_position.shape == (3, 2, 8)
    assert torch.equal(by_position[..., :4], torch.zeros(3, 2, 4))  # the same head outputs in both runs there
    # copies too many for one pass go in smaller batches, each with its own baselines: the same numbers
    one = patching.copy_bytes(model, 8, ("heads",))  # a budget of one copy a pass
    one_by_one = patch_residual(model, clean, corrupted, answer, wrong, budget=one)
    torch.testing.assert_close(one_by_one, got, atol=1e-5, rtol=0)
    assert one_by_one[-1, -1] == pytest.approx(1.0, abs=1e-5) and torch.equal(one_by_one[:, :4], torch.zeros(4, 4))
    heads_one_by_one = patch_heads(model, clean, corrupted, answer, wrong, by_position=True, budget=one)
    torch.testing.assert_close(heads_one_by_one, by_position, atol=1e-5, rtol=0)


def test_mistakes_are_refused_in_one_line():
    model = induction_model()
    with pytest.raises(minitf.ConfigError, match="corrupted is 9 tokens long and clean 10; pass prompts of the same"):
        patch_residual(model, CLEAN, CORRUPTED[:-1], answer=E, wrong=F)
    with pytest.raises(minitf.ConfigError, match="same logit difference"):
        patch_heads(model, CLEAN, CLEAN, answer=E, wrong=F)
    with pytest.raises(minitf.ConfigError, match=r"the wrong token holds ids outside 0..15 \(min 16, max 16\)"):
        patch_heads(model, CLEAN, CORRUPTED, answer=E, wrong=16)
