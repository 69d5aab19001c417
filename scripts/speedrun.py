"""`minitf speedrun`, run from a clone: the code is minitf/commands/speedrun.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.speedrun import main

if __name__ == "__main__":
    run_main(main)
