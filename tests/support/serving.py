"""A completions server over a run, in a thread of the test's own process, and one plain request to it."""

import contextlib
import http.client
import json
import threading

from minitf.web.serve import Completions, CompletionServer


@contextlib.contextmanager
def serving(run, limits=None, api_key=None, **kw):
    """A server over run on a free port of 127.0.0.1, in a thread; its log lines in .logs."""
    logs = []
    server = CompletionServer(Completions(run, **kw), "127.0.0.1", 0, limits, log=logs.append, api_key=api_key)
    server.logs = logs
    with running(server):
        yield server


@contextlib.contextmanager
def running(server):
    """server serving in a thread until the block ends, then closed."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.close()
        thread.join(30)


def raw(server, method, path, body=b"", headers=None):
    """(status, JSON body) of one plain HTTP request."""
    conn = http.client.HTTPConnection(*server.server_address, timeout=30)
    conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out
