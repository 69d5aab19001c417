"""`minitf generate`, run from a clone: the code is minitf/commands/generate.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.generate import main

if __name__ == "__main__":
    run_main(main)
