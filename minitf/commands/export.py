"""Write a trained run as a Hugging Face GPT-2 directory (needs the hf extra: pip install -e '.[hf]').

    minitf export --run runs/shakespeare --out hf/shakespeare
    python -c "from transformers import pipeline; print(pipeline('text-generation', 'hf/shakespeare')('Romeo.\\n'))"

Only models GPT-2 can express export: positions=learned, norm=layernorm, ffn=gelu, gelu=tanh,
bias=true, tie_embeddings=true, qk_norm=false, no logit_softcap. Anything else is refused with the
setting named.
"""

import argparse

from minitf.checkpoint import load_run
from minitf.cli import newest_run
from minitf.hf import to_hf_gpt2


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="export best.safetensors (lowest val loss)")
    p.add_argument("--out", required=True, help="directory to write (config.json, model.safetensors, tokenizer)")
    args = p.parse_args(argv)
    model, tok, _ = load_run(args.run or newest_run(), best=args.best)
    print(f"wrote {to_hf_gpt2(model, tok, args.out)}")
