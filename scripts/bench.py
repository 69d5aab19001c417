"""`minitf bench`, run from a clone: the code is minitf/commands/bench.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.bench import main

if __name__ == "__main__":
    run_main(main)
