"""`minitf plot`, run from a clone: the code is minitf/commands/plot.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.plot import main

if __name__ == "__main__":
    run_main(main)
