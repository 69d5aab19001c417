"""`minitf explore`, run from a clone: the code is minitf/cli/explore.py (--help lists its options)."""

from minitf.cli.common import run_main
from minitf.cli.explore import main

if __name__ == "__main__":
    run_main(main)
