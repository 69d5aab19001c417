"""`minitf attention`, run from a clone: the code is minitf/commands/attention.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.attention import main

if __name__ == "__main__":
    run_main(main)
