"""Draw (or print) a trained model's attention weights on a text: one head, or every head of a layer.

minitf attention --text "The cat sat on the mat" --out attn.png          # all heads of layer 0
minitf attention --run runs/shakespeare --text "Romeo. O" --layer -1 --head 2 --out attn.png
minitf attention --text "The cat sat on the mat" --head 0 --print         # a table, no picture

An existing --out is replaced when it holds an attention figure minitf drew, else only with --force.
"""

import argparse

from minitf.cli.common import newest_run
from minitf.inspection import format_weights, inspect
from minitf.run_dir import load_run


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--text", required=True, help="the text to run through the model (at most block_size tokens)")
    p.add_argument("--layer", type=int, default=0, help="layer to show, from 0; negative counts from the last")
    p.add_argument("--head", type=int, help="head to show (default: a grid of every head of the layer)")
    p.add_argument("--print", action="store_true", help="print the weights as a table (head 0 unless --head)")
    p.add_argument("--out", help="PNG to write (default: attention.png, or none with --print)")
    p.add_argument("--force", action="store_true", help="replace --out even if it is not an attention figure")
    args = p.parse_args(argv)
    out = args.out or (None if args.print else "attention.png")
    if out:  # before the model is loaded: a wrong --out fails fast
        from minitf.plots.figures import check_figure_out, plot_attention

        check_figure_out(out, "attention", args.force)
    model, tok, _ = load_run(args.run or newest_run(), best=args.best)
    ins = inspect(model, tok, args.text)
    if args.print:
        print(format_weights(ins, args.layer, 0 if args.head is None else args.head))
    if out:
        print(f"wrote {plot_attention(ins, out, args.layer, args.head, force=args.force)}")
