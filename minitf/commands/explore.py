"""A local web page to explore a trained run: type a prompt, watch the tokens stream (shaded by
their probability, top-5 on hover), click any token to open its attention in every layer and head,
and one head's steps from q·k to the weighted sum. Serves until Ctrl-C.

    python scripts/explore.py                               # the newest run under runs/, http://127.0.0.1:8000/
    python scripts/explore.py --run runs/shakespeare --best --port 8080
    python scripts/explore.py --host 0.0.0.0                # reachable from other machines (a warning says so)
"""

import argparse

from minitf.cli import newest_run, run_main
from minitf.explore import serve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    a = p.parse_args()
    serve(a.run or newest_run(), best=a.best, host=a.host, port=a.port, device=a.device)


if __name__ == "__main__":
    run_main(main)
