"""minitf.trainer's forward_backward: gradient accumulation gives the full batch's gradient and its norm."""

import pytest
import torch
import torch.nn.functional as F

from minitf.config import ModelConfig, TrainConfig
from minitf.data import IGNORE
from minitf.model import Transformer
from minitf.optim import make_optimizer
from minitf.trainer import forward_backward, token_weights
from tests.support.models import model_and_batch as _model_and_batch
from tests.support.models import step_session

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def _step_grads(tc: TrainConfig, x, y):
    model = _model_and_batch()[0]
    halves = iter(
        [
            (
                x[i * 4 // tc.grad_accum : (i + 1) * 4 // tc.grad_accum],
                y[i * 4 // tc.grad_accum : (i + 1) * 4 // tc.grad_accum],
            )
            for i in range(tc.grad_accum)
        ]
    )
    _, norm = forward_backward(step_session(model, halves, make_optimizer(model, tc, torch.device("cpu")), tc))
    return {n: p.grad.clone() for n, p in model.named_parameters()}, norm


def test_grad_accumulation_gives_the_full_batch_gradient_and_its_norm():
    model, x, y = _model_and_batch()
    model(x, y)[1].backward()  # plain autograd on all 4 sequences
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    global_norm = torch.sqrt(sum(g.double().square().sum() for g in plain.values())).item()
    grads, norm = _step_grads(TrainConfig(grad_accum=2, grad_clip=0.0), x, y)
    for n in plain:
        torch.testing.assert_close(grads[n], plain[n], atol=1e-6, rtol=1e-5)
    assert norm.item() == pytest.approx(global_norm, rel=1e-5)
    clipped, norm = _step_grads(TrainConfig(grad_accum=2, grad_clip=0.1), x, y)
    assert norm.item() == pytest.approx(global_norm, rel=1e-5)  # the norm before clipping is what is logged
    for n in plain:
        torch.testing.assert_close(clipped[n], plain[n] * (0.1 / global_norm), atol=1e-7, rtol=1e-4)


@torch.no_grad()
def test_micro_batches_count_by_their_learned_tokens():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, n_layer=1, n_head=2, n_embd=16, block_size=16, dropout=0.0))
    x = torch.randint(50, (4, 16))
    y = torch.randint(50, (4, 16))
    y[:2, 3:] = IGNORE  # micro-batch a: 6 learned tokens
    y[2:, :] = torch.where(torch.rand(2, 16) < 0.9, y[2:], IGNORE)  # micro-batch b: about 29
    shares = token_weights([y[:2], y[2:]], world=1)
    assert [float(s) for s in shares] == pytest.approx([6 / int((y != IGNORE).sum()), 1 - 6 / int((y != IGNORE).sum())])
    accumulated = sum(model(x[s], y[s])[1] * share for s, share in zip((slice(0, 2), slice(2, 4)), shares))
    logits, _ = model(x)
    whole = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)  # every learned token once
    assert float(accumulated) == pytest.approx(float(whole), rel=1e-6)
    plain_mean = (model(x[:2], y[:2])[1] + model(x[2:], y[2:])[1]) / 2
    assert abs(float(plain_mean) - float(whole)) > 1e-3  # what averaging per micro-batch would have said


def test_text_micro_batches_each_count_one_over_grad_accum():
    """Text learns every target, so each of grad_accum equal micro-batches is 1 / grad_accum of the step."""
    ys = [torch.randint(50, (4, 16)) for _ in range(4)]
    assert [float(s) for s in token_weights(ys, world=1)] == [0.25] * 4
