"""The explorer: a local web page to type a prompt, watch tokens stream, and open any token's
attention step by step (`python scripts/explore.py`). The requests themselves are api.py's; this
file is their routes, as a FastAPI app served by uvicorn (minitf/web/stack.py: keep-alive, the
deadlines for slow clients, a graceful stop on Ctrl-C or SIGTERM).

It is a page for one person on one machine, which is why it binds 127.0.0.1 unless told otherwise
and answers only requests that name it (a guard against DNS rebinding). The model's work runs in
worker threads, so a tab streaming tokens never blocks the page's other requests or another tab.

    GET  /                  the page (and /static/app.js, /static/attention.js, /static/style.css, ...)
    GET  /api/run           the run: name, config, parameters, checkpoint and its step, limits
    GET  /api/metrics       the loss curve from metrics.jsonl
    POST /api/generate      {"prompt", "temperature", "top_k", ...} -> NDJSON, one event per line
    POST /api/<view>        the views of api.py's VIEWS: attention, distribution, lens, positions...
    GET  /docs              the endpoints, as an OpenAPI page

Errors are JSON {"error": "one line"}: 400 for bad input (JSON that is not JSON's: 1e400, NaN, a lone
surrogate, nesting too deep; a malformed Host header), 408 for a request not sent within the
timeout, 413 for a body over 256 KiB, 503 when too many tabs generate at once or the explorer is
stopping. Answers never hold NaN (a diverged run's loss is null). A tab that closes its stream stops
its generation at the next token; a stopping explorer ends each stream with an error event.
"""

from __future__ import annotations

import sys
import threading
from importlib import resources

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ...conversations.bounded import RenderCancelled
from ...errors import MinitfError
from ...export.hf import describe_weights
from ..http_io import NO_STORE, Guard, error_answer, json_answer, log_bug, read_body, stream
from ..stack import Limits, Server, is_loopback
from ..strict_json import dumps, loads
from .api import VIEWS, BadRequest, Explorer

# the only files served, by exact path: nothing in a request ever becomes a file path
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/attention.js": ("attention.js", "text/javascript; charset=utf-8"),
    "/static/views.js": ("views.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
MAX_BODY = 256 * 1024


class ExploreServer(Server):
    """The explorer over one Explorer; `url` is where it listens (port 0 picks a free port).
    serve_forever() runs it in the calling thread until close() (from another thread), Ctrl-C or SIGTERM."""

    def __init__(self, explorer: Explorer, host: str = "127.0.0.1", port: int = 8000, log=None, limits=None):
        limits = limits or Limits(max_body=MAX_BODY)
        log = log or (lambda msg: print(msg, file=sys.stderr))
        stopping = threading.Event()
        app = explorer_app(explorer, limits, stopping, log)
        app.add_middleware(Guard, limits=limits, loopback=is_loopback(host), stopping=stopping, error=explorer_answer)
        super().__init__(app, host, port, limits, log, explorer_body, stopping=stopping)
        self.explorer = explorer


def serve(run_dir, best: bool = False, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu") -> None:
    """Load the run, print the page's URL, and serve until Ctrl-C or SIGTERM (then return quietly)."""
    server = ExploreServer(Explorer(run_dir, best=best, device=device), host, port)
    if not server.loopback:
        print(
            f"warning: serving on {host}: anyone who can reach this machine on port "
            f"{server.server_address[1]} can use the page and the model",
            file=sys.stderr,
        )
    weights = describe_weights(run_dir, best, "shows")
    said = f"minitf explorer for {run_dir} ({weights}): open {server.url}  (Ctrl-C stops)"
    server.serve_forever(ready=lambda: print(said, flush=True))


def explorer_answer(error: MinitfError) -> Response:
    """{"error": "one line"} with the error's status: 503 when busy, 400 for other bad input."""
    return error_answer(error, lambda error, status: {"error": str(error)})


def explorer_body(message: str, status: int) -> bytes:
    """{"error": "one line"}, for an answer written before the app sees the request (stack.py)."""
    return dumps({"error": message})


def explorer_app(ex: Explorer, limits: Limits, stopping: threading.Event, log) -> FastAPI:
    """The page's routes over one loaded run (see the module docstring)."""
    app = FastAPI(title="minitf explorer", description=__doc__.split("\n\n")[0], redoc_url=None)

    async def body(request: Request) -> dict:
        try:
            value = loads(await read_body(request, limits))
        except ValueError as e:  # one line: not JSON, 1e400, NaN, a lone surrogate, nesting too deep
            raise BadRequest(str(e)) from None
        if not isinstance(value, dict):
            raise BadRequest("the request body must be a JSON object")
        return value

    @app.get("/api/run")
    async def run_info() -> Response:
        """The run: name, config, parameters, checkpoint and its step, limits."""
        return json_answer(200, ex.run_info())

    @app.get("/api/metrics")
    async def metrics() -> Response:
        """The loss curve from metrics.jsonl."""
        return json_answer(200, ex.loss_curve())

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        """A generation, as NDJSON events: the prompt's tokens, each sampled token, the reason it ended."""
        settings = await body(request)
        gone = threading.Event()
        return await stream(
            _ndjson(ex, settings, stopping, gone, log), gone, "application/x-ndjson", limits.timeout, log, request
        )

    for name, method in VIEWS.items():  # one route each, so /docs lists every view
        app.add_api_route(f"/api/{name}", _view(getattr(ex, method), body), methods=["POST"])
    for path in STATIC:
        app.add_api_route(path, _static(path), methods=["GET"], include_in_schema=False)
    _errors(app, log)
    return app


def _view(method, body):
    async def view(request: Request) -> Response:
        settings = await body(request)
        return json_answer(200, await run_in_threadpool(method, settings))

    view.__doc__ = method.__doc__  # the view's own description, on the /docs page
    return view


def _static(path: str):
    name, kind = STATIC[path]

    async def page() -> Response:
        return Response(resources.files(__package__).joinpath("static", name).read_bytes(), 200, NO_STORE, kind)

    return page


def _ndjson(ex: Explorer, settings: dict, stopping: threading.Event, gone: threading.Event, log):
    """The generation's events as NDJSON lines (run in a worker thread, a line at a time): bad input
    raises at the first line, before the answer begins. It stops when the page goes (gone) and
    ends with an error event when the explorer stops."""
    sent = 0
    with ex.generation(settings, lambda: stopping.is_set() or gone.is_set()) as events:
        try:
            for event in events:
                if stopping.is_set():
                    yield dumps({"error": "the explorer is stopping; generation ended"}) + b"\n"
                    return
                if gone.is_set():
                    log(f"generate: the page closed the stream after {sent} tokens; stopped")
                    return
                yield dumps(event) + b"\n"
                sent += "token" in event
        except Exception as e:  # the answer has begun: the error goes in the stream, the story to the console
            log_bug(log)
            yield dumps({"error": f"generation failed ({type(e).__name__}: {e})"}) + b"\n"


def _errors(app: FastAPI, log) -> None:
    """Every error as {"error": "one line"}: bad input 400, busy 503, no such page 404, a bug 500."""

    @app.exception_handler(MinitfError)
    async def bad_input(request: Request, error: MinitfError) -> Response:
        return explorer_answer(error)

    @app.exception_handler(RenderCancelled)
    async def cancelled(request: Request, error: RenderCancelled) -> Response:
        log(f"generate: {error}, as the page closed or the explorer is stopping")
        return json_answer(503, {"error": f"{error}: the page closed, or the explorer is stopping"})

    @app.exception_handler(HTTPException)
    async def no_page(request: Request, error: HTTPException) -> Response:
        what = "page" if request.method == "GET" else "endpoint"
        if error.status_code == 404:
            return json_answer(404, {"error": f"no {what} {request.url.path!r} here"})
        return json_answer(error.status_code, {"error": f"{request.method} is not allowed on {request.url.path}"})

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> Response:
        log_bug(log)
        return json_answer(
            500, {"error": f"internal error ({type(error).__name__}: {error}); see the server's console"}
        )
