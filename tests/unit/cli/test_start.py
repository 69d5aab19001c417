"""minitf.cli.start: the one-line Ctrl-C handler is installed for the minitf command only (the
console script, `python -m minitf`), read from the interpreter's own arguments; every other process
that imports minitf keeps its SIGINT as it was (tests/integration/test_imports.py runs them)."""

import signal
import sys
import threading

import pytest

from minitf.cli import start

PY = "/usr/bin/python3"
SPAWNED = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"


CASES = [  # (sys.orig_argv, sys.argv while minitf imports, whether it is the command)
    ([PY, "/venv/bin/minitf", "train"], ["/venv/bin/minitf", "train"], True),
    ([PY, "-I", "/venv/bin/minitf"], ["/venv/bin/minitf"], True),  # a shebang's interpreter options
    ([PY, "-m", "minitf", "train"], ["-m", "train"], True),  # argv[0] is "-m" while minitf imports
    ([PY, "-mminitf"], ["-m"], True),
    ([PY, "-B", "-X", "dev", "-W", "ignore", "-m", "minitf"], ["-m"], True),
    ([PY, "-Xdev", "-Bm", "minitf.__main__"], ["-m"], True),
    ([PY, "prog.py"], ["prog.py"], False),  # a program that imports minitf
    ([PY, "scripts/train.py"], ["scripts/train.py"], False),
    ([PY, "-c", "import minitf"], ["-c"], False),
    ([PY, "-c", "import minitf", "-m", "minitf"], ["-c", "-m", "minitf"], False),  # -m is the code's argument
    ([PY, "-m", "pytest", "-q"], ["-m", "-q"], False),
    ([PY, "/venv/bin/pytest", "-q"], ["/venv/bin/pytest", "-q"], False),
    ([PY, "-m", "minitf.web.serve.server"], ["-m"], False),
    ([PY, "-m", "minitf.errors"], ["-m"], False),
    ([PY, "-m", "minitfx"], ["-m"], False),
    ([PY, "-W", "minitf", "prog.py"], ["prog.py"], False),  # a value of -W, not a script
    # a spawned multiprocessing child of the command: multiprocessing gives it its parent's argv
    ([PY, "-c", SPAWNED, "--multiprocessing-fork"], ["/venv/bin/minitf", "train"], False),
    ([PY], [""], False),  # the prompt
    ([PY, "-"], ["-"], False),
]


@pytest.mark.parametrize("orig_argv, argv, command", CASES, ids=[" ".join(c[0][1:])[:40] or "prompt" for c in CASES])
def test_only_the_command_is_the_command(monkeypatch, orig_argv, argv, command):
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    assert start._is_the_command() is command


@pytest.fixture
def default_sigint():
    """SIGINT at Python's default for the test (a suite started in the background may ignore it),
    and this process's own handler back afterwards."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_handler_is_installed_for_the_command_in_its_main_thread_only(monkeypatch, default_sigint):
    monkeypatch.setattr(sys, "orig_argv", [PY, "-m", "minitf", "train"])
    found = []
    worker = threading.Thread(target=lambda: (start.install_handler(), found.append(signal.getsignal(signal.SIGINT))))
    worker.start()
    worker.join()
    assert found == [signal.default_int_handler]  # signal.signal would raise there
    start.install_handler()
    assert signal.getsignal(signal.SIGINT) is start.interrupted


def test_a_handler_already_set_is_kept_even_by_the_command(monkeypatch, default_sigint):
    monkeypatch.setattr(sys, "orig_argv", [PY, "-m", "minitf", "train"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background: Ctrl-C is not for it
    start.install_handler()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_program_keeps_python_s_handler(monkeypatch, default_sigint):
    monkeypatch.setattr(sys, "orig_argv", [PY, "-m", "minitf.web.serve.server"])
    start.install_handler()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
