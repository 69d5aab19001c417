"""The HTTP side of the OpenAI-compatible server: its routes, as a FastAPI app served by uvicorn
(minitf/web/stack.py: HTTP/1.1 with keep-alive, deadlines for slow clients, a graceful stop on
Ctrl-C or SIGTERM). What each route answers is completions.py's.

    GET  /v1/models                 the one model: the run's name
    GET  /v1/models/{name}          that model
    POST /v1/completions            a completion, or a stream of server-sent events ending in [DONE]
    POST /v1/chat/completions       a chat run's answer to a conversation, streamed or not (a base
                                    run: 404, "not a chat model", as OpenAI answers for such a model)
    GET  /tokenizer_info            the tokenizer, for clients that tokenize on the server
    POST /tokenize, /detokenize     text to token ids and back (lm-evaluation-harness asks for these)
    GET  /docs                      the endpoints, as an OpenAPI page

A client that closes its connection stops its completion at the next token, streamed or not, and
a chat's template render at once (it runs in a worker process: conversations/bounded.py). A server
that is stopping does the same, answers new requests 503 and ends each open stream with an error
event and [DONE]. Binds 127.0.0.1 unless told otherwise, and then answers only requests whose Host names this
machine (a guard against DNS rebinding); every POST must be JSON, which keeps a web page from posting
to the server without asking first (CORS). With an api_key, every request must carry it
(Authorization: Bearer KEY, as OpenAI clients send their key), or is answered 401.
"""

from __future__ import annotations

import sys
import threading

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ...errors import MinitfError
from ..http_io import Guard, RequestError, error_answer, json_answer, log_bug, read_body, stream, watched
from ..stack import Limits, Server, is_loopback
from ..strict_json import dumps, loads
from .completions import Completions
from .engine import Cancelled
from .request import APIError

__all__ = ["CompletionServer", "Limits"]


class CompletionServer(Server):
    """The OpenAI-compatible server over one Completions; `url` is where it listens (port 0 picks a
    free port). serve_forever() runs it in the calling thread until close() (from another thread),
    Ctrl-C or SIGTERM."""

    def __init__(
        self, api: Completions, host: str = "127.0.0.1", port: int = 8000, limits=None, log=None, api_key=None
    ):
        limits = limits or Limits()
        log = log or (lambda msg: print(msg, file=sys.stderr))
        stopping = threading.Event()
        app = completions_app(api, limits, stopping, log)
        app.add_middleware(
            Guard, limits=limits, loopback=is_loopback(host), stopping=stopping, error=openai_answer, api_key=api_key
        )
        super().__init__(app, host, port, limits, log, openai_body, "/v1", stopping)
        self.api, self.api_key = api, api_key


def openai_answer(error: MinitfError) -> Response:
    """OpenAI's error shape and status: an APIError's own, a RequestError's status, else 400."""
    return error_answer(error, openai_error)


def openai_body(message: str, status: int) -> bytes:
    """OpenAI's error shape for an answer written before the app sees the request (stack.py)."""
    return dumps(openai_error(RequestError(message, status), status))


def openai_error(error: MinitfError, status: int) -> dict:
    """{"error": {message, type, param, code}}: an APIError's own; another error's, with its status."""
    if not isinstance(error, APIError):
        kind = "server_error" if status >= 500 else "invalid_request_error"
        error = APIError(str(error), status, kind, getattr(error, "param", None), getattr(error, "code", None))
    return error.body()


def completions_app(api: Completions, limits: Limits, stopping: threading.Event, log) -> FastAPI:
    """The API's routes over one loaded run (see the module docstring)."""
    app = FastAPI(title="minitf serve", description=__doc__.split("\n\n")[0], redoc_url=None)

    async def body(request: Request) -> dict:
        return await _json_object(request, limits)

    @app.get("/v1/models")
    async def models() -> Response:
        """The one model this server has: the run's name."""
        return json_answer(200, api.models())

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> Response:
        """The model, if `name` is this server's."""
        api.check_model(name)
        return json_answer(200, api.model_card())

    async def answer(request: Request, req, complete, chunks) -> Response:
        """complete(req, cancelled)'s response, or chunks(req, cancelled)'s as server-sent events."""
        if not req.stream:
            return json_answer(200, await watched(request, lambda gone: complete(req, _cancelled(stopping, gone))))
        gone = threading.Event()
        events = _events(chunks(req, _cancelled(stopping, gone)), stopping, log)
        return await stream(events, gone, "text/event-stream; charset=utf-8", limits.timeout, log)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        """A completion, as OpenAI's API answers it; with "stream": true, server-sent events ending in [DONE]."""
        return await answer(request, await run_in_threadpool(api.parse, await body(request)), api.complete, api.stream)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        """A chat run's answer to a conversation (streamed as completions are); a base run: 404, not a chat model."""
        fields = await body(request)  # then the template renders, ended if the client leaves or the server stops
        req = await watched(request, lambda gone: api.parse_chat(fields, _cancelled(stopping, gone)))
        return await answer(request, req, api.chat, api.chat_stream)

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> Response:
        """The tokenizer: its end-of-text token and what a client needs to count tokens as the model does."""
        return json_answer(200, api.tokenizer_info())

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        """Text to the model's token ids."""
        return json_answer(200, await run_in_threadpool(api.tokenize, await body(request)))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        """Token ids to text."""
        return json_answer(200, await run_in_threadpool(api.detokenize, await body(request)))

    _errors(app, log)
    return app


async def _json_object(request: Request, limits: Limits) -> dict:
    """The request's body, a JSON object within the limits, or a 400 in OpenAI's words."""
    try:
        value = loads(await read_body(request, limits))
    except ValueError as e:  # one line: not JSON, 1e400, NaN, a lone surrogate, nesting too deep
        why = "it is not valid JSON" if str(e) == "the request body is not valid JSON" else str(e)
        raise APIError(f"We could not parse the JSON body of your request: {why}", 400) from None
    if not isinstance(value, dict):
        raise APIError("the request body must be a JSON object", 400)
    return value


def _cancelled(stopping: threading.Event, gone: threading.Event):
    return lambda: stopping.is_set() or gone.is_set()


def _events(chunks, stopping: threading.Event, log):
    """The completion's chunks as server-sent events (run in a worker thread, one at a time), then
    [DONE]. A client that went away ends it quietly; a stopping server ends it with an error event
    and [DONE], and a bug with an error event (the story in the server's console)."""
    try:
        for chunk in chunks:
            yield sse(chunk)
        yield b"data: [DONE]\n\n"
    except Cancelled as e:
        if stopping.is_set():
            error = APIError("the server is shutting down; this completion ended early", 503, "server_error")
            yield sse(error.body()) + b"data: [DONE]\n\n"
        else:
            log(f"{e}: the client went away; its completion stopped")
    except MinitfError:
        raise  # before the first chunk: answered with its status
    except Exception as e:
        log_bug(log)
        yield sse(APIError(f"generation failed ({type(e).__name__}); see the server's console", 500).body())
    finally:
        chunks.close()


def sse(payload: dict) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


def _errors(app: FastAPI, log) -> None:
    """Every error in OpenAI's shape: the API's own, 404 for an unknown URL, 405 for a wrong method, a bug 500."""

    @app.exception_handler(MinitfError)
    async def api_error(request: Request, error: MinitfError) -> Response:
        return openai_answer(error)

    @app.exception_handler(Cancelled)
    async def cancelled(request: Request, error: Cancelled) -> Response:
        log(f"{error}: the client went away, or the server is stopping; its completion stopped")
        return openai_answer(APIError("the server is shutting down; retry on another", 503, "server_error"))

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, error: HTTPException) -> Response:
        path = request.url.path.rstrip("/") or "/"
        if error.status_code == 405:
            other = "GET it" if request.method == "POST" else "POST a JSON request"
            return openai_answer(APIError(f"{request.method} is not allowed on {path}; {other}", 405))
        if error.status_code == 404:
            return openai_answer(APIError(f"Invalid URL ({request.method} {path})", 404, code="unknown_url"))
        return openai_answer(RequestError(str(error.detail), error.status_code))

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> Response:
        log_bug(log)
        return openai_answer(APIError(f"internal error ({type(error).__name__}); see the server's console", 500))
