"""Serve a trained run over an OpenAI-compatible API (`minitf serve`, scripts/serve.py).

    minitf serve                                 # the newest run under runs/, on 127.0.0.1:8000
    minitf serve --run runs/shakespeare --best --port 8080
    minitf serve --port 0                        # any free port; the address is printed
    minitf serve --host 0.0.0.0                  # reachable from other machines (a warning says so)

Then, with the `openai` package (pip install -e '.[serve]'):

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    r = client.completions.create(model="shakespeare", prompt="Romeo.\\n", max_tokens=50, seed=0)
    print(r.choices[0].text)

or curl:

    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "shakespeare", "prompt": "Romeo.\\n", "max_tokens": 50, "stream": true}'
"""

from __future__ import annotations

import argparse
import os
import sys

from minitf.cli.common import add_device_argument, add_dtype_argument, newest_run
from minitf.errors import ConfigError
from minitf.export.hf import describe_weights
from minitf.web.serve.completions import MAX_TOKENS, Completions
from minitf.web.serve.server import CompletionServer, Limits

MAX_TIMEOUT = 86400.0  # a day: a client that sends nothing for longer is gone


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/); its name is the model's")
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000; 0: any free one)")
    add_device_argument(p)
    add_dtype_argument(p)
    p.add_argument(
        "--api-key",
        default=os.environ.get("MINITF_API_KEY"),
        help="answer only requests that carry this key (as OpenAI clients send theirs; default: "
        "$MINITF_API_KEY, else none). On the command line, other users of this machine can read it",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"the largest max_tokens a request may ask (default: {MAX_TOKENS})",
    )
    p.add_argument(
        "--parallel", type=int, default=4, help="completions generated at once; the others wait (default: 4)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=Limits.timeout,
        help="seconds a client has to send its whole request, and to take each piece of the answer "
        f"(default: {Limits.timeout:g})",
    )
    a = p.parse_args(argv)
    # checked before loading the run, so the error is the only line
    for name in ("max_tokens", "parallel"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if not 0 < a.timeout <= MAX_TIMEOUT:  # inf (or nan) would fail in the socket layer at the first client
        raise ConfigError(f"--timeout must be a number of seconds above 0, at most {MAX_TIMEOUT:g}, got {a.timeout}")
    if not 0 <= a.port <= 65535:
        raise ConfigError(f"--port {a.port} is out of range; use 1..65535, or 0 for any free port")
    run = a.run or newest_run()
    api = Completions(
        run, best=a.best, device=a.device, max_tokens=a.max_tokens, max_generations=a.parallel, dtype=a.dtype
    )
    limits = Limits(timeout=a.timeout)
    server = CompletionServer(api, a.host, a.port, limits, api_key=a.api_key)
    if not server.loopback and not a.api_key:
        print(
            f"warning: serving on {a.host}: anyone who can reach this machine on port "
            f"{server.server_address[1]} can use the model (--api-key asks for a key)",
            file=sys.stderr,
        )
    weights = describe_weights(run, a.best, "serves")
    said = f"minitf serving {run} ({weights}) as model {api.name!r} at {server.url}  (Ctrl-C stops)"
    # until Ctrl-C or SIGTERM: open streams end with an error event and [DONE]; the address is said once
    # the server answers, so that a signal sent as soon as it is read stops it gracefully
    server.serve_forever(ready=lambda: print(said, flush=True))
