"""The HTTP side of the OpenAI-compatible server: connections, requests, routes, server-sent events.
What each route answers is completions.py's.

    GET  /v1/models                 the one model: the run's name
    GET  /v1/models/{name}          that model
    POST /v1/completions            a completion, or a stream of server-sent events ending in [DONE]
    POST /v1/chat/completions       OpenAI's answer for a completions-only model (404)

Why not ThreadingHTTPServer: it starts a thread per connection, and a thread then waits for the
connection's request however slowly it comes, so a few hundred idle or slow clients (a slowloris)
hold a few hundred threads and the memory behind them. Here one thread reads every connection's
request without blocking (selectors), each within `timeout` seconds of connecting, and hands
only complete requests to a fixed pool of `workers` threads. So the thread count is fixed
(1 + workers), a slow or idle client costs a socket and a buffer until its deadline, and cannot
delay anyone else's request. A full queue or too many connections is answered 503 at once.

One request per connection (HTTP/1.0): a stream ends when its connection closes, and a client
that closes its connection stops its completion: the next token's write fails, or the worker
sees the connection closed between tokens (a client that only shuts its sending side is taken
as gone too). Binds 127.0.0.1 unless told otherwise, and then answers only requests whose Host
names this machine (a guard against DNS rebinding); every POST must be JSON, which keeps a web
page from posting to the server without asking first (CORS). With an api_key, every request must
carry it (Authorization: Bearer KEY, as OpenAI clients send their key), or is answered 401.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import io
import json
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
from urllib.parse import urlsplit

from ..config import MinitfError
from ..httpjson import LOOPBACK_NAMES, JSONHandler, is_loopback
from .completions import APIError, Cancelled, Completions

HEAD_END = re.compile(rb"\r?\n\r?\n")


@dataclasses.dataclass
class Limits:
    workers: int = 8  # threads that answer complete requests (completions.py bounds how many generate)
    queue: int = 32  # complete requests waiting for a worker; past that, 503 at once
    connections: int = 256  # connections still sending their request; past that, 503 at once
    timeout: float = 10.0  # seconds to send a whole request, and for each write of the answer
    max_body: int = 1 << 20  # bytes; a larger Content-Length is answered 413 before it is read
    max_head: int = 32 << 10  # bytes of request line and headers


class CompletionServer:
    """An HTTP server over one Completions; `url` is where it listens (port 0 picks a free port).
    serve_forever() runs it in the calling thread until close() (from another thread)."""

    def __init__(
        self, api: Completions, host: str = "127.0.0.1", port: int = 8000, limits=None, log=None, api_key=None
    ):
        self.api, self.limits, self.api_key = api, limits or Limits(), api_key
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.sock = listen(host, port)
        self.loopback = is_loopback(host)
        self.stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()  # close() wakes the reading thread with a byte
        self._ready: queue.Queue = queue.Queue(self.limits.queue)
        self._workers: list[threading.Thread] = []

    @property
    def server_address(self) -> tuple:
        return self.sock.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve_forever(self) -> None:
        self._workers = [
            threading.Thread(target=self._work, name=f"minitf-serve:{self.server_address[1]}/{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        for t in self._workers:
            t.start()
        try:
            self._read_requests()
        finally:
            self.stopping.set()  # running completions end at their next token; waiting requests get 503
            for _ in self._workers:
                self._ready.put(None)  # blocks only while the queue is full: workers are taking from it
            self._stopped.set()

    def close(self) -> None:
        """Stop serving: running completions end at their next token; returns when all have."""
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
                    reply(conn, APIError("request timed out: send the whole request at once", 408))
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
            reply(conn, busy("too many open connections"))
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
        except APIError as e:
            # answered at once; then the rest of what the client sends is read and dropped (until it
            # has sent all, or the deadline), so that it gets to read the answer: closing a socket
            # with unread bytes resets the connection, and many clients read only after sending
            reply(conn, e)
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
                reply(conn, busy("too many requests are waiting"))
                conn.close()

    # ---- the workers

    def _work(self) -> None:
        while (job := self._ready.get()) is not None:
            conn, raw, addr = job
            if self.stopping.is_set():
                reply(conn, busy("shutting down"))
                conn.close()
                continue
            try:
                conn.setblocking(True)
                conn.settimeout(self.limits.timeout)  # a client that stops reading fails the write
                _Handler((conn, raw), addr, self)
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
        """True when the whole request has arrived; APIError for one that cannot be taken."""
        if self.length is None:
            # only the new bytes (and the 3 before them) are searched: a client that sends its head a
            # byte at a time must not make the server scan it again each time
            end = HEAD_END.search(self.buf, max(0, self.scanned - 3), limits.max_head + 4)
            if end is None:
                if len(self.buf) > limits.max_head:
                    raise APIError(f"the request line and headers exceed {limits.max_head} bytes", 431)
                self.scanned = len(self.buf)
                return False
            lines = bytes(self.buf[: end.start()]).split(b"\n", 1)
            headers = parse_headers(io.BytesIO(lines[1] + b"\r\n\r\n" if len(lines) > 1 else b"\r\n"))
            if headers.get("Transfer-Encoding"):
                raise APIError("send the body with a Content-Length, not chunked", 411)
            sizes = headers.get_all("Content-Length") or ["0"]
            if len(set(sizes)) != 1 or not sizes[0].strip().isdigit():
                raise APIError(f"Content-Length {', '.join(sizes)!r} is not one number of bytes", 400)
            size = int(sizes[0])
            if size > limits.max_body:
                raise APIError(f"the request body is {size} bytes; at most {limits.max_body}", 413)
            self.length = end.end() + size
            if headers.get("Expect", "").lower() == "100-continue" and len(self.buf) < self.length:
                with contextlib.suppress(OSError):
                    conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")  # a few bytes: never blocks
        return len(self.buf) >= self.length


def reply(conn: socket.socket, error: APIError) -> None:
    """An error reply from the reading thread: a few hundred bytes, sent without blocking (the
    socket's buffer takes them; if not, the client is not reading anyway)."""
    body = json.dumps(error.body()).encode()
    phrase = HTTPStatus(error.status).phrase
    head = f"HTTP/1.0 {error.status} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(head.encode() + b"Connection: close\r\n\r\n" + body)


def busy(why: str) -> APIError:
    return APIError(f"The server is overloaded ({why}); retry in a moment", 503, "server_error", code="busy")


def listen(host: str, port: int) -> socket.socket:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise MinitfError(f"port {port} is out of range; use 1..65535, or 0 for any free port")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except (socket.gaierror, UnicodeError) as e:
        raise MinitfError(f"cannot listen on host {host!r} ({e}); pass an address such as 127.0.0.1") from None
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        raise MinitfError(
            f"cannot serve on {host}:{port} ({e.strerror or e}); pass another --port (0 picks a free one)"
        ) from None


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


class _Handler(JSONHandler):
    """One complete request, already read: its bytes come from memory, the answer goes to the socket."""

    server: CompletionServer
    protocol_version = "HTTP/1.0"  # one request per connection: a stream ends when it closes

    def setup(self) -> None:
        self.connection, raw = self.request
        self.rfile, self.wfile = io.BytesIO(raw), _Writer(self.connection)

    def finish(self) -> None:
        pass  # the worker closes the connection

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _not_allowed(self) -> None:
        self._answer(lambda: self._error(APIError(f"{self.command} is not allowed on {self._path()}", 405)))

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

    def _path(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _get(self) -> None:
        path, api = self._path(), self.server.api
        if path == "/v1/models":
            self._json(200, api.models())
        elif path.startswith("/v1/models/"):
            api.check_model(path.removeprefix("/v1/models/"))
            self._json(200, api.model_card())
        elif path in ("/v1/completions", "/v1/chat/completions"):
            raise APIError(f"GET is not allowed on {path}; POST a JSON request", 405)
        else:
            raise APIError(f"Invalid URL (GET {path})", 404, code="unknown_url")

    def _post(self) -> None:
        path, api = self._path(), self.server.api
        if path == "/v1/completions":
            req = api.parse(self._body())
            cancelled = lambda: self.server.stopping.is_set() or client_gone(self.connection)
            if req.stream:
                self._stream(api.stream(req, cancelled))
            else:
                self._json(200, api.complete(req, cancelled))
        elif path == "/v1/chat/completions":
            api.chat(self._body())
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            raise APIError(f"POST is not allowed on {path}; GET it", 405)
        else:
            raise APIError(f"Invalid URL (POST {path})", 404, code="unknown_url")

    def _answer(self, respond) -> None:
        """Run respond(): an APIError becomes its status and OpenAI's error shape, another
        MinitfError a 400, a bug a 500 (the story in the server's console); one line each."""
        try:
            host = urlsplit(f"//{self.headers.get('Host', '')}").hostname
        except ValueError:  # e.g. an unclosed [
            return self._error(APIError("the Host header is not a host name or address", 400))
        if self.server.loopback and host not in LOOPBACK_NAMES:
            return self._error(APIError("this server answers requests for 127.0.0.1 or localhost only", 403))
        key = self.server.api_key
        if key and not hmac.compare_digest(self.headers.get("Authorization", "").encode(), f"Bearer {key}".encode()):
            return self._error(
                APIError("Incorrect API key provided; pass the server's --api-key", 401, code="invalid_api_key")
            )
        try:
            respond()
        except APIError as e:
            self._error(e)
        except MinitfError as e:
            self._error(APIError(str(e), 400))
        except Cancelled as e:
            self.log_message("%s: the client went away; its completion stopped", e)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the client went away before its answer
        except Exception as e:
            self.server.log(traceback.format_exc())
            self._error(APIError(f"internal error ({type(e).__name__}); see the server's console", 500, "server_error"))

    def _body(self) -> dict:
        if self.headers.get_content_type() != "application/json":
            raise APIError("send the request as JSON (Content-Type: application/json)", 400)
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise APIError("We could not parse the JSON body of your request: it is not valid JSON", 400) from None
        if not isinstance(body, dict):
            raise APIError("the request body must be a JSON object", 400)
        return body

    def _stream(self, chunks) -> None:
        """Server-sent events, one per chunk, then [DONE]. The first chunk is made before the reply
        begins, so a busy server still answers 503; a failed write closes the generator, which
        stops the completion."""
        try:
            first = next(chunks, None)
            self._head(200, "text/event-stream; charset=utf-8")
            sent = 0
            try:
                for chunk in [first] if first is not None else []:
                    self.wfile.write(sse(chunk))
                for chunk in chunks:
                    self.wfile.write(sse(chunk))
                    sent += 1
                self.wfile.write(b"data: [DONE]\n\n")
            except (OSError, TimeoutError):  # BrokenPipe, ConnectionReset and a write timeout are OSErrors
                self.log_message("the client closed its stream after %d chunks; its completion stopped", sent + 1)
            except Cancelled as e:
                self.log_message("%s: the client went away; its completion stopped", e)
            except Exception as e:  # the reply has begun: the error goes in the stream, the story to the console
                self.server.log(traceback.format_exc())
                error = APIError(
                    f"generation failed ({type(e).__name__}); see the server's console", 500, "server_error"
                )
                with contextlib.suppress(OSError):
                    self.wfile.write(sse(error.body()))
        finally:
            chunks.close()

    def _error(self, e: APIError) -> None:
        self._json(e.status, e.body())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a malformed request line or header, an unknown method), as JSON."""
        self.close_connection = True
        kind = "server_error" if code >= 500 else "invalid_request_error"
        with contextlib.suppress(OSError):
            self._json(code, APIError(message or HTTPStatus(code).phrase, code, kind).body())


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
