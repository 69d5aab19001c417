"""minitf.trainer's forward_backward: gradient accumulation gives the full batch's gradient and its norm."""

import pytest
import torch

from minitf.config import TrainConfig
from minitf.optim import make_optimizer
from minitf.trainer import forward_backward
from tests.helpers import _model_and_batch, step_session

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
