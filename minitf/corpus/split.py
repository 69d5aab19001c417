"""Which documents are held out: the one rule every corpus splits by, files, a Hugging Face dataset
or the generated conversations alike, so that a corpus and the questions asked of it agree on val."""

from __future__ import annotations

import math
from collections.abc import Callable


def val_rule(n: int | None, f: float) -> Callable[[int], bool]:
    """Whether document i of n (None: unknown, streamed) is held out for val_fraction f."""
    if n is not None and n * f <= 0.5:  # too few documents to hold out one in 1/f: the last
        return lambda i: i == n - 1
    return lambda i: math.ceil((i + 1) * f - 0.5) > math.ceil(i * f - 0.5)
