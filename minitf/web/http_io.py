"""What minitf's two web servers (the explorer, the OpenAI-compatible server) do the same way with a
request and its answer, on the ASGI stack (stack.py): refusing a request before any route sees it
(a Host header naming another site, a missing API key, a server that is stopping), reading a JSON
body within bounds, answering JSON (an error in each app's own shape), and streaming an answer
made by a blocking generator.

Every request is untrusted: its body is read only up to `max_body` bytes (a larger Content-Length is
refused before a byte of the body is read, a chunked body is cut off at the bound) and within
`timeout` seconds. The model's work runs in worker threads, never in the event loop, so a
generation never delays another connection's request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import threading
import traceback
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..errors import MinitfError
from .stack import Limits
from .strict_json import dumps

# the Host header a request to a loopback-bound server carries, unless a page on some other site
# made the browser send it (DNS rebinding): such requests are refused
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}  # computed per request; never sniffed


class RequestError(MinitfError):
    """A request answered with an error: status is the HTTP status; code a short machine-readable
    word for the servers whose error shape has one (e.g. "busy")."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


def busy(why: str) -> RequestError:
    return RequestError(f"The server is overloaded ({why}); retry in a moment", 503, code="busy")


def json_answer(status: int, payload) -> Response:
    return Response(dumps(payload), status, NO_STORE, "application/json")


def error_answer(error: MinitfError, shape: Callable[[MinitfError, int], dict]) -> Response:
    """An error as a JSON answer: its own status (400 when it carries none), and the body in the
    app's shape (the explorer's {"error": line}, OpenAI's {"error": {message, type, param, code}})."""
    status = getattr(error, "status", 400)
    return json_answer(status, shape(error, status))


def request_host(header: str) -> str | None:
    """The host a Host header names (None when it is empty); ValueError for one that is not host[:port]."""
    try:
        parts = urlsplit(f"//{header}")
        _ = parts.port  # a port that is not a number (or past 65535) raises here
        return parts.hostname
    except ValueError:  # e.g. an unclosed [
        raise ValueError(f"the Host header {header[:100]!r} is not a host name or address with a port") from None


def framing(scope) -> RequestError | None:
    """A request whose target or framing is not an origin server's to take (h11 lets both through):
    an absolute-form target (http://host/path, for a proxy), or Content-Length together with
    Transfer-Encoding, which a proxy framing by Content-Length would split differently (request
    smuggling; RFC 9112 section 6.1: such a request is answered, then the connection closed)."""
    target = scope["raw_path"]
    if not target.startswith(b"/"):
        return RequestError(f"the request target {target[:100].decode('latin-1')!r} is not a path; send /...", 400)
    names = {name for name, _ in scope["headers"]}
    if b"content-length" in names and b"transfer-encoding" in names:
        return RequestError("a request may not carry both Content-Length and Transfer-Encoding; send one", 400)
    return None


class Guard:
    """ASGI middleware that answers, before any route: a request line and headers over `max_head`
    bytes (431: h11 bounds only a head still arriving, not one that came whole); a target or framing
    an origin server must refuse (framing: 400, and the connection closed); a malformed Host
    header (400); on a server bound to a loopback address, a Host naming another site (403: a page
    on some other site made the browser send it, DNS rebinding); without the server's api_key
    (401); and while the server stops (503). `error(RequestError) -> Response` gives each server
    its error shape."""

    def __init__(self, app, limits: Limits, loopback: bool, stopping: threading.Event, error: Callable, api_key=None):
        self.app, self.limits, self.loopback, self.stopping = app, limits, loopback, stopping
        self.error, self.api_key = error, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            head = (
                len(scope["raw_path"]) + len(scope["query_string"]) + sum(len(k) + len(v) for k, v in scope["headers"])
            )
            if head > self.limits.max_head:
                refused = RequestError(f"the request line and headers exceed {self.limits.max_head} bytes", 431)
            else:
                refused = framing(scope) or self.refusal(Headers(scope=scope))
            if refused:
                answer = self.error(refused)
                if refused.status == 400:  # the bytes after a malformed request cannot be trusted to start one
                    answer.headers["Connection"] = "close"
                return await answer(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers) -> RequestError | None:
        try:
            host = request_host(headers.get("host", ""))
        except ValueError as e:
            return RequestError(str(e), 400)
        if self.loopback and host not in LOOPBACK_NAMES:
            return RequestError("this server answers requests for 127.0.0.1 or localhost only", 403)
        sent = headers.get("authorization", "").encode()
        if self.api_key and not hmac.compare_digest(sent, f"Bearer {self.api_key}".encode()):
            return RequestError("Incorrect API key provided; pass the server's --api-key", 401, "invalid_api_key")
        if self.stopping.is_set():
            return busy("shutting down")
        return None


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request's JSON body, bounded in size and time; RequestError (400, 408, 413) otherwise."""
    size = int(request.headers.get("content-length", 0))  # h11 has checked it is one number
    if size > limits.max_body:
        raise RequestError(f"the request body is {size} bytes; at most {limits.max_body}", 413)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":  # also makes browsers ask first (CORS) before a page posts here
        raise RequestError("send the request as JSON (Content-Type: application/json)", 400)
    body = bytearray()
    try:
        with anyio.fail_after(limits.timeout):  # asyncio.timeout is Python 3.11+
            async for piece in request.stream():
                body += piece
                if len(body) > limits.max_body:  # a chunked body has no Content-Length to refuse first
                    raise RequestError(f"the request body is over {limits.max_body} bytes; send less", 413)
    except TimeoutError:
        raise RequestError(f"request timed out: send the whole body within {limits.timeout:g} s", 408) from None
    except ClientDisconnect:  # nobody is left to answer: the error only ends the request
        raise RequestError("the client left before sending its whole body", 400) from None
    return bytes(body)


async def watched(request: Request, work: Callable[[threading.Event], object]):
    """work(gone) run in a worker thread, with `gone` set as soon as the client closes its
    connection (so a generation it asked for stops at its next token)."""
    gone = threading.Event()
    async with watching(request, gone):
        return await run_in_threadpool(work, gone)


@contextlib.asynccontextmanager
async def watching(request: Request, gone: threading.Event):
    """While the block runs, `gone` is set as soon as the request's client closes its connection."""
    watcher = asyncio.create_task(_watch(request.receive, gone))
    try:
        yield
    finally:
        watcher.cancel()


async def _watch(receive, gone: threading.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


class Stream(Response):
    """An answer streamed from `chunks`, a blocking generator of bytes (made with the `gone` event
    that is set when the client leaves). One worker thread runs the generator through, never waiting
    for the event loop between pieces (a generation runs at its own speed), at most `AHEAD` pieces
    ahead of what the client has taken, so a slow reader slows only its own generation. The event
    loop sends what was made every `GATHER` seconds at most, in one write: each of its wake-ups is
    Python time the generations lose under the GIL. Each write must go within `timeout` seconds (a
    client that stops reading is dropped); however the answer ends, the generator is closed, which
    stops its generation. `first` is a piece already made, sent at once."""

    AHEAD, GATHER = 64, 0.02

    def __init__(self, chunks: Iterator[bytes], first: bytes, gone: threading.Event, kind: str, timeout: float, log):
        self.status_code, self.background = 200, None
        headers = {**NO_STORE, "Content-Type": kind}  # no Content-Length: the answer's end is the stream's
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.chunks, self.first, self.gone, self.timeout, self.log = chunks, first, gone, timeout, log

    async def __call__(self, scope, receive, send) -> None:
        pieces = _Handoff(asyncio.get_running_loop(), self.AHEAD)
        watcher = asyncio.create_task(_watch(receive, self.gone))
        maker = asyncio.ensure_future(run_in_threadpool(self._make, pieces))
        sent = 0
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            batch, held = [self.first], 0  # held: the batch's places in pieces.room
            while batch and batch[0] is not None:
                ended = batch[-1] is None
                batch = batch[:-1] if ended else batch
                with anyio.fail_after(self.timeout):
                    await send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
                sent += len(batch)
                pieces.release(held)
                if ended:
                    break
                with anyio.move_on_after(self.GATHER):  # or less, when the generator has ended
                    await pieces.ended.wait()
                batch = await pieces.take()
                held = len(batch) - (batch[-1] is None)
            await send({"type": "http.response.body", "body": b""})
        except (TimeoutError, OSError):
            self.log(f"the client stopped reading its stream after {sent} pieces; its generation stopped")
        finally:
            self.gone.set()  # a generation still running stops at its next piece
            watcher.cancel()
            await maker

    def _make(self, pieces: _Handoff) -> None:
        """In a worker thread: the generator's pieces to the event loop, then None."""
        try:
            for piece in self.chunks:
                while not pieces.room.acquire(timeout=0.25):  # the client reads slowly: wait, unless it left
                    if self.gone.is_set():
                        return
                pieces.put(piece)
        finally:
            self.chunks.close()
            pieces.put(None)


class _Handoff:
    """Pieces handed from a worker thread to the event loop. The thread wakes the loop only while
    the loop waits for a piece, not for every piece; `room` bounds how many are made ahead."""

    def __init__(self, loop, ahead: int):
        self.loop, self.made, self.ready, self.ended = loop, collections.deque(), asyncio.Event(), asyncio.Event()
        self.room, self.waiting = threading.Semaphore(ahead), False

    def put(self, piece) -> None:  # in the worker thread
        self.made.append(piece)
        if piece is None:
            self.loop.call_soon_threadsafe(self.ended.set)
        if self.waiting:
            self.waiting = False
            self.loop.call_soon_threadsafe(self.ready.set)

    async def take(self) -> list:
        """Every piece made so far, waiting for one if there is none (None is the last)."""
        while not self.made:
            self.waiting = True
            if self.made:  # put between the check and the flag: it may not have woken us
                break
            await self.ready.wait()
            self.ready.clear()
        return [self.made.popleft() for _ in range(len(self.made))]

    def release(self, n: int) -> None:
        for _ in range(n):
            self.room.release()


def log_bug(log) -> None:
    """A bug's whole story to the server's console (the client gets one line)."""
    log(traceback.format_exc())


async def stream(
    chunks: Iterator[bytes], gone: threading.Event, kind: str, timeout: float, log, request: Request | None = None
) -> Stream:
    """A Stream of chunks whose first piece is made before the answer begins, so that a request the
    generator refuses (bad input, a busy server) is still answered with its error status. Given the
    request, `gone` is set meanwhile if its client leaves (the first piece may take a while: a
    chat template's render)."""
    try:
        async with watching(request, gone) if request is not None else contextlib.nullcontext():
            first = await run_in_threadpool(next, chunks, None)
    except BaseException:
        await run_in_threadpool(chunks.close)
        raise
    return Stream(chunks, first, gone, kind, timeout, log)
