"""Metrics a recipe adds to each evaluation beside the held-out loss (train.eval_metric).

exact_answers: the share of the generated chat corpus's held-out questions that the model answers
exactly, greedily, from the question (`val_exact`, and `val_exact_<task>` per task in
metrics.jsonl). The loss says how likely the right answer is; this says whether the model gives it.
The trainer looks the metric up here and hands it to evaluate(), which calls it and knows no more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config import Config
from ..corpus import chat_corpus
from .answer import exact_match

QUESTIONS = 100  # held-out questions asked at each evaluation


@dataclass(frozen=True)
class Metric:
    """compute(model, tokenizer, cfg) -> {name: value} for metrics.jsonl; words(values) -> the
    progress line's few words."""

    compute: Callable[..., dict[str, float]]
    words: Callable[[dict[str, float]], str]


def exact_answers(model, tokenizer, cfg: Config) -> dict[str, float]:
    """val_exact (all tasks) and val_exact_<task>: the share of held-out questions answered exactly."""
    questions = chat_corpus.held_out(QUESTIONS, cfg.data.val_fraction)
    shares = exact_match(model, tokenizer, questions, chat_corpus.task_of)
    return {"val_exact" if task == "all" else f"val_exact_{task}": share for task, share in shares.items()}


METRICS = {"exact_answers": Metric(exact_answers, lambda v: f"answers exactly right {v['val_exact']:.0%}")}


def eval_metric(cfg: Config, log: Callable) -> Metric | None:
    """The metric train.eval_metric names, or None; one the data cannot give is said once, and off."""
    name = cfg.train.eval_metric
    if name is not None and cfg.data.source != "chat":  # the held-out questions are the generated corpus's
        log(
            f"train.eval_metric={name} asks the generated chat corpus's held-out questions, which "
            f"data.source={cfg.data.source} does not hold: it is not computed (set train.eval_metric=null)"
        )
        return None
    return None if name is None else METRICS[name]
