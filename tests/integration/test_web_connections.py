"""Both web servers' connections, on raw sockets: one client holding sockets open cannot refuse
another (per-client cap, the oldest idle connection closed first, a short deadline for a silent
one); a request with both Content-Length and Transfer-Encoding is a 400 that closes its connection;
and every error written before the app (h11's rejections, an absolute-form target, a chunk over
the body bound) is JSON in the server's own error shape, with its status, at once."""

import contextlib
import json
import socket
import time

import pytest

from minitf.web.explore import Explorer, ExploreServer
from minitf.web.serve import Completions, CompletionServer
from minitf.web.stack import Limits
from tests.integration.test_web_stack import running

H = b"Host: 127.0.0.1\r\n"
JSON = b"Content-Type: application/json\r\n"


def make(kind: str, run, limits: Limits, host: str = "127.0.0.1"):
    if kind == "explore":
        srv = ExploreServer(Explorer(run), host, 0, log=lambda msg: None, limits=limits)
        srv.post, srv.good = b"/api/attention", b"/api/run"
    else:
        srv = CompletionServer(Completions(run), host, 0, limits, log=lambda msg: None)
        srv.post, srv.good = b"/v1/completions", b"/v1/models"
    return srv


@pytest.fixture(params=["explore", "serve"])
def server(request, tiny_run):
    with running(make(request.param, tiny_run, Limits(max_body=256 * 1024))) as srv:
        srv.kind = request.param
        yield srv


def connect(server, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=30, source_address=(source, 0))


def exchange(server, request: bytes, source: str = "127.0.0.1") -> bytes:
    """Everything the server sends for request until it closes the connection."""
    with connect(server, source) as s:
        s.sendall(request)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                got += chunk
        return got


def json_error(server, got: bytes, *statuses: int) -> str:
    """The message of an answer that must be one of `statuses` in the server's JSON error shape."""
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head[9:12])
    assert head.startswith(b"HTTP/1.1 ") and status in statuses, got[:300]
    assert b"content-type: application/json" in head.lower(), head
    error = json.loads(body)["error"]
    if server.kind == "serve":  # OpenAI's shape
        kind = "server_error" if status >= 500 else "invalid_request_error"
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == kind
        return error["message"]
    assert isinstance(error, str)
    return error


def get(server, source: str) -> tuple[int, float]:
    """(status, seconds) of GET on the server's good route from a source address."""
    start = time.perf_counter()
    got = exchange(server, b"GET " + server.good + b" HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n", source)
    return int(got[9:12]), time.perf_counter() - start


@pytest.mark.parametrize("kind", ["explore", "serve"])
def test_a_client_holding_sockets_does_not_refuse_others(tiny_run, kind):
    """Limits of 4 connections a client and 12 in all: one client opening 40 silent sockets loses
    its own oldest, another client (127.0.0.2) and the same one are answered at once, and the
    server never holds more than its bound. A client whose every connection is mid-request is
    refused its next one, 503 in the server's shape."""
    limits = Limits(connections=12, per_client=4, timeout=5.0, silent=5.0, max_body=256 * 1024)
    with running(make(kind, tiny_run, limits)) as srv:
        srv.kind = kind
        open_now = srv._uvicorn.server_state.connections
        hostile = [connect(srv) for _ in range(40)]
        for source in ("127.0.0.3", "127.0.0.4", "127.0.0.5"):  # 12 more: the server at its bound
            hostile += [connect(srv, source) for _ in range(4)]
        time.sleep(0.3)
        assert len(open_now) <= 12
        for source in ("127.0.0.2", "127.0.0.1"):
            status, seconds = get(srv, source)
            assert status == 200 and seconds < limits.timeout, (source, status, seconds)
        busy = [connect(srv, "127.0.0.6") for _ in range(4)]
        for s in busy:
            s.sendall(b"GET / HTTP/1.1\r\n")  # a request begun: not idle
        time.sleep(0.3)
        message = json_error(srv, exchange(srv, b"GET / HTTP/1.1\r\n\r\n", "127.0.0.6"), 503)
        assert "too many open connections from your address (at most 4)" in message
        for s in hostile + busy:
            s.close()


def test_a_silent_connection_is_closed_at_its_short_deadline(tiny_run):
    limits = Limits(silent=0.5, timeout=10.0)
    with running(make("serve", tiny_run, limits)) as srv, connect(srv) as s:
        start = time.perf_counter()
        assert s.recv(100) == b""  # closed without a word: it asked nothing
        assert time.perf_counter() - start < 3


def test_content_length_with_transfer_encoding_is_a_400_that_closes(server):
    """RFC 9112 section 6.1: the second request in the same bytes is never answered."""
    smuggled = b"GET " + server.good + b" HTTP/1.1\r\n" + H + b"\r\n"
    request = b"POST " + server.post + b" HTTP/1.1\r\n" + H + JSON + b"Content-Length: %d\r\n" % len(smuggled)
    got = exchange(server, request + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled)
    assert "Content-Length and Transfer-Encoding" in json_error(server, got, 400)
    assert got.count(b"HTTP/1.1 ") == 1 and b"connection: close" in got.lower()


@pytest.mark.parametrize(
    "request_bytes, status, says",
    [
        (b"G@T / HTTP/1.1\r\n" + H + b"\r\n", 400, "malformed HTTP request"),
        (b"GET / HTTP/1.1\r\n" + H + b"no colon here\r\n\r\n", 400, "malformed HTTP request"),
        (b"GET / HTTP/1.1\r\n" + H + b"Connection: close\r\nX: " + b"b" * 40_000 + b"\r\n\r\n", (400, 431), ""),
        (b"GET http://evil.example/v1/models HTTP/1.1\r\n" + H + b"\r\n", 400, "is not a path"),
        (b"POST {post} HTTP/1.1\r\n" + H + JSON + b"Transfer-Encoding: gzip\r\n\r\n{}", 400, "malformed"),
        (b"POST {post} HTTP/1.1\r\n" + H + JSON + b"Transfer-Encoding: chunked\r\n\r\nfffffff\r\n{}", 400, "chunk"),
    ],
    ids=["bad-method", "bad-header", "head-too-long", "absolute-form", "gzip", "huge-chunk"],
)
def test_errors_before_the_app_are_json_in_the_servers_shape(server, request_bytes, status, says):
    """At once (not at a deadline), with the status, then closed."""
    start = time.perf_counter()
    got = exchange(server, request_bytes.replace(b"{post}", server.post))
    assert says in json_error(server, got, *(status if isinstance(status, tuple) else (status,)))
    assert time.perf_counter() - start < 2
