"""Metrics a recipe adds to each evaluation beside the held-out loss (train.eval_metric).

exact_answers: the share of held-out questions that the model answers exactly, greedily, from the
conversation before the answer (`val_exact`, and for the generated chat corpus `val_exact_<task>`
per task, in metrics.jsonl). The questions are those the chat token cache kept: every held-out
conversation of the generated corpus, and those of a user's file that give an "answer" to check.
The loss says how likely the right answer is; this says whether the model gives it. The trainer
looks the metric up here and hands it to evaluate(), which calls it and knows no more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..corpus import chat_corpus
from .answer import exact_match

QUESTIONS = 100  # held-out questions asked at each evaluation
LONGEST_ANSWER = 64  # tokens an answer may take: the most a question's right answer is granted


@dataclass(frozen=True)
class Metric:
    """compute(model, data, cfg) -> {name: value} for metrics.jsonl; words(values) -> the
    progress line's few words."""

    compute: Callable[..., dict[str, float]]
    words: Callable[[dict[str, float]], str]


def exact_answers(model, data, cfg: Config) -> dict[str, float]:
    """val_exact (all questions) and val_exact_<task>: the share of held-out questions answered exactly."""
    tok, asked = data.tokenizer, data.questions[:QUESTIONS]
    conversations = [[*q["messages"], {"role": "assistant", "content": q["answer"]}] for q in asked]
    longest = max(len(tok.encode(q["answer"])) for q in asked)  # room for the answer and its end of turn
    task_of = chat_corpus.task_of if cfg.data.source == "chat" else None
    shares = exact_match(model, tok, conversations, task_of, max_new_tokens=min(max(12, longest + 2), LONGEST_ANSWER))
    return {"val_exact" if task == "all" else f"val_exact_{task}": share for task, share in shares.items()}


def rewards(model, data, cfg: Config) -> dict[str, float]:
    """exact_answers, and what the sampled answers' rewards did since the last evaluation (data.format=rl):
    reward_mean, groups_rewarded, groups_learning and answer_tokens (rl/rollouts.py, Tally); and
    `watched`, the groups a few fixed prompts get now (the explorer shows them, evaluation by evaluation)."""
    asked = exact_answers(model, data, cfg) if data.questions else {}  # held-out lines that give an answer
    return {**asked, **data.tally.take(), "watched": data.watch(model)}


def _reward_words(v: dict[str, float]) -> str:
    return f"reward {v.get('reward_mean', 0):.2f} | answers exactly right {v.get('val_exact', 0):.0%}"


METRICS = {
    "exact_answers": Metric(exact_answers, lambda v: f"answers exactly right {v.get('val_exact', 0):.0%}"),
    "rewards": Metric(rewards, _reward_words),
}


def eval_metric(cfg: Config, data, log: Callable) -> Metric | None:
    """The metric train.eval_metric names, or None; one the data cannot give is said once, and off."""
    name = cfg.train.eval_metric
    if name == "rewards":
        if hasattr(data, "tally"):
            return METRICS[name]
        log("train.eval_metric=rewards is for data.format=rl, which samples answers: it is not computed")
        return None
    if name is not None and not getattr(data, "questions", None):  # text, or conversations with no answer to check
        log(
            f"train.eval_metric={name} asks held-out questions with an answer to check, and data.source="
            f'{cfg.data.source} holds none: it is not computed (give conversations an "answer", as '
            f'{{"messages": [...], "answer": "42"}}, or set train.eval_metric=null)'
        )
        return None
    return None if name is None else METRICS[name]
