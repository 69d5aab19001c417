"""Imported first of all by minitf/__init__.py, before torch and the rest load (seconds): when this
process is the minitf command (`minitf ...` or `python -m minitf ...`), a Ctrl-C during those
imports ends it as a Ctrl-C ends any command, with one line and exit code 130, not a
KeyboardInterrupt traceback from inside torch. common.run_main puts Python's own handler back once
it runs, and from then on catches Ctrl-C itself. A program that imports minitf is left alone."""

import os
import signal
import sys
import threading
from pathlib import Path


def interrupted(signum, frame) -> None:
    print("interrupted", file=sys.stderr)
    os._exit(130)  # nothing to clean up yet: the command has not begun


def _is_the_command() -> bool:
    """`minitf ...`, or `python -m minitf ...` (sys.orig_argv: what the interpreter was given)."""
    given = getattr(sys, "orig_argv", [])
    module = given[given.index("-m") + 1] if "-m" in given[:-1] else ""
    return module.split(".")[0] == "minitf" or (bool(sys.argv) and Path(sys.argv[0]).name == "minitf")


if (
    _is_the_command()
    and threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
):
    signal.signal(signal.SIGINT, interrupted)
