"""The explorer: a local web page to type a prompt, watch tokens stream, and open any token's
attention step by step (`python scripts/explore.py`). The requests themselves are api.py's.

Why the standard library's `http.server` handlers: the page needs a few JSON endpoints and one
streamed response, on one machine, for one person, and they add no dependency. The connections
are minitf/web/connections.py's (shared with `minitf serve`): one thread reads each request whole within
a timeout (a client that sends nothing, or its headers a byte at a time, is answered 408 and
closed), and a fixed pool of threads answers, more of them than generations may run at once, so a
tab streaming tokens never blocks the page's other requests or another tab. It is not a hardened
public server, which is why it binds 127.0.0.1 unless told otherwise, and answers only requests
that name it (a guard against DNS rebinding).

    GET  /                  the page (and /static/app.js, /static/attention.js, /static/style.css)
    GET  /api/run           the run: name, config, parameters, checkpoint and its step, limits
    GET  /api/metrics       the loss curve from metrics.jsonl
    POST /api/generate      {"prompt", "temperature", "top_k", ...} -> NDJSON, one event per line
    POST /api/<view>        the views of api.py's VIEWS: attention, distribution, lens, positions...

Errors are JSON {"error": "one line"}: 400 for bad input (JSON that is not JSON's: 1e400, NaN, a lone
surrogate, nesting too deep; a malformed Host header), 408 for a request not sent within the
timeout, 503 when too many tabs generate at once. Answers never hold NaN (a diverged run's loss is null).
A tab that closes its stream stops its generation: the next token's write fails.
"""

from __future__ import annotations

import sys
import traceback
from importlib import resources
from urllib.parse import urlsplit

from ...errors import MinitfError
from ...training.checkpoint import which_weights
from ..connections import BoundedServer, Limits, MemoryHandler
from ..json_http import dumps, loads
from .api import MAX_GENERATIONS, VIEWS, BadRequest, Busy, Explorer

# the only files served, by exact path: nothing in a request ever becomes a file path
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/attention.js": ("attention.js", "text/javascript; charset=utf-8"),
    "/static/views.js": ("views.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
MAX_BODY = 256 * 1024


class ExploreServer(BoundedServer):
    """An HTTP server over one Explorer; `url` is where it listens (port 0 picks a free port).
    serve_forever() runs it in the calling thread until close() (from another thread) or Ctrl-C."""

    name = "minitf-explore"

    def __init__(self, explorer: Explorer, host: str = "127.0.0.1", port: int = 8000, log=None, limits=None):
        # every generation holds a worker while it streams: a few more answer the page meanwhile
        limits = limits or Limits(workers=MAX_GENERATIONS + 4, max_body=MAX_BODY)
        super().__init__(host, port, limits, log)
        self.explorer, self.handler = explorer, _Handler


def serve(run_dir, best: bool = False, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu") -> None:
    """Load the run, print the page's URL, and serve until Ctrl-C (then return quietly)."""
    server = ExploreServer(Explorer(run_dir, best=best, device=device), host, port)
    if not server.loopback:
        print(
            f"warning: serving on {host}: anyone who can reach this machine on port "
            f"{server.server_address[1]} can use the page and the model",
            file=sys.stderr,
        )
    weights = which_weights(run_dir, best, "shows")
    print(f"minitf explorer for {run_dir} ({weights}): open {server.url}  (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()  # running generations end at their next token


class _Handler(MemoryHandler):
    server: ExploreServer
    disable_nagle_algorithm = True  # each token leaves as soon as it is written

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _get(self) -> None:
        path, ex = urlsplit(self.path).path, self.server.explorer
        if path in STATIC:
            self._static(path)
        elif path == "/api/run":
            self._json(200, ex.run_info())
        elif path == "/api/metrics":
            self._json(200, ex.loss_curve())
        else:
            self._json(404, {"error": f"no page {path!r} here"})

    def _post(self) -> None:
        path = urlsplit(self.path).path
        if path == "/api/generate":
            self._generate(self._body())
        elif path.startswith("/api/") and path.removeprefix("/api/") in VIEWS:
            view = getattr(self.server.explorer, VIEWS[path.removeprefix("/api/")])
            self._json(200, view(self._body()))
        else:
            self._json(404, {"error": f"no endpoint {path!r} here"})

    def _answer(self, respond) -> None:
        """Run respond(): a MinitfError becomes 400 (503 when busy), anything else 500; one line each."""
        if refused := self._host_refusal():
            return self._error(refused)
        try:
            respond()
        except Busy as e:
            self._json(503, {"error": str(e)})
        except MinitfError as e:
            self._json(400, {"error": str(e)})
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the page went away before its answer, or stopped reading it
        except Exception as e:  # a bug: the whole story in the server's console, one line to the page
            self.server.log(traceback.format_exc())
            self._json(500, {"error": f"internal error ({type(e).__name__}: {e}); see the server's console"})

    def _body(self) -> dict:
        if self.headers.get_content_type() != "application/json":  # also makes browsers ask first (CORS)
            raise BadRequest("send the request as JSON (Content-Type: application/json)")
        try:
            n = int(self.headers.get("Content-Length", 0))
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if not 0 < n <= MAX_BODY:
            raise BadRequest(f"the request body is {n} bytes; send 1 to {MAX_BODY}")
        try:
            body = loads(self.rfile.read(n))
        except ValueError as e:  # one line: not JSON, 1e400, NaN, a lone surrogate, nesting too deep
            raise BadRequest(str(e)) from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    def _generate(self, body: dict) -> None:
        sent = 0
        with self.server.explorer.generation(body) as events:  # bad input raises here, before any reply
            self._head(200, "application/x-ndjson")
            try:
                for event in events:
                    if self.server.stopping.is_set():
                        break
                    self.wfile.write(dumps(event) + b"\n")
                    sent += "token" in event
            except OSError:  # BrokenPipe, ConnectionReset, and a write timeout: the page stopped reading
                self.server.log(f"generate: the page closed the stream after {sent} tokens; stopped")
            except Exception as e:  # the reply has begun: the error goes in the stream, the story to the console
                self.server.log(traceback.format_exc())
                self.wfile.write(dumps({"error": f"generation failed ({type(e).__name__}: {e})"}) + b"\n")

    def _static(self, path: str) -> None:
        name, kind = STATIC[path]
        data = resources.files(__package__).joinpath("static", name).read_bytes()
        self._head(200, kind, len(data))
        self.wfile.write(data)
