"""Draw train and val loss curves (and val bits per byte) from runs' metrics.jsonl, several runs on one chart.

    python scripts/plot.py                                              # the newest run under runs/
    python scripts/plot.py --run runs/shakespeare --out loss.png
    python scripts/plot.py --run runs/learned --run runs/rope --out compare.png
    python scripts/plot.py --run runs/speedrun/old-r1 --run runs/speedrun/new-r1 --x seconds   # at equal wall time

runs/learned and runs/rope come from
    python scripts/train.py run.name=learned model.positions=learned
    python scripts/train.py run.name=rope model.positions=rope
"""

import argparse

from minitf.cli import newest_run, run_main
from minitf.plotting import plot_runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", help="run directory (repeatable; default: the newest under runs/)")
    p.add_argument("--out", default="loss.png", help="PNG to write (default: loss.png)")
    p.add_argument(
        "--x",
        choices=["step", "seconds"],
        default="step",
        help="the x axis: optimizer steps, or seconds of training wall time (default: step)",
    )
    args = p.parse_args()
    print(f"wrote {plot_runs(args.run or [newest_run()], args.out, x=args.x)}")


if __name__ == "__main__":
    run_main(main)
