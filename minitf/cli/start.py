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


COMMAND_MODULES = {"minitf", "minitf.__main__", "minitf.cli"}  # what `python -m` runs as the command
VALUED = {"-W", "-X", "--check-hash-based-pycs"}  # the interpreter's options that take a value


def _what_runs(given: list[str]) -> tuple[str, str]:
    """What the interpreter was told to run, from its own arguments (sys.orig_argv, which
    multiprocessing does not rewrite as it does sys.argv): ("module", name), ("code", ""),
    ("script", path) or ("prompt", "")."""
    i = 1
    while i < len(given):
        arg = given[i]
        if arg == "-" or not arg.startswith("-"):
            return ("prompt", "") if arg == "-" else ("script", arg)
        if arg == "--":  # the options end: a script follows, or nothing
            return ("script", given[i + 1]) if i + 1 < len(given) else ("prompt", "")
        if arg.startswith("--"):
            i += 2 if arg in VALUED else 1
            continue
        for j, flag in enumerate(arg[1:], start=2):  # short flags combine: -Bm minitf, -mminitf
            value = arg[j:] or (given[i + 1] if i + 1 < len(given) else "")
            if flag in "mc":
                return ("module", value) if flag == "m" else ("code", "")
            if flag in "WX":  # the rest of this argument is its value, or else the next argument
                i += 0 if arg[j:] else 1
                break
        i += 1
    return ("prompt", "")


def _is_the_command() -> bool:
    """`minitf ...` (the console script), or `python -m minitf ...`: not a program that imports
    minitf, not `python -m minitf.web...` or any other module, not -c code (which a spawned
    multiprocessing child is, even when sys.argv says its parent's command)."""
    kind, name = _what_runs(getattr(sys, "orig_argv", []))
    if kind == "module":
        return name in COMMAND_MODULES
    return kind == "script" and Path(name).name in ("minitf", "minitf.exe")


def install_handler() -> None:
    """The one-line Ctrl-C for the command's imports; any other process's SIGINT is left as it is."""
    if (
        _is_the_command()
        and threading.current_thread() is threading.main_thread()  # signal.signal works there only
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a handler set, or SIGINT ignored: kept
    ):
        signal.signal(signal.SIGINT, interrupted)


install_handler()
