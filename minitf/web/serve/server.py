"""The HTTP side of the OpenAI-compatible server: connections, requests, routes, server-sent events.
What each route answers is completions.py's.

    GET  /v1/models                 the one model: the run's name
    GET  /v1/models/{name}          that model
    POST /v1/completions            a completion, or a stream of server-sent events ending in [DONE]
    POST /v1/chat/completions       OpenAI's answer for a completions-only model (404)
    GET  /tokenizer_info            the special tokens (vLLM's tokenizer routes, which
    POST /tokenize                  lm-evaluation-harness's local-completions uses):
    POST /detokenize                text -> token ids -> text

The connections, the deadline for a whole request and the fixed pool of threads that answer are
minitf/web/connections.py's (shared with the explorer): slow or idle clients neither hold a thread nor
delay anyone else's request.

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
import hmac
import traceback
from urllib.parse import urlsplit

from ...errors import MinitfError
from ..connections import BoundedServer, Limits, MemoryHandler, client_gone
from ..json_http import dumps, loads
from .completions import APIError, Cancelled, Completions

__all__ = ["CompletionServer", "Limits"]


class CompletionServer(BoundedServer):
    """An HTTP server over one Completions; `url` is where it listens (port 0 picks a free port).
    serve_forever() runs it in the calling thread until close() (from another thread)."""

    name = "minitf-serve"
    root = "/v1"  # an OpenAI client's base_url

    def __init__(
        self, api: Completions, host: str = "127.0.0.1", port: int = 8000, limits=None, log=None, api_key=None
    ):
        super().__init__(host, port, limits, log)
        self.api, self.api_key, self.handler = api, api_key, _Handler

    def error_body(self, error) -> dict:
        """OpenAI's error shape, for the connection layer's errors (408, 413, 503...) as for the API's."""
        if isinstance(error, APIError):
            return error.body()
        kind = "server_error" if error.status >= 500 else "invalid_request_error"
        return APIError(str(error), error.status, kind, code=error.code).body()


class _Handler(MemoryHandler):
    """One complete request to the API."""

    server: CompletionServer

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
        elif path == "/tokenizer_info":
            self._json(200, api.tokenizer_info())
        elif path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
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
        elif path in ("/tokenize", "/detokenize"):
            body = self._body()
            self._json(200, api.tokenize(body) if path == "/tokenize" else api.detokenize(body))
        elif path in ("/v1/models", "/tokenizer_info") or path.startswith("/v1/models/"):
            raise APIError(f"POST is not allowed on {path}; GET it", 405)
        else:
            raise APIError(f"Invalid URL (POST {path})", 404, code="unknown_url")

    def _answer(self, respond) -> None:
        """Run respond(): an APIError becomes its status and OpenAI's error shape, another
        MinitfError a 400, a bug a 500 (the story in the server's console); one line each."""
        if refused := self._host_refusal():
            return self._error(refused)
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
            body = loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError as e:  # one line: not JSON, 1e400, NaN, a lone surrogate, nesting too deep
            why = "it is not valid JSON" if str(e) == "the request body is not valid JSON" else str(e)
            raise APIError(f"We could not parse the JSON body of your request: {why}", 400) from None
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


def sse(payload: dict) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"
