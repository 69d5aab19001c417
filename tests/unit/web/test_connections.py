"""minitf.web.connections: a chunk announced over the body's bound is refused before its data. h11
says a chunk's size only in private (h11._readers.ChunkedReader._bytes_in_chunk, on uvicorn's
protocol's .conn); these tests pin what the check reads, so a release that moves it fails here by
name rather than silently dropping the check, and the module still works (later refusal) without it."""

import asyncio
import importlib.util
import json
import sys
import types

import h11
import uvicorn
from uvicorn.config import Config
from uvicorn.server import ServerState

from minitf.web import connections
from minitf.web.connections import announced_chunk, deadline_protocol
from minitf.web.stack import Limits

PINNED = (
    "minitf/web/connections.py reads h11's private chunk reader, written against h11 0.16.0 and "
    f"uvicorn 0.54.0; installed: h11 {h11.__version__}, uvicorn {uvicorn.__version__}. Find where this h11 "
    "keeps a chunk's announced size and update announced_chunk"
)
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


def reading_a_chunk(announced: bytes) -> h11.Connection:
    """A server-side h11 connection that has read a chunked request's head and one chunk's size line."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(HEAD + announced + b"\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    assert conn.next_event() is h11.NEED_DATA  # the size is read; none of its data has come
    return conn


def test_h11_private_chunk_reader_is_where_the_check_reads_it():
    private = importlib.import_module("h11._readers")
    assert getattr(private, "ChunkedReader", None) is not None, PINNED
    assert connections.ChunkedReader is private.ChunkedReader, PINNED
    conn = reading_a_chunk(b"fffffff")
    assert type(getattr(conn, "_reader", None)) is private.ChunkedReader, PINNED
    assert getattr(conn._reader, "_bytes_in_chunk", None) == 0xFFFFFFF, PINNED


def test_announced_chunk_is_the_size_line_then_what_is_left_of_it():
    conn = reading_a_chunk(b"fffffff")
    assert announced_chunk(conn) == 268435455, PINNED
    conn.receive_data(b"{}")
    assert conn.next_event().data == b"{}"
    assert announced_chunk(conn) == 268435453, PINNED
    assert announced_chunk(h11.Connection(h11.SERVER)) == 0  # no request yet: no chunk


class Transport(asyncio.Transport):
    """What a connection's protocol writes, and whether it closed."""

    def __init__(self):
        super().__init__()
        self.written, self.closed = b"", False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed


def protocol_answer(announced: bytes, max_body: int) -> tuple[bytes, bool]:
    """What the server's protocol (uvicorn's, with its hooks) writes for a chunked request's head
    and one chunk's size line, and whether it closed the connection."""

    async def app(scope, receive, send):  # never reached with a refused chunk
        pass

    async def feed():
        proto = deadline_protocol(Limits(max_body=max_body), error_body, log=str)(
            Config(app=app, log_config=None), ServerState(), {}
        )
        transport = Transport()
        proto.connection_made(transport)
        assert isinstance(proto.conn, h11.Connection), PINNED  # uvicorn's protocol keeps its h11 here
        proto.data_received(HEAD + announced + b"\r\n")
        answer = transport.written, transport.closed
        proto.connection_lost(None)
        return answer

    return asyncio.run(feed())


def error_body(message: str, status: int) -> bytes:
    return json.dumps({"error": {"message": message, "code": status}}).encode()


def test_a_chunk_over_the_bound_is_400_before_its_data():
    message = "a chunk is larger than the body's bound of 1024 bytes; send less"
    body = error_body(message, 400)
    head = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
    assert protocol_answer(b"401", max_body=1024) == (head + b"Content-Length: %d\r\n\r\n" % len(body) + body, True)
    assert protocol_answer(b"400", max_body=1024) == (b"", False)  # exactly the bound: its data may come


def test_without_h11s_private_reader_the_module_loads_and_sees_no_size(monkeypatch):
    """A release that moved the reader: the server still starts; the check sees 0, and a chunk over
    the bound is refused later, as its bytes arrive (read_body)."""
    monkeypatch.setitem(sys.modules, "h11._readers", types.ModuleType("h11._readers"))
    spec = importlib.util.spec_from_file_location("connections_on_a_newer_h11", connections.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert fresh.ChunkedReader is None
    monkeypatch.undo()
    assert fresh.announced_chunk(reading_a_chunk(b"fffffff")) == 0
    conn = reading_a_chunk(b"fffffff")
    del conn._reader._bytes_in_chunk  # the reader is there, its attribute renamed
    assert announced_chunk(conn) == 0
