"""The connection side of minitf's two local web servers (the explorer, the OpenAI-compatible server):
accepting connections, reading whole requests within a deadline, and answering them from a fixed
pool of threads. What each server answers is its own (minitf/web/explore/server.py, minitf/web/serve/server.py).

Why not the standard library's ThreadingHTTPServer: it starts a thread per connection, and a thread
then waits for the connection's request however slowly it comes, so a few hundred idle or slow
clients (a slowloris) hold a few hundred threads and the memory behind them, for ever. Here one
thread reads every connection's request without blocking (selectors), each within `timeout`
seconds of connecting, and hands only complete requests to a fixed pool of `workers` threads. So
the thread count is fixed (1 + workers), a slow or idle client costs a socket and a buffer until
its deadline (then it is answered 408 and closed), and cannot delay anyone else's request. A full
queue or too many connections is answered 503 at once.

One request per connection (HTTP/1.0): an answer, or a stream, ends when its connection closes.
A worker writes with the same timeout, so a client that stops reading fails the write and frees
its worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import queue
import re
import select
import selectors
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
from http.client import parse_headers

from ..errors import MinitfError
from .json_http import LOOPBACK_NAMES, JSONHandler, dumps, is_loopback, request_host

HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclasses.dataclass
class Limits:
    workers: int = 8  # threads that answer complete requests (each server bounds how many generate)
    queue: int = 32  # complete requests waiting for a worker; past that, 503 at once
    connections: int = 256  # connections still sending their request; past that, 503 at once
    timeout: float = 10.0  # seconds to send a whole request, and for each write of the answer
    max_body: int = 1 << 20  # bytes; a larger Content-Length is answered 413 before it is read
    max_head: int = 32 << 10  # bytes of request line and headers


class RequestError(MinitfError):
    """A request answered with an error by the connection layer: status is the HTTP status; code a
    short machine-readable word for the servers whose error shape has one (e.g. "busy")."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def busy(why: str) -> RequestError:
    return RequestError(f"The server is overloaded ({why}); retry in a moment", 503, code="busy")


class BoundedServer:
    """An HTTP server whose requests `handler` (a MemoryHandler subclass) answers, one complete
    request at a time in a worker thread; `url` is where it listens (port 0 picks a free port).
    serve_forever() runs it in the calling thread until close() (from another thread) or Ctrl-C.

    A subclass says how an error looks to its clients (error_body); the default is {"error": "..."}."""

    handler: type[MemoryHandler]
    name = "minitf-http"  # the worker threads are named f"{name}:{port}/{i}"
    root = "/"  # where its pages are under the address: url ends with it

    def __init__(self, host: str, port: int, limits: Limits | None = None, log=None):
        self.limits = limits or Limits()
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.sock = listen(host, port)
        self.loopback = is_loopback(host)  # then only requests whose Host names this machine are answered
        self.stopping = threading.Event()  # set when serving ends: running generations stop
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the reading thread with a byte
        self._ready: queue.Queue = queue.Queue(self.limits.queue)
        self._workers: list[threading.Thread] = []

    def error_body(self, error: RequestError) -> dict:
        return {"error": str(error)}

    @property
    def server_address(self) -> tuple:
        return self.sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{self.root}"

    def serve_forever(self) -> None:
        self._workers = [
            threading.Thread(target=self._work, name=f"{self.name}:{self.server_address[1]}/{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        for t in self._workers:
            t.start()
        try:
            self._read_requests()
        finally:
            self.stopping.set()  # running generations end at their next token; waiting requests get 503
            for _ in self._workers:
                self._ready.put(None)  # blocks only while the queue is full: workers are taking from it
            self._stopped.set()

    def close(self) -> None:
        """Stop serving: running generations end at their next token; returns when all have."""
        self.stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._workers:
            self._stopped.wait()
        for t in self._workers:
            t.join(30)
        for s in (self.sock, self._wake_r, self._wake_w):
            s.close()

    # ---- the reading thread: whole requests, without blocking, within the timeout

    def _read_requests(self) -> None:
        sel = selectors.DefaultSelector()
        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        incoming: dict[socket.socket, _Incoming] = {}
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                wait = min((c.deadline for c in incoming.values()), default=now + 1.0) - now
                for key, _ in sel.select(max(0.0, wait)):
                    if key.data == "accept":
                        self._accept(sel, incoming)
                    elif key.data != "wake":
                        self._receive(key.fileobj, sel, incoming)
                now = time.monotonic()
                for conn in [c for c, inc in incoming.items() if inc.deadline <= now]:
                    sel.unregister(conn)
                    inc = incoming.pop(conn)
                    if inc.draining:
                        conn.close()
                        continue
                    self.log(f"{inc.addr}: no complete request within {self.limits.timeout:g} s; closed")
                    self._reply(conn, RequestError("request timed out: send the whole request at once", 408))
                    conn.close()
        finally:
            for conn in incoming:
                conn.close()
            sel.close()

    def _accept(self, sel, incoming: dict) -> None:
        try:
            conn, addr = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        conn.setblocking(False)
        if len(incoming) >= self.limits.connections:
            self._reply(conn, busy("too many open connections"))
            return conn.close()
        incoming[conn] = _Incoming(f"{addr[0]}:{addr[1]}", time.monotonic() + self.limits.timeout)
        sel.register(conn, selectors.EVENT_READ)

    def _receive(self, conn: socket.socket, sel, incoming: dict) -> None:
        inc = incoming[conn]
        try:
            data = conn.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client left before its request was complete, or has sent all it had to
            sel.unregister(conn)
            del incoming[conn]
            conn.close()
            return
        if inc.draining:
            return
        inc.buf += data
        try:
            complete = inc.parse(self.limits, conn)
        except RequestError as e:
            # answered at once; then the rest of what the client sends is read and dropped (until it
            # has sent all, or the deadline), so that it gets to read the answer: closing a socket
            # with unread bytes resets the connection, and many clients read only after sending
            self._reply(conn, e)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            inc.draining, inc.buf = True, bytearray()
            return
        if complete:
            sel.unregister(conn)
            del incoming[conn]
            try:
                self._ready.put_nowait((conn, bytes(inc.buf[: inc.length]), inc.addr))
            except queue.Full:
                self._reply(conn, busy("too many requests are waiting"))
                conn.close()

    def _reply(self, conn: socket.socket, error: RequestError) -> None:
        """An error reply from the reading thread: a few hundred bytes, sent without blocking (the
        socket's buffer takes them; if not, the client is not reading anyway)."""
        body = dumps(self.error_body(error))
        phrase = HTTPStatus(error.status).phrase
        head = f"HTTP/1.0 {error.status} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        with contextlib.suppress(OSError):
            conn.setblocking(False)
            conn.send(head.encode() + b"Connection: close\r\n\r\n" + body)

    # ---- the workers

    def _work(self) -> None:
        while (job := self._ready.get()) is not None:
            conn, raw, addr = job
            if self.stopping.is_set():
                self._reply(conn, busy("shutting down"))
                conn.close()
                continue
            try:
                conn.setblocking(True)
                conn.settimeout(self.limits.timeout)  # a client that stops reading fails the write
                self.handler((conn, raw), addr, self)
            except Exception:  # a bug: the story in the console; the connection closes below
                self.log(traceback.format_exc())
            finally:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()


@dataclasses.dataclass
class _Incoming:
    """A connection whose request is still arriving."""

    addr: str
    deadline: float
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    length: int | None = None  # the whole request's bytes, once its head has arrived
    draining: bool = False  # answered already (an error); what still arrives is dropped
    scanned: int = 0  # bytes of buf searched for the end of the head

    def parse(self, limits: Limits, conn: socket.socket) -> bool:
        """True when the whole request has arrived; RequestError for one that cannot be taken."""
        if self.length is None:
            # only the new bytes (and the 3 before them) are searched: a client that sends its head a
            # byte at a time must not make the server scan it again each time
            end = HEAD_END.search(self.buf, max(0, self.scanned - 3), limits.max_head + 4)
            if end is None:
                if len(self.buf) > limits.max_head:
                    raise RequestError(f"the request line and headers exceed {limits.max_head} bytes", 431)
                self.scanned = len(self.buf)
                return False
            lines = bytes(self.buf[: end.start()]).split(b"\n", 1)
            headers = parse_headers(io.BytesIO(lines[1] + b"\r\n\r\n" if len(lines) > 1 else b"\r\n"))
            if headers.get("Transfer-Encoding"):
                raise RequestError("send the body with a Content-Length, not chunked", 411)
            sizes = headers.get_all("Content-Length") or ["0"]
            size = sizes[0].strip()
            # ASCII digits only: str.isdigit() also takes '²' or '٣', which int() then refuses (or reads)
            if len(set(sizes)) != 1 or not (size.isascii() and size.isdigit()):
                raise RequestError(f"Content-Length {', '.join(sizes)!r} is not one number of bytes", 400)
            size = int(size)
            if size > limits.max_body:
                raise RequestError(f"the request body is {size} bytes; at most {limits.max_body}", 413)
            self.length = end.end() + size
            if headers.get("Expect", "").lower() == "100-continue" and len(self.buf) < self.length:
                with contextlib.suppress(OSError):
                    conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")  # a few bytes: never blocks
        return len(self.buf) >= self.length


def listen(host: str, port: int) -> socket.socket:
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


def client_gone(conn: socket.socket) -> bool:
    """True when the client has closed its end (a read would give end of file) or reset it."""
    try:
        if not select.select([conn], [], [], 0)[0]:
            return False
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


class _Writer(io.RawIOBase):
    """The answer's bytes, each write sent whole (socket.sendall), so nothing waits in a buffer."""

    def __init__(self, conn: socket.socket):
        self.conn = conn

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.conn.sendall(b)
        return len(b)


class MemoryHandler(JSONHandler):
    """One complete request, already read: its bytes come from memory, the answer goes to the socket."""

    server: BoundedServer
    protocol_version = "HTTP/1.0"  # one request per connection: a stream ends when it closes

    def setup(self) -> None:
        self.connection, raw = self.request
        self.rfile, self.wfile = io.BytesIO(raw), _Writer(self.connection)
        if self.disable_nagle_algorithm:  # a streamed piece leaves as soon as it is written
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)

    def finish(self) -> None:
        pass  # the worker closes the connection

    def _error(self, error: RequestError) -> None:
        self._json(error.status, self.server.error_body(error))

    def _host_refusal(self) -> RequestError | None:
        """Why this request is not answered, from its Host header: malformed (400), or, on a server
        bound to a loopback address, naming another host (403): a page on some other site made the
        browser send it (DNS rebinding). None when it may be answered."""
        try:
            host = request_host(self.headers.get("Host", ""))
        except ValueError as e:
            return RequestError(str(e), 400)
        if self.server.loopback and host not in LOOPBACK_NAMES:
            return RequestError("this server answers requests for 127.0.0.1 or localhost only", 403)
        return None

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line or header, an unknown method), as JSON."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._error(RequestError(message or HTTPStatus(code).phrase, code))
