"""Draw train and val loss curves (and val bits per byte) from runs' metrics.jsonl, several runs on one chart.

    minitf plot                                              # the newest run under runs/
    minitf plot --run runs/shakespeare --out loss.png
    minitf plot --run runs/learned --run runs/rope --out compare.png
    minitf plot --run runs/speedrun/old-r1 --run runs/speedrun/new-r1 --x seconds   # at equal wall time

An existing --out is replaced when it holds loss curves minitf plot drew, else only with --force.

runs/learned and runs/rope come from
    minitf train run.name=learned model.positions=learned
    minitf train run.name=rope model.positions=rope
"""

import argparse

from minitf.cli.common import newest_run
from minitf.plots.figures import plot_runs


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", help="run directory (repeatable; default: the newest under runs/)")
    p.add_argument("--out", default="loss.png", help="PNG to write (default: loss.png)")
    p.add_argument(
        "--x",
        choices=["step", "seconds"],
        default="step",
        help="the x axis: optimizer steps, or seconds of training wall time (default: step)",
    )
    p.add_argument("--force", action="store_true", help="replace --out even if it is not a plot minitf drew")
    args = p.parse_args(argv)
    print(f"wrote {plot_runs(args.run or [newest_run()], args.out, x=args.x, force=args.force)}")
