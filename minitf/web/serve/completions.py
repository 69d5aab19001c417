"""The OpenAI completions protocol over one loaded run: what each of the server's routes answers,
as plain calls (a request body, a dict, in; a response or a stream of chunks, dicts, out).
server.py carries them over HTTP.

    /v1/models             the one model, named after the run's directory
    /v1/completions        parse (request.py: every field checked), then complete or stream
                           (engine.py: sampled with minitf's own sampler, the prompt scored)
    /v1/chat/completions   for a chat run (one with a template): the conversation templated
                           (chat_request.py), sampled as a completion until the end of the turn,
                           answered in chat's shapes (chat_shape.py); for a base run, OpenAI's
                           answer for a completions-only model (404, "not a chat model")
    /tokenizer_info, /tokenize, /detokenize
                           vLLM's tokenizer routes, which lm-evaluation-harness's local-completions
                           finds at the server's root: the special tokens, text to ids (no special
                           tokens are added; "<|endoftext|>" in the text is that token) and back
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ...export.hf import is_hf_model, load_model
from ...run_dir import BEST, WEIGHTS
from ..fields import flag
from .chat_request import parse_chat
from .chat_shape import chat_chunks, chat_complete
from .engine import Engine
from .request import MAX_TOKENS, Request, Requests, api_errors, bad, check_fields, check_model, check_utf8


class Completions:
    """One loaded run and the completions asked of it: the model is only read, so several requests
    may be answered at once in different threads (engine.py bounds how many generate)."""

    def __init__(
        self,
        run_dir: str | Path,
        best: bool = False,
        device: str = "cpu",
        max_tokens: int = MAX_TOKENS,
        max_generations: int = 4,
        wait: float = 60.0,
        on_token: Callable[[str, int], None] | None = None,
        on_finish: Callable[[dict], None] | None = None,
        dtype: str = "float32",
    ):
        self.run_dir = Path(run_dir)
        # a run, or a downloaded model; dtype: the weights' while decoding (--dtype)
        self.model, self.tok, self.cfg = load_model(run_dir, best=best, device=device, dtype=dtype)
        downloaded = is_hf_model(run_dir)
        self.name = str(run_dir) if downloaded else self.run_dir.resolve().name  # a hub id names itself
        self.created = int(time.time() if downloaded else (self.run_dir / (BEST if best else WEIGHTS)).stat().st_mtime)
        self.block = self.cfg.model.block_size
        self.requests = Requests(self, max_tokens)
        self.engine = Engine(self.model, self.tok, self.name, max_generations, wait, on_token, on_finish)

    # ---- /v1/models

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "minitf"}

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def check_model(self, name) -> None:
        check_model(name, self.name)

    # ---- /v1/completions

    def parse(self, body: dict) -> Request:
        """The request, checked (request.py); APIError naming the field that cannot be used. Its
        text is tokenized in a slot (engine.slot), as generation runs: a 1 MiB prompt is work too."""
        with self.engine.slot():
            return self.requests.parse(body)

    def complete(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """The whole response; cancelled() is asked after every token (a client that went away)."""
        return self.engine.complete(req, cancelled)

    def stream(self, req: Request, cancelled: Callable[[], bool] = lambda: False):
        """The chunks of a streamed response (dicts), one per piece of text of one choice; the
        last of each choice carries its finish_reason. The caller writes each as a server-sent
        event and ends with [DONE]; closing this generator stops the generation."""
        return self.engine.stream(req, cancelled)

    # ---- /v1/chat/completions

    def parse_chat(self, body: dict, cancelled: Callable[[], bool] = lambda: False) -> Request:
        """The chat request, checked (chat_request.py); a run with no chat template answers 404
        "not a chat model", as OpenAI's API answers for a completions-only model. In a slot, as parse;
        cancelled() is asked while the template renders (Cancelled)."""
        with self.engine.slot():
            return parse_chat(self.requests, body, cancelled)

    def chat(self, req: Request, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """The whole chat.completion."""
        return chat_complete(self.engine, req, cancelled)

    def chat_stream(self, req: Request, cancelled: Callable[[], bool] = lambda: False):
        """The chat.completion.chunk dicts of a streamed answer (as stream's, written as events)."""
        return chat_chunks(self.engine, req, cancelled)

    # ---- /tokenizer_info, /tokenize, /detokenize (vLLM's, at the server's root)

    def tokenizer_info(self) -> dict:
        """What a client that tokenizes for this server needs (lm-evaluation-harness's remote
        tokenizer reads eos_token, bos_token and pad_token): <|endoftext|> ends, begins and pads."""
        eot = self.tok.decode([self.tok.eot_id])
        return {
            "eos_token": eot, "bos_token": eot, "pad_token": eot, "model_max_length": self.block,
            "vocab_size": self.tok.vocab_size, "tokenizer_class": "minitf",
        }  # fmt: skip

    def tokenize(self, body: dict) -> dict:
        """{"prompt": text} -> {"tokens": ids, "count", "max_model_len"}; no special tokens are ever
        added, so add_special_tokens either way gives the same ids ("<|endoftext|>" in the text is
        the token)."""
        check_fields(body, {"prompt", "model", "add_special_tokens"}, self.name, required={"prompt"})
        with api_errors():
            flag(body.get("add_special_tokens"), "add_special_tokens")
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad("prompt", f"prompt must be a string, got {type(prompt).__name__}")
        check_utf8(prompt)
        with self.engine.slot():  # tokenizing is work, admitted as generation is
            ids = self.tok.encode(prompt)
        return {"tokens": ids, "count": len(ids), "max_model_len": self.block}

    def detokenize(self, body: dict) -> dict:
        """{"tokens": ids} -> {"prompt": their text}."""
        check_fields(body, {"tokens", "model"}, self.name, required={"tokens"})
        ids = self.requests.ids(body["tokens"], "tokens")
        with self.engine.slot():
            return {"prompt": self.tok.decode(ids)}
