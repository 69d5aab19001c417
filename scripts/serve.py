"""`minitf serve`, run from a clone: the code is minitf/commands/serve.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.serve import main

if __name__ == "__main__":
    run_main(main)
