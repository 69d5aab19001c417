"""GRPO's update (minitf/rl/grpo.py): advantages are each reward less its group's mean, the loss
is the advantage-weighted log-probability of the answers' tokens over their number, tokens outside
the answers get no gradient, and a group whose rewards are all equal changes nothing."""

import pytest
import torch

from minitf.config import ModelConfig
from minitf.data import IGNORE
from minitf.model import Transformer
from minitf.rl.grpo import group_advantages, policy_loss
from minitf.rl.rollouts import _pack


def test_advantages_are_rewards_less_their_groups_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.5]])
    assert group_advantages(rewards).tolist() == [
        [0.5, -0.5, -0.5, 0.5],
        [0.0, 0.0, 0.0, 0.0],  # all wrong: nothing to learn
        [0.75, -0.25, -0.25, -0.25],  # one right of four
        [0.0, 0.5, -0.5, 0.0],
    ]


class Logits(torch.nn.Module):
    """A 'model' whose logits are a parameter: the loss's gradient on each position is readable."""

    def __init__(self, B, T, V):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.randn(B, T, V, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return self.logits, None


def test_the_loss_is_the_advantage_weighted_log_probability_of_the_answers():
    model = Logits(2, 4, 5)
    x = torch.zeros(2, 4, dtype=torch.long)
    y = torch.tensor([[IGNORE, 3, 1, IGNORE], [IGNORE, IGNORE, 4, 2]])  # answers: (3, 1) and (4, 2)
    advantages = torch.tensor([0.5, -0.25])
    log_p = torch.log_softmax(model.logits.detach(), dim=-1)
    by_hand = -(0.5 * (log_p[0, 1, 3] + log_p[0, 2, 1]) - 0.25 * (log_p[1, 2, 4] + log_p[1, 3, 2])) / 4
    loss = policy_loss(model, x, y, advantages)
    assert torch.allclose(loss, by_hand, atol=1e-6)
    loss.backward()
    grad = model.logits.grad.abs().sum(-1)  # (B, T)
    assert (grad[y == IGNORE] == 0).all()  # the prompt and the padding: no gradient at all
    assert (grad[y != IGNORE] > 0).all()


def tiny():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16))


def test_a_group_whose_rewards_are_equal_changes_nothing():
    model = tiny()
    rows = [([1, 2, 3], [4, 5, 6]), ([1, 2, 3], [7, 8]), ([1, 2, 3], [9]), ([1, 2, 3], [10, 11])]
    x, y = _pack(rows, pad=0)
    for rewards in ([[1.0, 1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0, 0.0]], [[0.3, 0.3, 0.3, 0.3]]):
        model.zero_grad()
        policy_loss(model, x, y, group_advantages(torch.tensor(rewards)).flatten()).backward()
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    model.zero_grad()
    policy_loss(model, x, y, group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]])).flatten()).backward()
    assert any(p.grad is not None and p.grad.any() for p in model.parameters())  # one right answer: it learns


def test_a_better_answer_becomes_likelier_after_a_step():
    model = tiny()
    rows = [([1, 2, 3], [4, 5]), ([1, 2, 3], [6, 7])]
    x, y = _pack(rows, pad=0)

    def log_p(row):  # log p of the row's answer tokens under the model
        lp = torch.log_softmax(model(x)[0], -1)
        return sum(lp[row, t, y[row, t]] for t in range(y.size(1)) if y[row, t] != IGNORE).item()

    before = [log_p(0), log_p(1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    policy_loss(model, x, y, group_advantages(torch.tensor([[1.0, 0.0]])).flatten()).backward()
    optimizer.step()
    assert log_p(0) > before[0]
    assert log_p(0) - log_p(1) > before[0] - before[1]  # the rewarded answer gained on the other


def test_packing_puts_targets_on_the_answers_only():
    x, y = _pack([([5, 6, 7], [8, 9]), ([5], [10, 11, 12])], pad=0)
    # row 0: ids 5 6 7 8 9 -> x 5 6 7 8, y predicts 8 from 7 and 9 from 8
    assert x.tolist() == [[5, 6, 7, 8], [5, 10, 11, 0]]
    assert y.tolist() == [[IGNORE, IGNORE, 8, 9], [10, 11, 12, IGNORE]]


@pytest.mark.parametrize("n", [1, 3])
def test_padding_rows_are_never_learned(n):
    x, y = _pack([([1] * n, [2])] + [([1], [3, 4, 5, 6])], pad=0)
    assert (y != IGNORE).sum().item() == 1 + 4
