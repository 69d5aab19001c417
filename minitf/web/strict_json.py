"""JSON as minitf's two web servers (the explorer, the OpenAI-compatible server) read and write it:
request bodies read strictly (a number JSON cannot hold, a string UTF-8 cannot hold or nesting past
Python's recursion limit is a bad request, not a crash later), and answers that are always valid
JSON (never NaN or Infinity, which Python's json writes and no browser or client reads).

Why not the web framework's own JSON: Starlette and FastAPI parse with Python's json, which takes
all three of those; and the strictness must be the same for both servers."""

from __future__ import annotations

import json
import math


def loads(raw: bytes):
    """A request body's JSON value, read strictly; ValueError with one line saying what is wrong.

    Python's json takes 1e400 (as inf), NaN and Infinity, and strings with lone surrogates, none of
    which JSON allows (RFC 8259) and each of which fails somewhere later; deep nesting raises
    RecursionError. Each is refused here, named."""

    def number(text: str) -> float:
        x = float(text)
        if not math.isfinite(x):
            raise _Refused(f"the request body holds a number too large for JSON ({text[:40]}); send a finite number")
        return x

    def whole(text: str) -> int:
        if len(text) > 100:  # Python refuses to parse past 4300 digits anyway; no field needs 100
            raise _Refused(f"the request body holds a number too large for JSON ({text[:40]}...); send a smaller one")
        return int(text)

    def constant(name: str):
        raise _Refused(f"the request body holds {name}, which is not a number JSON allows; send a finite number")

    try:
        value = json.loads(raw, parse_float=number, parse_int=whole, parse_constant=constant)
    except _Refused as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("the request body's JSON is nested too deeply; send at most a few levels") from None
    except ValueError:  # UnicodeDecodeError is one
        raise ValueError("the request body is not valid JSON") from None
    try:  # "\ud800" in JSON decodes to a lone surrogate, which no UTF-8 text (and no tokenizer) holds
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"the request body holds a lone surrogate {e.object[e.start]!r}, which is not text; send valid Unicode"
        ) from None
    return value


class _Refused(Exception):
    """A value loads() refuses while parsing (not a ValueError, which json would take as its own)."""


def dumps(payload) -> bytes:
    """JSON bytes of an answer, never holding NaN or Infinity, which Python would write and no JSON
    parser (a browser's, an OpenAI client's) reads, so the whole answer would be lost. A number that
    is not finite (a diverged run's loss, a NaN from broken weights) is left out of its object, as
    a value that is not there (the page's loss chart skips it), and is null in a list, where
    positions count (as a browser's JSON.stringify writes it)."""
    try:
        return json.dumps(payload, allow_nan=False).encode()
    except ValueError:
        return json.dumps(_finite(payload), allow_nan=False).encode()


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
