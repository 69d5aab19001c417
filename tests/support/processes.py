"""Other processes: the scripts run as a user runs them, children a test sends signals, gloo workers
of the distributed tests, and two at a time on a 2-core machine; and a command run in this process
as its script would run it, where a process of its own would only add the seconds it takes to start."""

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from . import ROOT


def script(*args, **kw) -> subprocess.CompletedProcess:
    """python *args in the repository root, its output captured as text (five minutes at most)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


class _Terminal(io.StringIO):
    """stdout as a command sees a terminal: isatty() is True."""

    def isatty(self) -> bool:
        return True


def command(name: str, *args, cwd=ROOT, stdin: str | bytes = b"", tty: bool = False) -> subprocess.CompletedProcess:
    """`minitf name *args` run in this process as script("scripts/<name>.py", *args) runs it in its
    own (every script is run_main over the command's main, as tests/unit/test_cli.py checks): in
    cwd, stdin piped in, its stdout and stderr as text, its exit code. Starting a process costs ~2 s
    of importing torch; what needs one (a signal, a kill, a terminal, a fresh interpreter) uses script().
    An exception the command lets out fails the test here, where its process would have printed a traceback.
    minitf train's allocator setting (runtime.keep_freed_memory) is left out: it is process-wide and
    permanent, so in this process it would outlive the command (test_train.py checks it in a child).
    tty=True: stdout says it is a terminal, as it does when a user runs the command at a prompt."""
    from unittest import mock

    from minitf.cli import main
    from minitf.system import runtime

    out, err = _Terminal() if tty else io.StringIO(), io.StringIO()
    piped = io.TextIOWrapper(io.BytesIO(stdin.encode() if isinstance(stdin, str) else stdin), encoding="utf-8")
    here, handler, real_stdin = os.getcwd(), signal.getsignal(signal.SIGINT), sys.stdin
    code = 0
    try:
        os.chdir(cwd)
        sys.stdin = piped
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            mock.patch.object(runtime, "keep_freed_memory", lambda: None),
        ):
            main([name, *map(str, args)])
    except SystemExit as e:
        code = e.code
    finally:
        sys.stdin = real_stdin
        os.chdir(here)
        signal.signal(signal.SIGINT, handler)  # run_main's for a Ctrl-C after a command ends: not this process's
    if isinstance(code, str):  # sys.exit("message"), as the interpreter ends it
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(["minitf", name, *map(str, args)], code or 0, out.getvalue(), err.getvalue())


def spawned(*args: str) -> subprocess.Popen:
    """python *args started in the repository root, its output piped as text, and Ctrl-C's
    SIGINT handled as a terminal's process would (default_sigint): for a test that signals it."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def one_line(r: subprocess.CompletedProcess) -> str:
    """A script's whole stderr, which must be one 'error: ...' line and exit code 2."""
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr[-2000:]
    return r.stderr.strip()


def default_sigint() -> None:
    """preexec_fn for a child that a test sends Ctrl-C: a process started in the background (as a
    CI runner may start this suite) inherits SIGINT ignored, and Python then keeps it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def two_at_a_time(fn, items) -> list:
    """fn over items in two threads, results in order: for tests that start several processes that
    mostly import torch on one core each, so a 2-core machine runs two at once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, items))


def join_gloo(rank: int, world: int, init_file: str) -> None:
    """A spawned test worker joins its gloo process group. A peer that never arrives fails the test
    within two minutes instead of gloo's default half hour."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )


def leave_gloo() -> NoReturn:
    """The last call of a spawned test worker. Every rank waits for the others before the group is
    destroyed (a rank that destroyed it while its peer was still working, rank 0 saving the results,
    left that peer hanging on a loaded machine); then the worker ends without interpreter
    finalization: FSDP's sharded parameters sit in reference cycles that keep the gloo group alive
    until finalization, and tearing gloo's threads down there aborted a rank in one suite run
    ('terminate called without an active exception', SIGABRT) after all its work was written."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pid_exists(pid: int) -> bool:
    """Whether a process of this id exists (a zombie not yet reaped too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: it exists
        return True
    return True


def child_pids(pid: int) -> list[int]:
    """The ids of pid's child processes, read from /proc (Linux): no extra package for it."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state_and_ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]  # after "(name)": state, ppid
        except (OSError, IndexError):  # ended while it was read
            continue
        if int(state_and_ppid[1]) == pid:
            children.append(int(stat.parent.name))
    return children
