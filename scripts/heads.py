"""`minitf heads`, run from a clone: the code is minitf/cli/heads.py (--help lists its options)."""

from minitf.cli.common import run_main
from minitf.cli.heads import main

if __name__ == "__main__":
    run_main(main)
