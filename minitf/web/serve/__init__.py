"""An OpenAI-compatible server for a trained run: `minitf serve`, then any OpenAI client.

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="shakespeare", prompt="Romeo.\\n", max_tokens=50, seed=0)

A chat run (fine-tuned with `minitf train --config chat`, its template beside its weights) also
answers /v1/chat/completions, for a seed with exactly minitf.chat's text:

    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "What is 2 plus 3?"}], seed=0)

A base run answers it as OpenAI's API answers for a completions-only model (404, "not a chat model").

completions.py answers each route over the loaded run: request.py checks a request's fields,
engine.py samples with minitf's own sampler and scores prompts, shaping OpenAI's responses;
server.py carries it over HTTP (a FastAPI app on uvicorn, minitf/web/stack.py); the command line
is minitf/cli/serve.py.
"""

from .completions import Completions
from .request import APIError
from .server import CompletionServer, Limits

__all__ = ["APIError", "CompletionServer", "Completions", "Limits"]
