"""data.format=rl: prompts the model being trained answers in groups, scored, as the loop's batches.

The data are conversations with a checkable answer, read into the chat token cache as for
fine-tuning (conversations/cache.py): each one up to its last question is a prompt, and its
expected answer is the generated corpus's last answer or a user's line's "answer". A training
micro-batch of train.batch_size rows is batch_size // rl.group_size prompts drawn at random, each
answered rl.group_size times by sampling the model as it is now (`sample_group`: minitf's sampler
over a KV cache), every answer scored by rl.reward (rewards.py) and given its advantage
(grpo.py). The batch is x (B, T) prompt and answer ids, y (B, T) the next ids with IGNORE outside
the answers, and the advantages (B,): the loop's one step takes it as it takes any batch.

Evaluation reads the chat cache as fine-tuning does: the loss of the expected answers, held out,
and the exact answers to the held-out questions; beside them, what the rewards did since the
last evaluation (`Tally`): their mean, the share of groups with a rewarded answer, the share that
learned anything (rewards that differ), and the answers' length.

Exact resume: the prompts and the sampling seed of each micro-batch are drawn from the loop's batch
generator, which every checkpoint keeps, so a resumed run samples the same answers.
"""

from __future__ import annotations

import torch

from ..config import Config
from ..conversations.data import ChatData
from ..data import IGNORE
from ..errors import MinitfError
from ..fast.decoding import decode_step
from ..kv_cache import KVCache
from ..sampling import draw_next_token
from ..system.runtime import eval_mode
from .grpo import group_advantages
from .rewards import reward_function, score

WATCHED = 3  # prompts whose groups every evaluation samples again, with the same seed: the policy moving


class RolloutData:
    """The prompts of a chat token cache, answered by the policy in groups (get_batch(..., policy))."""

    SAMPLED = True  # batches come from the model as it is: never read ahead of an update (session.prefetch)

    def __init__(self, chat: ChatData, cfg: Config, log=print):
        self.chat, self.tokenizer, self.meta, self.log = chat, chat.tokenizer, chat.meta, log
        self.group, self.answer_tokens, self.reward_name = cfg.rl.group_size, cfg.rl.answer_tokens, cfg.rl.reward
        self.reward = reward_function(cfg.rl.reward)
        if cfg.train.batch_size % self.group:
            raise MinitfError(
                f"train.batch_size={cfg.train.batch_size} answers per micro-batch is not a multiple of "
                f"rl.group_size={self.group}; set train.batch_size to a multiple (e.g. {2 * self.group})"
            )
        template = self.tokenizer.chat_template
        self.end = template.end_of_turn(self.tokenizer)
        checked = [q for q in chat.prompts if q["answer"] is not None or cfg.rl.reward != "exact"]
        if not checked:  # exact compares with an expected answer: without one every reward would be 0
            raise MinitfError(
                f"data.source={cfg.data.source} holds no prompt with an answer to check, which rl.reward=exact "
                f'needs; give lines an "answer" ({{"messages": [...], "answer": "42"}}), or a reward of your own'
            )
        self.prompts = [
            (q["messages"], q["answer"], template.prompt_ids(self.tokenizer, q["messages"])) for q in checked
        ]
        self.questions, self.tally = chat.questions, Tally()

    def bytes_per_token(self, split: str) -> float:
        return self.chat.bytes_per_token(split)

    def batch_words(self, rows: int, block_size: int) -> str:
        return f"{rows // self.group} prompts x {self.group} sampled answers of up to {self.answer_tokens} tokens"

    def check_fits(self, block_size: int) -> None:
        """The held-out conversations fit (as for fine-tuning); a prompt that leaves no room for an
        answer of rl.answer_tokens is left out, and counted."""
        self.chat.check_fits(block_size)
        room = block_size - self.answer_tokens
        kept = [p for p in self.prompts if len(p[2]) <= room]
        if len(kept) < len(self.prompts):
            self.log(
                f"data: leaving out {len(self.prompts) - len(kept):,} of {len(self.prompts):,} prompts longer than "
                f"block_size - rl.answer_tokens = {room} tokens"
            )
        if not kept:
            raise MinitfError(f"no prompt fits in block_size={block_size} with rl.answer_tokens={self.answer_tokens}")
        self.prompts = kept

    def get_batch(self, split, batch_size, block_size, generator, device="cpu", policy=None):
        """With policy (training): batch_size sampled answers as (x, y, advantages). Without (evaluation):
        the chat cache's batches of expected answers, (x, y)."""
        if policy is None:
            return self.chat.get_batch(split, batch_size, block_size, generator, device)
        where = generator.device
        picks = torch.randint(len(self.prompts), (batch_size // self.group,), generator=generator, device=where)
        seed = int(torch.randint(2**62, (1,), generator=generator, device=where))  # this batch's sampling
        sampler = torch.Generator(next(policy.parameters()).device).manual_seed(seed)
        rows, rewards = [], []
        for i in picks.tolist():
            answers, _, scored = self._group(policy, self.prompts[i], sampler)
            rewards.append(scored)
            rows += [(self.prompts[i][2], a) for a in answers]
        rewards = torch.tensor(rewards)  # (P, G)
        self.tally.add(rewards, [len(a) for _, a in rows])
        x, y = _pack(rows, self.tokenizer.eot_id)
        return x.to(device), y.to(device), group_advantages(rewards).flatten().to(device)  # (B,) advantages

    def watch(self, policy) -> list[dict]:
        """The groups of the first WATCHED prompts, sampled now with one seed: each answer as text
        and tokens, its reward and its advantage (every token of an answer gets the answer's)."""
        out = []
        for prompt in self.prompts[:WATCHED]:
            sampler = torch.Generator(next(policy.parameters()).device).manual_seed(0)
            answers, texts, rewards = self._group(policy, prompt, sampler)
            kept = [self._text_ids(a) for a in answers]
            advantages = group_advantages(torch.tensor([rewards], dtype=torch.float64))[0].tolist()
            group = [
                {"text": t, "tokens": [self.tokenizer.decode([i]) for i in a], "reward": r, "advantage": round(v, 4)}
                for t, a, r, v in zip(texts, kept, rewards, advantages)
            ]
            out.append({"prompt": prompt[0][-1]["content"], "expected": prompt[1], "answers": group})
        return out

    def _group(self, policy, prompt: tuple, sampler) -> tuple[list[list[int]], list[str], list[float]]:
        """One prompt's group: the sampled answers' ids (each with its end of turn, if written), their
        text (without it) and each one's reward."""
        messages, expected, ids = prompt
        answers = sample_group(policy, ids, self.group, self.answer_tokens, self.end, sampler)
        texts = [self.tokenizer.decode(self._text_ids(a)) for a in answers]
        return answers, texts, [score(self.reward, self.reward_name, messages, t, expected) for t in texts]

    def _text_ids(self, answer: list[int]) -> list[int]:
        """An answer's ids without its end of turn, which is no text."""
        return answer[:-1] if answer[-1] == self.end else answer


@torch.inference_mode()
def sample_group(model, prompt: list[int], n: int, max_tokens: int, end: int, generator) -> list[list[int]]:
    """n answers to one prompt, sampled from the model as it is (temperature 1: the policy's own
    distribution, which the gradient assumes): the prompt through the model once into a KV cache,
    the cache copied n ways, then one token per answer per step until each has written its end
    of turn (kept) or max_tokens."""
    device = next(model.parameters()).device
    with eval_mode(model):
        cache = KVCache(model, 1)
        logits = model(torch.tensor([prompt], device=device), cache=cache)[0][:, -1]  # (1, V)
        cache, logits = cache.repeat(n), logits.repeat(n, 1)  # (n, V)
        drawn, ended = [], torch.zeros(n, dtype=torch.bool, device=device)
        for _ in range(max_tokens):
            nxt = draw_next_token(logits, 1.0, None, None, generator, None, 1.0)  # (n,)
            drawn.append(nxt)
            ended |= nxt == end
            if ended.all():
                break
            logits = decode_step(model, nxt[:, None], cache)  # (n, V)
    answers = torch.stack(drawn, dim=1).tolist()  # (n, steps)
    return [a[: a.index(end) + 1] if end in a else a for a in answers]


def _pack(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt, answer) rows -> x (B, T) their ids, padded, and y (B, T) the next ids where they are
    the answer's (IGNORE elsewhere: the prompt is context, the padding nothing)."""
    width = max(len(p) + len(a) for p, a in rows) - 1
    x = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
    y = torch.full((len(rows), width), IGNORE, dtype=torch.long)  # (B, T)
    for b, (prompt, answer) in enumerate(rows):
        ids = prompt + answer
        x[b, : len(ids) - 1] = torch.tensor(ids[:-1])
        y[b, len(prompt) - 1 : len(ids) - 1] = torch.tensor(answer)  # position t predicts ids[t + 1]
    return x, y


class Tally:
    """What the rewards did since the last evaluation (take() reads and starts again)."""

    def __init__(self):
        self.rewards: list[torch.Tensor] = []
        self.lengths: list[int] = []

    def add(self, rewards: torch.Tensor, lengths: list[int]) -> None:
        self.rewards.append(rewards)
        self.lengths += lengths

    def take(self) -> dict[str, float]:
        if not self.rewards:
            return {}
        r = torch.cat(self.rewards)  # (groups, G)
        out = {
            "reward_mean": r.mean().item(),
            "groups_rewarded": (r > 0).any(dim=1).float().mean().item(),  # a group with an answer worth something
            "groups_learning": (r != r[:, :1]).any(dim=1).float().mean().item(),  # rewards that differ: a gradient
            "answer_tokens": sum(self.lengths) / len(self.lengths),
        }
        self.__init__()
        return out
