"""Both web servers (the explorer, the OpenAI-compatible server) on their HTTP stack: no request, however
malformed, stops a server for others; connections are kept alive; a chunked body is read within its
bound; the OpenAPI page is served; and SIGTERM or Ctrl-C stop a server gracefully, ending open
streams with an error event and exiting 0."""

import contextlib
import http.client
import json
import re
import signal
import socket
import subprocess
import sys

import pytest

from minitf.web.explore import Explorer, ExploreServer
from minitf.web.serve import Completions, CompletionServer
from tests.support import ROOT
from tests.support.processes import default_sigint
from tests.support.serving import running

H = b"Host: 127.0.0.1\r\n"


JSON = b"Content-Type: application/json\r\n"


def malformed(post: bytes) -> list[bytes]:
    """30 requests that no server should take, each of a different kind; post is a JSON route's path."""
    line = b"POST " + post + b" HTTP/1.1\r\n"

    def body(raw: bytes, extra: bytes = b"") -> bytes:
        return line + H + JSON + extra + b"Content-Length: %d\r\n\r\n" % len(raw) + raw

    return [
        b"hello\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"G@T / HTTP/1.1\r\n" + H + b"\r\n",
        b"GET / HTTP/1.1\r\n" + H + b"no colon here\r\n\r\n",
        b"GET /\x00 HTTP/1.1\r\n" + H + b"\r\n",
        b"GET /" + b"a" * 40_000 + b" HTTP/1.1\r\n" + H + b"\r\n",
        b"GET / HTTP/1.1\r\n" + H + b"X: " + b"b" * 40_000 + b"\r\n\r\n",
        line + H + JSON + "Content-Length: ²\r\n\r\n".encode("latin-1"),
        line + H + JSON + b"Content-Length: -1\r\n\r\n",
        line + H + JSON + b"Content-Length: 1 2\r\n\r\n",
        line + H + JSON + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        line + H + JSON + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        line + H + JSON + b"Transfer-Encoding: gzip\r\n\r\n{}",
        line + H + JSON + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        line + H + JSON + b"Content-Length: 99999999\r\n\r\n",
        line + b"Host: [::1\r\n" + JSON + b"Content-Length: 2\r\n\r\n{}",
        line + b"Host: attacker.example\r\n" + JSON + b"Content-Length: 2\r\n\r\n{}",
        line + b"Host: \xff\xfe\r\n" + JSON + b"Content-Length: 2\r\n\r\n{}",
        line + H + b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
        body(b"{not json"),
        body(b'{"a": 1e400}'),
        body(b'{"a": NaN}'),
        body(b"[" * 50_000 + b"]" * 50_000),
        body(b'{"a": "\\ud800"}'),
        body(b"[1, 2]"),
        body(b"\xff\xfe\x00"),
        body(b'{"prompt": 12, "ids": "x", "query": [], "model": null}'),
        b"DELETE " + post + b" HTTP/1.1\r\n" + H + b"\r\n",
        b"GET /%ff%fe/../../etc/passwd HTTP/1.1\r\n" + H + b"\r\n",
    ]


def answer(server, request: bytes, whole: bool = False) -> bytes:
    """The start of what the server answers to one raw request (b"" if it closes without a word);
    whole: all of it, to the end of the connection (for a request that says Connection: close)."""
    with socket.create_connection(server.server_address[:2], timeout=30) as s:
        s.sendall(request)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                got += chunk
                if not whole:
                    break
        return got


@pytest.fixture(params=["explore", "serve"])
def server(request, tiny_run):
    if request.param == "explore":
        srv = ExploreServer(Explorer(tiny_run), "127.0.0.1", 0, log=lambda msg: None)
        srv.post, srv.good = b"/api/attention", ("GET", "/api/run")
    else:
        srv = CompletionServer(Completions(tiny_run), "127.0.0.1", 0, log=lambda msg: None)
        srv.post, srv.good = b"/v1/completions", ("GET", "/v1/models")
    with running(srv):
        yield srv


def get(server, method: str, path: str, conn=None):
    conn = conn or http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request(method, path)
    r = conn.getresponse()
    return r.status, r.read()


def test_no_malformed_request_stops_the_server(server):
    requests = malformed(server.post)
    assert len(requests) == 30
    for request in requests:
        got = answer(server, request)
        status = re.match(rb"HTTP/1\.[01] (\d{3}) ", got)
        assert status and 400 <= int(status[1]) < 500, (request[:60], got[:200])
    assert get(server, *server.good)[0] == 200  # and it answers the next one


def test_connections_are_kept_alive(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    assert get(server, *server.good, conn=conn)[0] == 200
    sock = conn.sock
    assert get(server, *server.good, conn=conn)[0] == 200
    assert conn.sock is sock  # the second request went over the same connection


def test_the_openapi_page_lists_the_routes(server):
    status, page = get(server, "GET", "/docs")
    assert status == 200 and b"swagger" in page.lower()
    status, spec = get(server, "GET", "/openapi.json")
    assert status == 200 and server.post.decode() in json.loads(spec)["paths"]


def test_a_chunked_body_is_read_within_its_bound(tiny_run):
    srv = CompletionServer(Completions(tiny_run), "127.0.0.1", 0, log=lambda msg: None)
    with running(srv):
        body = json.dumps({"model": srv.api.name, "prompt": "O", "max_tokens": 2, "seed": 0}).encode()
        head = (
            b"POST /v1/completions HTTP/1.1\r\n" + H + JSON + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7))
        got = answer(srv, head + chunked + b"0\r\n\r\n", whole=True)
        assert got.startswith(b"HTTP/1.1 200 ") and b'"finish_reason"' in got
        big = b"%x\r\n%s\r\n" % (1 << 16, b" " * (1 << 16))
        got = answer(srv, head + big * 17 + b"0\r\n\r\n")  # 1 MiB + 64 KiB of spaces, no Content-Length
        assert got.startswith(b"HTTP/1.1 413 ")


def start(*args) -> tuple[subprocess.Popen, str]:
    """A server command started in its own process; (process, its URL) once it listens."""
    p = subprocess.Popen(
        [sys.executable, "-m", "minitf", *args, "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    line = p.stdout.readline()
    url = re.search(r"http://\S+", line)
    assert url, (line, p.stderr.read() if p.poll() is not None else "")
    return p, url[0].rstrip("/")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_serve_gracefully(tiny_run, sig):
    """A stream open when SIGTERM (docker stop, systemd) or Ctrl-C arrives ends with an error event
    and [DONE]; the process then exits 0 with no traceback."""
    p, url = start("serve", "--run", str(tiny_run))
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        body = {"model": tiny_run.name, "prompt": "O", "max_tokens": 1000, "stream": True, "temperature": 1}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: {")  # the stream has begun
        p.send_signal(sig)
        rest = r.read().decode()
        events = [e.strip().removeprefix("data: ") for e in rest.split("\n\n") if e.strip()]
        assert events[-1] == "[DONE]" and "shutting down" in json.loads(events[-2])["error"]["message"]
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "Traceback" not in err, err
    finally:
        p.kill()


def test_sigterm_stops_the_explorer_and_exits_0(tiny_run):
    p, url = start("explore", "--run", str(tiny_run))
    try:
        with socket.create_connection((url.split("//")[1].split(":")[0], int(url.rsplit(":", 1)[1]))):
            p.send_signal(signal.SIGTERM)  # an idle kept-alive connection does not hold the stop
            out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "Traceback" not in err, err
    finally:
        p.kill()


@pytest.mark.parametrize("command", ["serve", "explore"])
def test_ctrl_c_as_soon_as_it_listens_exits_0(tiny_run, command):
    """Ctrl-C sent the moment the address is printed (once, while a server started its threads,
    this hung the process for good) stops it gracefully."""
    p, url = start(command, "--run", str(tiny_run))
    try:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "Traceback" not in err, err
    finally:
        p.kill()
