"""The HTTP server both web servers (the explorer, the OpenAI-compatible server) run on: an ASGI app
served by uvicorn, on a socket minitf opens itself.

Why uvicorn: it is the server the Python web stack stands on (FastAPI's, and vLLM's, SGLang's and
llama-cpp-python's OpenAI-compatible servers), it parses HTTP/1.1 with h11, which has no parser of
ours to get wrong, and it keeps connections alive between requests. One event loop reads every
connection, so an idle or slow client costs a socket and a buffer, never a thread.

What uvicorn does not bound, connections.py does: a deadline for a new connection's first byte and
for each request's head, how many connections one client and the server hold (the oldest idle one
closed first), and the errors written before any app sees a request, in the server's JSON shape.
The body has its own deadline (http_io.read_body).
- stopping: SIGINT (Ctrl-C) and SIGTERM (what `docker stop` and systemd send) both stop gracefully:
  `stopping` is set, so running generations end their answer with an error and the server answers
  no new request; uvicorn stops accepting connections and waits for the open ones; serve_forever
  then returns, and the command exits 0. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import os
import resource
import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from ..errors import MinitfError
from .connections import deadline_protocol


@dataclasses.dataclass
class Limits:
    connections: int = 1024  # open connections at once; past that, the oldest idle one is closed (connections.py)
    per_client: int = 64  # open connections from one address (an IPv6 /64); the same, within its own
    silent: float = 5.0  # seconds a new connection has to send its first byte (at most `timeout`)
    timeout: float = 10.0  # seconds to send a request's head, then its body, and to take each piece of an answer
    max_body: int = 1 << 20  # bytes; a larger Content-Length is answered 413 before the body is read
    max_head: int = 32 << 10  # bytes of request line and headers; a longer head is answered 431 (400 while arriving)


class Server:
    """An ASGI app served on host:port (port 0 picks a free port); `url` is where it listens.

    serve_forever() runs it in the calling thread until close() (from another thread), SIGINT or
    SIGTERM; `stopping` is set as soon as the server starts to stop. error_body(message, status) is
    the server's JSON error shape as bytes, for the answers written before any app sees a request
    (connections.py: a malformed request, a head too slow, a server full)."""

    def __init__(
        self, app, host, port, limits: Limits, log, error_body: Callable[[str, int], bytes], root="/", stopping=None
    ):
        self.limits, self.log, self.root = limits, log, root
        self.sock = listen(host, port)
        _room_for(limits.connections)
        self.loopback = is_loopback(host)  # then only requests whose Host names this machine are answered
        self.stopping = stopping or threading.Event()
        config = uvicorn.Config(
            app,
            http=deadline_protocol(limits, error_body, log),
            lifespan="off",
            log_config=None,  # minitf's own lines only: uvicorn's go to the "uvicorn" logger, warnings shown
            access_log=False,
            timeout_keep_alive=max(1, round(limits.timeout)),
            limit_concurrency=None,  # connections.py admits connections: uvicorn's would refuse everyone at once
            h11_max_incomplete_event_size=limits.max_head,
            timeout_graceful_shutdown=max(30.0, limits.timeout * 3),  # then open streams are cut
        )
        self._uvicorn = _Uvicorn(config, self.stopping)

    @property
    def server_address(self) -> tuple:
        return self.sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{self.root}"

    def serve_forever(self, ready=None) -> None:
        """Serve until close(), SIGINT or SIGTERM (these only in the main thread); then return.
        ready(), when given, is called once the server answers and the signals stop it gracefully
        (a command prints its address there: a signal sent as soon as it is read is handled)."""
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # not its "Started server process"
        self._uvicorn.ready = ready
        self._uvicorn.run(sockets=[self.sock])

    def close(self) -> None:
        """Stop serving (from another thread): running generations end at their next token."""
        self.stopping.set()
        self._uvicorn.should_exit = True


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, whose signals stop it as one graceful stop and then let the command return:
    uvicorn's own re-raises the signal once it has stopped, which would end a SIGTERM'd process with
    the signal's status instead of 0 (and turn Ctrl-C into a KeyboardInterrupt traceback)."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event):
        super().__init__(config)
        self.stopping, self.ready = stopping, None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.ready is not None and not self.should_exit:
            self.ready()

    def handle_exit(self, sig: int, frame) -> None:
        self.stopping.set()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for open connections
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        """SIGINT and SIGTERM call handle_exit while serving, in the main thread only (a server
        run in another thread, as in tests, is stopped by close())."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _room_for(connections: int) -> None:
    """Raise this process's open-file limit (its soft one, up to the hard one) so that `connections`
    sockets fit beside the files a run holds open: many systems start processes at 1024."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = connections + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            room = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one line saying why not."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise MinitfError(f"port {port} is out of range; use 1..65535, or 0 for any free port")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except (socket.gaierror, UnicodeError) as e:
        raise MinitfError(f"cannot listen on host {host!r} ({e}); pass an address such as 127.0.0.1") from None
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:  # create_server adds "(while attempting to bind ...)" to strerror: the errno's name is enough
        why = os.strerror(e.errno) if e.errno else str(e)
        raise MinitfError(f"cannot serve on {host}:{port} ({why}); pass another --port (0 picks a free one)") from None


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False
