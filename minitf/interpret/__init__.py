"""Interpretability on your own model: head scores, ablation, attribution, patching.

- scores.py: previous-token, duplicate-token and induction scores of every head (TransformerLens's
  head_detector), and the in-context-learning score (Olsson et al. 2022).
- ablation.py: the model with any heads switched off (zeroed, or their mean output), and the
  next-token distribution and loss before and after.
- attribution.py: direct logit attribution: each head's, FFN's, bias's and the embeddings' share
  of one logit, through the final norm's frozen scale and the LM head; the shares add up to it.
- patching.py: activation patching of a clean prompt into a corrupted one, by layer and position
  (the residual stream) or by head, as the recovered share of the logit difference.

Everything runs the model's own modules (trace.py) on token ids; nothing here trains or changes
the model's weights. Every tool checks its ids and indices the same way (checks.py), and runs its
sequences in batches that hold at most a budget of memory (memory.py). history.py and snapshots.py
read a run's snapshots for `minitf heads`.
"""

from .ablation import Ablation, ablate, mean_head_outputs
from .attribution import Attribution, attribute
from .patching import patch_heads, patch_residual
from .scores import head_scores, in_context_score, repeated_tokens

__all__ = [
    "Ablation",
    "Attribution",
    "ablate",
    "attribute",
    "head_scores",
    "in_context_score",
    "mean_head_outputs",
    "patch_heads",
    "patch_residual",
    "repeated_tokens",
]
