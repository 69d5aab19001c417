"""The JSON fields of a request, checked the one way both web apps check them.

A request body comes from a browser (the explorer) or any HTTP client (the server), so every
number in it is checked for its type and its range before it reaches the model: a bool is not a
number, a float is not a whole number, and 1e400 or NaN never get this far (strict_json refuses
them). A value that cannot be used raises BadRequest, whose one line names the field; each app
answers it in its own JSON error shape (http_io.error_answer).
"""

from __future__ import annotations

import math

from ..errors import MinitfError


class BadRequest(MinitfError):
    """A request that cannot be used (HTTP 400); param names the field, where one is at fault."""

    status = 400

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def whole(x, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """x as an int in lo..hi (None: no bound that side); a bool, a float or text is refused."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise BadRequest(f"{name} must be a whole number, got {x!r}", name)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise BadRequest(f"{name} is {x}; it must be {_span(lo, hi)}", name)
    return x


def number(x, name: str, lo: float | None = None, hi: float | None = None, low_open: bool = False) -> float:
    """x as a float in [lo, hi] ((lo, hi] with low_open; None: no bound that side); a bool or text is refused."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise BadRequest(f"{name} must be a number, got {x!r}", name)
    if (lo is not None and (x < lo or (low_open and x == lo))) or (hi is not None and x > hi):
        span = f"{'(' if low_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise BadRequest(f"{name} is {x}; it must be in {span}", name)
    return float(x)


def flag(x, name: str) -> bool:
    """x as a bool; null is false."""
    if x is None:
        return False
    if not isinstance(x, bool):
        raise BadRequest(f"{name} must be true or false, got {x!r}", name)
    return x


def _span(lo, hi) -> str:
    if hi is None:
        return f">= {lo}"
    return f"{lo}..{hi}" if lo is not None else f"<= {hi}"
