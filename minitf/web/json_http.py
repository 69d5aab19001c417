"""What minitf's two local web servers (the explorer, the OpenAI-compatible server) do the same
way with JSON and names: request bodies read strictly (a number JSON cannot hold, a string UTF-8
cannot hold or nesting past Python's recursion limit is a bad request, not a crash later), answers
that are always valid JSON (never NaN or Infinity), headers that keep browsers from caching or
sniffing them, and telling a loopback address (served to this machine only) from any other."""

from __future__ import annotations

import ipaddress
import json
import math
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

# the Host header a request to a loopback-bound server carries, unless a page on some other site
# made the browser send it (DNS rebinding): such requests are refused
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def request_host(header: str) -> str | None:
    """The host a Host header names (None when it is empty); ValueError for one that is not host[:port]."""
    try:
        parts = urlsplit(f"//{header}")
        _ = parts.port  # a port that is not a number (or past 65535) raises here
        return parts.hostname
    except ValueError:  # e.g. an unclosed [
        raise ValueError(f"the Host header {header[:100]!r} is not a host name or address with a port") from None


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


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that answers in JSON and logs through its server's `log`."""

    def _json(self, status: int, payload: dict) -> None:
        data = dumps(payload)
        self._head(status, "application/json", len(data))
        self.wfile.write(data)

    def _head(self, status: int, kind: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Cache-Control", "no-store")  # every answer is computed for this request
        self.send_header("X-Content-Type-Options", "nosniff")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def log_message(self, format: str, *args) -> None:
        self.server.log(f"{self.address_string()} {format % args}")
