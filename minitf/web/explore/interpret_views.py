"""The explorer's two interpretability views, as JSON-ready dicts: the heads of the model (their
scores on the text, and the next token with chosen heads switched off) and the direct logit
attribution of one next token (each head's, feed-forward's and bias's share of its logit).

The numbers are minitf.interpret's: `head_scores`, `ablate`, `attribute`. api.py checks the
page's input and calls these on the window of ids the model read before the selected position.
"""

from __future__ import annotations

import torch

from ...interpret import ablate, attribute, head_scores
from ...model import Transformer
from ...system.runtime import eval_mode

DIGITS = 6  # decimals sent, as api.py's


def rounded(t: torch.Tensor):
    """A tensor as (nested) lists of floats rounded to DIGITS places."""

    def r(x):
        return [r(y) for y in x] if isinstance(x, list) else round(x, DIGITS)

    return r(t.tolist())


def heads_view(model: Transformer, window: list[int], heads: list[tuple[int, int]], mode: str, top: int, label) -> dict:
    """Every head's scores on the window (layers x heads), and the next token after it with every
    head and with `heads` switched off: the `top` likeliest tokens of either run, each with its
    probability in both; the window's mean next-token loss in both (null for one token)."""
    scores = head_scores(model, window)  # {name: (L, H)}
    ab = ablate(model, window, heads, mode=mode)
    before, after = ab.probs_before[0].cpu(), ab.probs_after[0].cpu()  # (V,) each
    shown = before.topk(min(top, before.numel())).indices.tolist()
    shown += [i for i in after.topk(min(top, after.numel())).indices.tolist() if i not in shown]
    return {
        "scores": {name: rounded(s) for name, s in scores.items()},
        "heads": [list(p) for p in ab.heads],
        "mode": mode,
        "loss": {
            "before": None if ab.loss_before is None else round(ab.loss_before, DIGITS),
            "after": None if ab.loss_after is None else round(ab.loss_after, DIGITS),
        },
        "tokens": [
            {
                "id": i,
                "label": label(i),
                "before": round(float(before[i]), DIGITS),
                "after": round(float(after[i]), DIGITS),
                "rank": int((before > before[i]).sum()) + 1,
            }
            for i in shown
        ],
    }


@torch.no_grad()
def predicted(model: Transformer, window: list[int], top: int) -> list[int]:
    """The `top` likeliest next tokens after the window, likeliest first."""
    w = model.wte.weight
    with eval_mode(model):
        logits, _ = model(torch.tensor([window], device=w.device))  # (1, T, V)
    return logits[0, -1].float().topk(min(top, logits.size(-1))).indices.tolist()


def attribution_view(model: Transformer, window: list[int], token: int, against: int | None, label) -> dict:
    """Each part's direct share of the logit of `token` (minus `against`'s) after the window: the
    embeddings, every head (layers x heads), each attention bias and feed-forward network, the
    final norm's bias; they add up to `logit` (before a soft cap, if the model has one)."""
    a = attribute(model, window, token, position=-1, against=against)
    return {
        "target": {"id": token, "label": label(token)},
        "against": None if against is None else {"id": against, "label": label(against)},
        "logit": round(a.logit, DIGITS),
        "total": round(a.total(), DIGITS),
        "softcap": model.config.logit_softcap,
        "parts": {
            "embedding": round(a.embedding, DIGITS),
            "positions": round(a.positions, DIGITS),
            "norm_bias": round(a.norm_bias, DIGITS),
        },
        "heads": rounded(a.heads),
        "attn_bias": rounded(a.attn_bias),
        "ffn": rounded(a.ffn),
        "choices": [{"id": i, "label": label(i)} for i in predicted(model, window, 5)],
    }
