"""`minitf export-gguf`, run from a clone: the code is minitf/commands/export_gguf.py (--help lists its options)."""

from minitf.cli import run_main
from minitf.commands.export_gguf import main

if __name__ == "__main__":
    run_main(main)
