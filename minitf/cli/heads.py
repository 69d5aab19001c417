"""Watch a run's heads form over its training: each head's previous-token and induction scores, the
in-context-learning score and the loss, on one figure whose x axis is the step, read from the
run's snapshots (each checked against its metadata and the run's config first).

    minitf train --config induction                  # keeps its weights every 50 steps (train.snapshot_every)
    minitf heads --run runs/induction                # runs/induction/heads.png, and a table
    minitf heads --run runs/induction --out heads.png --length 32

A run needs snapshots: train it with train.snapshot_every=N. Scores are measured on random tokens
repeated (a sequence, then the same again), where a previous-token head looks at the token just
before (a perfect one scores about 1) and an induction head at the token after the earlier copy of
the current one (a perfect one scores 0.5). The table gives the 4 best induction heads and the 2
best previous-token heads.
"""

import argparse

from minitf.plots.training_figures import format_heads_table, watch_heads


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory trained with train.snapshot_every")
    p.add_argument("--out", help="PNG to write (default: heads.png in the run directory)")
    p.add_argument("--length", type=int, help="the repeated length: 6 to half the block (default: 24 or less)")
    p.add_argument("--force", action="store_true", help="replace --out even if it is not a figure minitf heads drew")
    args = p.parse_args(argv)
    history, path = watch_heads(args.run, args.out, length=args.length, force=args.force)
    print(format_heads_table(history))
    print(f"wrote {path}")
