"""`minitf train`, run from a clone: the code is minitf/commands/train.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.train import main

if __name__ == "__main__":
    run_main(main)
