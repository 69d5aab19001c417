"""Group-relative policy optimisation (GRPO): the update that learns from a reward.

Supervised fine-tuning imitates answers someone wrote. GRPO lets the model answer for itself and
learns from how good its answers were: for each prompt, sample a group of G answers from the model
being trained, score each with a reward (a plain function: is the answer right?), and make every
token of an answer more likely in proportion to its advantage, how much better its reward was
than the group's mean:

    advantage_i = reward_i - mean(rewards of its group)               (group_advantages)
    loss        = - sum_i advantage_i * sum_t log p(token_t of answer i) / (answer tokens)

An answer better than its siblings is pushed up, a worse one down, and a group whose answers all
scored the same (all right, all wrong) teaches nothing: its advantages are zero. The group's mean
is the baseline that a separate value network gives in PPO; no second model is kept.

The choices, with their references:
- the advantage is centred, not divided by the group's standard deviation (DeepSeekMath's GRPO
  divides; Dr. GRPO, Liu et al. 2025, showed the division weighs too-easy and too-hard prompts up,
  and nanochat's chat_rl leaves it out too);
- on-policy: each group is sampled by the current weights and used for one step, so PPO's ratio
  of new to old probabilities is 1 and its clipping never acts: the loss is the plain policy
  gradient above (as nanochat's);
- no KL penalty to the starting model: it would keep a second model in memory, and one step per
  sample keeps the policy close anyway (DAPO and Dr. GRPO drop it as well);
- the sum is over every answer token of the step, divided by their number: each token weighs the
  same, as in supervised fine-tuning's loss, so a long answer is not worth more than a short one
  per token (the loop's token_weights divides across micro-batches exactly as for SFT).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data import IGNORE


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards (P, G), G answers to each of P prompts -> advantages (P, G): each reward less its group's mean."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def policy_loss(model, x: torch.Tensor, y: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The GRPO loss of a micro-batch of sampled answers: x (B, T) prompt and answer ids, y (B, T)
    the next ids with IGNORE everywhere but the answer's tokens, advantages (B,) one per answer.
    Its gradient raises the log-probability of each answer's tokens in proportion to its advantage."""
    logits, _ = model(x)  # (B, T, V)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE, reduction="none")
    log_p = -nll.view_as(y)  # (B, T): log p of each sampled token, 0 where IGNORE
    answered = (y != IGNORE).sum().clamp(min=1)  # answer tokens in the micro-batch
    return -(advantages[:, None] * log_p).sum() / answered
