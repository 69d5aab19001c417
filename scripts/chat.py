"""`minitf chat`, run from a clone: the code is minitf/cli/chat.py (--help lists its options)."""

from minitf.cli.chat import main
from minitf.cli.common import run_main

if __name__ == "__main__":
    run_main(main)
