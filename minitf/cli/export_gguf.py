"""Write a trained run as one GGUF file for llama.cpp and Ollama (needs the gguf extra: pip install -e '.[gguf]').

    minitf export-gguf --run runs/shakespeare --out shakespeare.gguf [--dtype f32|f16|q8_0] [--best]
    llama-completion -m shakespeare.gguf -no-cnv -p "Romeo." -n 200

The architecture (GPT-2, GPT-NeoX, Llama or Qwen3) follows from the run's model options; a model no
standard architecture computes is refused with every blocking setting named.
"""

import argparse
import sys

from minitf.cli.common import newest_run
from minitf.export.architecture import FORMAT_NAMES, describe_formats
from minitf.export.gguf import DTYPES, export_run
from minitf.run_dir import which_weights


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write a trained run as one GGUF file for llama.cpp and Ollama (needs: pip install -e '.[gguf]'). "
        f"Exportable option sets: {describe_formats()}.",
    )
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--dtype", choices=DTYPES, default="f32", help="weight type of the matrices (default f32)")
    p.add_argument("--best", action="store_true", help="export best.safetensors (lowest val loss)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    run = args.run or newest_run()
    out, fmt = export_run(run, args.out, args.dtype, args.best, args.force)
    print(f"[exported {run}: {which_weights(run, args.best, 'exports')}]", file=sys.stderr)
    size = out.stat().st_size / 1e6
    print(f"wrote {out} ({FORMAT_NAMES[fmt]} architecture '{fmt}', {args.dtype}, {size:.1f} MB)")
