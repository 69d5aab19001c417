"""The connections a server holds: uvicorn's h11 protocol, with what uvicorn does not bound.

- Deadlines. A new connection has `limits.silent` seconds to send its first byte, and a request's
  line and headers must arrive within `limits.timeout` seconds of the connection opening (or of the
  previous answer on a kept-alive connection): uvicorn's keep-alive timer restarts at every byte, so
  a client sending its headers a byte at a time (a slowloris) would hold its socket for ever. Past
  the deadline a started request is answered 408 and closed; a silent connection is just closed.
- Admission. A server reachable from other machines must not let a few hundred idle sockets refuse
  everyone (uvicorn's limit_concurrency answers 503 to all once it is reached, before any check). So:
  one client (an IPv4 address, an IPv6 /64) holds at most `limits.per_client` connections, and the
  server at most `limits.connections`, far above one client's share. A connection that arrives at
  either bound first closes the oldest *idle* one in its way (one that has sent nothing since it
  opened or since its last answer: an HTTP client re-opens a closed kept-alive connection as a
  matter of course); only when every connection in the way is mid-request is the new one refused,
  503 in the server's error shape. A client holding sockets open thus only loses its own oldest.
- Errors before the app. h11's rejections (a malformed request, a head over the bound while still
  arriving), and a chunk whose size alone is over the body bound (refused at once, not after the
  body's deadline), are answered 400 in the server's JSON error shape, and the connection closed.

Why wrap uvicorn's protocol rather than parse HTTP: h11 parses; these hooks only time, count and
close connections, and write a fixed answer where uvicorn would write plain text.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import socket
import sys
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

# A chunk's announced size is known to h11 alone until its data arrives: its Data events carry the
# bytes, not the size, and no public call says it. So announced_chunk reads h11's private reader,
# written against h11 0.16.0 and uvicorn 0.54.0 (tests/unit/web/test_connections.py fails loudly
# when a release moves it). Where it has moved, the check sees no size and a chunk over the bound
# is still refused, later: by read_body as its bytes pass max_body (413), or at the body's deadline
# (408) if they never come.
try:
    from h11._readers import ChunkedReader
except ImportError:
    ChunkedReader = None

PHRASES = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large", 431: "Request Header Fields Too Large"}
PHRASES[503] = "Service Unavailable"


def raw_answer(status: int, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection: written where no app can answer."""
    head = f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def client_key(client) -> str:
    """Whose connection this is: the address, an IPv6 address's /64 (one host's share of addresses)."""
    host = client[0] if client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        mapped = address.ipv4_mapped  # ::ffff:a.b.c.d on a dual-stack socket: that IPv4 address
        return str(mapped) if mapped else str(ipaddress.ip_network(f"{host}/64", strict=False))
    return str(address)


class Registry:
    """The server's open connections, oldest first, and how many each client holds."""

    def __init__(self, limits):
        self.limits = limits
        self.open: dict = {}  # protocol -> client key, in the order they opened
        self.per_client: collections.Counter = collections.Counter()

    def admit(self, conn, key: str) -> str | None:
        """Make room for conn (closing the oldest idle connection in its way); None when admitted,
        else why it is refused."""
        if self.per_client[key] >= self.limits.per_client and not self._close_idle(key):
            return f"too many open connections from your address (at most {self.limits.per_client}); reuse one"
        if len(self.open) >= self.limits.connections and not self._close_idle(None):
            return f"the server holds {len(self.open)} open connections, its most; retry in a moment"
        self.open[conn] = key
        self.per_client[key] += 1
        return None

    def forget(self, conn) -> None:
        key = self.open.pop(conn, None)
        if key is not None:
            self.per_client[key] -= 1
            if not self.per_client[key]:
                del self.per_client[key]

    def _close_idle(self, key: str | None) -> bool:
        """Close the oldest idle connection (of client `key`, or of anyone); False if there is none."""
        for conn, owner in self.open.items():
            if (key is None or owner == key) and conn.idle():
                self.forget(conn)
                conn.transport.close()
                return True
        return False


def deadline_protocol(limits, error_body: Callable[[str, int], bytes], log) -> type:
    """uvicorn's h11 protocol with the deadlines, the admission and the JSON errors above, for one
    server: error_body(message, status) is its error shape as bytes, log(line) its console."""
    slow = f"request timed out: send the whole request within {limits.timeout:g} s"
    bound = {
        "_limits": limits,
        "_registry": Registry(limits),  # every connection of this server
        "_error_body": staticmethod(error_body),
        "_log": staticmethod(log),
        "_timed_out": raw_answer(408, error_body(slow, 408)),
    }
    return type("DeadlineProtocol", (DeadlineProtocol,), bound)


class DeadlineProtocol(H11Protocol):
    """The protocol's hooks; deadline_protocol binds a server's limits, registry, error shape and log."""

    _limits, _registry, _error_body, _log, _timed_out = None, None, None, None, b""
    _deadline: asyncio.TimerHandle | None = None
    _heard = False  # bytes of a request arrived since the deadline was set
    _admitted = False
    _silent = False  # the deadline set is the short one for a connection's first byte
    _since = 0.0  # when the connection opened

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # each streamed piece leaves at once: asyncio sets TCP_NODELAY only on sockets whose proto
        # is IPPROTO_TCP, and a socket.create_server socket (and its connections) says 0
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        refused = self._registry.admit(self, client_key(self.client))
        if refused:
            self._log(f"{_peer(self.client)}: {refused}; refused")
            self._answer(503, refused)
            return
        self._admitted, self._since = True, self.loop.time()
        self._arm(min(self._limits.silent, self.timeout_keep_alive), silent=True)

    def idle(self) -> bool:
        """Nothing of a request has come since it opened or since its last answer."""
        return self._deadline is not None and not self._heard and not self.transport.is_closing()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if self._silent:  # its first byte: the rest of the head's own deadline from the opening
            self._arm(self._since + self.timeout_keep_alive - self.loop.time())
        cycle, self._heard = self.cycle, True
        super().data_received(data)
        if self.cycle is not cycle:  # a request's head is complete: the app bounds its body
            self._disarm()
        self._check_chunk()

    def _check_chunk(self) -> None:
        """A chunk announced larger than the whole body may be: 400 now, not 408 at the deadline."""
        size, bound = announced_chunk(self.conn), self._limits.max_body
        if size > bound and not self.transport.is_closing():
            self._answer(400, f"a chunk is larger than the body's bound of {bound} bytes; send less")

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request (uvicorn calls this in its except block): 400 with its reason,
        in the server's shape (a head over the bound too: it is refused while still arriving)."""
        why = str(sys.exc_info()[1] or msg)[:200]  # h11 quotes the bytes it refused: a bounded excerpt
        self._answer(400, f"malformed HTTP request ({why})")

    def _answer(self, status: int, message: str) -> None:
        """The error, then close: written raw, as no app has this request (or the app's reading
        of it ends here: it hears a disconnect and writes nothing)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
            if self.cycle.response_started:  # the app answered already: just close
                self.transport.close()
                return
        self.transport.write(raw_answer(status, self._error_body(message, status)))
        self.transport.close()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request began
            self._arm(self.timeout_keep_alive)

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._registry.forget(self)
        super().connection_lost(exc)

    def _arm(self, seconds: float, silent: bool = False) -> None:
        self._disarm()
        self._heard, self._silent = False, silent
        self._deadline = self.loop.call_later(max(0.0, seconds), self._expired)

    def _disarm(self) -> None:
        self._silent = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._heard:  # part of a request came, not all of it
            self._log(f"{_peer(self.client)}: no complete request within {self.timeout_keep_alive} s; closed")
            self.transport.write(self._timed_out)
        self.transport.close()


def announced_chunk(conn) -> int:
    """The bytes still to come of the chunk h11's connection conn is reading: at first its announced
    size, before any of its data. 0 with no chunk under way, or where this h11 no longer says (above)."""
    reader = getattr(conn, "_reader", None)
    if ChunkedReader is None or not isinstance(reader, ChunkedReader):
        return 0
    size = getattr(reader, "_bytes_in_chunk", 0)
    return size if isinstance(size, int) else 0


def _peer(client) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
