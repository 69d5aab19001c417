"""Serve a trained run over an OpenAI-compatible API (see minitf/serve/command.py, or --help).

python scripts/serve.py --run runs/shakespeare --port 8000
"""

from minitf.cli import run_main
from minitf.serve import main

if __name__ == "__main__":
    run_main(main)
