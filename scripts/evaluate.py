"""`minitf evaluate`, run from a clone: the code is minitf/commands/evaluate.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.evaluate import main

if __name__ == "__main__":
    run_main(main)
