"""`minitf export-gguf`, run from a clone: the code is minitf/cli/export_gguf.py (--help lists its options)."""

from minitf.cli.common import run_main
from minitf.cli.export_gguf import main

if __name__ == "__main__":
    run_main(main)
