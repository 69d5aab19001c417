"""Interpretability on minitf's own models: what learners ask TransformerLens for.

- scores.py: previous-token, duplicate-token and induction scores of every head (TransformerLens's
  head_detector), and the in-context-learning score (Olsson et al. 2022).

Everything runs the model's own modules (trace.py) on token ids; nothing here trains or changes
the model's weights.
"""

from .scores import head_scores, in_context_score, repeated_tokens

__all__ = ["head_scores", "in_context_score", "repeated_tokens"]
