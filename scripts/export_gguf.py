"""Write a trained run as one GGUF file for llama.cpp and Ollama (needs the gguf extra: pip install -e '.[gguf]').

    python scripts/export_gguf.py --run runs/shakespeare --out shakespeare.gguf [--dtype f32|f16|q8_0] [--best]
    llama-cli -m shakespeare.gguf -p "Romeo." -n 200

The architecture (GPT-2, Llama or Qwen3) follows from the run's model options; a model no
standard architecture computes is refused with every blocking setting named.
"""

from minitf.cli import run_main
from minitf.gguf_export import main

if __name__ == "__main__":
    run_main(main)
