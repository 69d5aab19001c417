"""Write a trained run as a Hugging Face directory (needs the hf extra: pip install -e '.[hf]').

    minitf export --run runs/shakespeare --out hf/shakespeare
    python -c "from transformers import pipeline; print(pipeline('text-generation', 'hf/shakespeare')('Romeo.\\n'))"

The architecture is the standard one that computes the model exactly, and the command says which:
GPT-2 (positions=learned|sinusoidal norm=layernorm ffn=gelu gelu=tanh), Llama (positions=rope
norm=rmsnorm ffn=swiglu), Qwen3 (Llama with qk_norm=true bias=false) or GPT-NeoX (positions=rope
norm=layernorm ffn=gelu gelu=tanh). A model none of them computes is refused in one line naming
every setting that blocks it and the nearest exportable setting.
"""

import argparse
import sys

import torch

from minitf.cli.common import newest_run
from minitf.export.architecture import FORMAT_NAMES
from minitf.export.hf import HF_CLASSES, check_export_dir, to_hf
from minitf.run_dir import load_run, which_weights


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="export best.safetensors (lowest val loss)")
    p.add_argument("--out", required=True, help="directory to write (config.json, model.safetensors, tokenizer)")
    p.add_argument("--force", action="store_true", help="write into --out even if it is not empty")
    args = p.parse_args(argv)
    check_export_dir(args.out, args.force)  # before the model is loaded: a wrong --out fails fast
    run = args.run or newest_run()
    model, tok, cfg = load_run(run, best=args.best)
    print(f"[exporting {run}: {which_weights(run, args.best, 'exports')}]", file=sys.stderr)
    dtype = "float32" if cfg.run.weights_dtype == "auto" else cfg.run.weights_dtype  # auto: a run before the key
    out, fmt = to_hf(model, tok, args.out, dtype=getattr(torch, dtype))
    print(f"wrote {out} as {FORMAT_NAMES[fmt]} ({HF_CLASSES[fmt][1]}) in {dtype} (run.weights_dtype)")
