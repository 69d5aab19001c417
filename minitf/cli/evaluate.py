"""Evaluate a trained run on any text: loss, perplexity and bits per byte, with the run's own tokenizer.

    minitf evaluate --run runs/shakespeare                      # its own held-out split
    minitf evaluate --run runs/shakespeare --with-train         # and its train split (9x the time)
    minitf evaluate --run runs/shakespeare --data file:other.txt --best   # the whole of another text
    minitf evaluate --run runs/novel --data hf:/data/parquet-shards --batch-size 32

The text is tokenized once into the token cache (bounded memory, reused next time) and read back
in batches, so a corpus bigger than memory is fine. Every token is predicted once, from the
block_size tokens before it at most.
"""

import argparse
import dataclasses

from minitf.cli.common import add_device_argument, newest_run
from minitf.evaluate import check_batch_size, evaluate_text
from minitf.run_dir import load_run


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="evaluate best.safetensors (lowest val loss)")
    p.add_argument("--data", help="shakespeare, file:PATH or hf:DATASET (default: the run's own data.source)")
    p.add_argument(
        "--with-train",
        action="store_true",
        help="with the run's own data: also score its train split (most of the time: it is the bigger part)",
    )
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass (default: 8)")
    add_device_argument(p)
    args = p.parse_args(argv)
    check_batch_size(args.batch_size, "--batch-size")  # before loading anything, so the error is the only line
    run = args.run or newest_run()
    model, tok, cfg = load_run(run, best=args.best, device=args.device)
    data = dataclasses.replace(cfg.data, source=args.data or cfg.data.source)
    rows = _rows(args.data is None, args.with_train)
    result = evaluate_text(model, tok, data, batch_size=args.batch_size, splits=_splits(rows))
    print(f"{run} ({'best' if args.best else 'latest'} weights) on {data.source}:")
    for name, label in rows:
        r = result[name]
        print(
            f"  {label:15} {r['tokens']:>12,} tokens  loss {r['loss']:.4f}  perplexity {r['perplexity']:.2f}"
            f"  {r['bits_per_byte']:.3f} bits per byte"
        )


def _rows(own_data: bool, with_train: bool) -> list[tuple[str, str]]:
    """What is printed: (evaluate_text's key, its label). A text the run never saw is one number,
    all of it; the run's own text is its held-out split, and with --with-train its train split too."""
    if not own_data:
        return [("all", "the whole text")]
    if not with_train:
        return [("val", "val (held out)")]
    return [("val", "val (held out)"), ("train", "train split"), ("all", "both")]


def _splits(rows: list[tuple[str, str]]) -> tuple[str, ...]:
    """The token cache's splits the rows need: "all" reads both, "val" alone reads the held-out one."""
    names = {name for name, _ in rows}
    return ("val",) if names == {"val"} else ("train", "val")
