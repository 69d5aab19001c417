"""A local web page to explore a trained run: type a prompt, watch the tokens stream (shaded by
their probability, top-5 on hover), click any token to open its attention in every layer and head,
and one head's steps from q·k to the weighted sum. Serves until Ctrl-C or SIGTERM, then exits 0.

    minitf explore                               # the newest run under runs/, http://127.0.0.1:8000/
    minitf explore --run runs/shakespeare --best --port 8080
    minitf explore --host 0.0.0.0                # reachable from other machines (a warning says so)
    minitf explore --run Qwen/Qwen3-0.6B         # a downloaded model (a hub id or its directory), as it is
"""

import argparse

from minitf.cli.common import add_device_argument, newest_run
from minitf.errors import ConfigError
from minitf.web.explore import serve


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run", help="run directory, or a Hugging Face model's directory or hub id (default: the newest under runs/)"
    )
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    add_device_argument(p)
    a = p.parse_args(argv)
    if not 0 <= a.port <= 65535:  # checked before loading the run, so the error is the only line
        raise ConfigError(f"--port {a.port} is out of range; use 1..65535, or 0 for any free port")
    serve(a.run or newest_run(), best=a.best, host=a.host, port=a.port, device=a.device)
