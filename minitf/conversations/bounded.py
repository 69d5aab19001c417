"""A chat template from a download renders bounded: a worker process of its own that the parent
ends past RENDER_SECONDS of work, RENDER_CHARS of text or RENDER_MEMORY of memory.

A template is a small program (sandbox.py): a downloaded one can loop without end, double a string
until memory is gone or write a hundred megabytes, and the sandbox alone does not stop any of that.
So `Worker` renders it in a process started on first use (Python and jinja2 only, ~0.1 s), kept
for the template's next renders and started again after it is ended. Each render is one JSON line
each way over pipes (never pickle); the parent waits on them in short slices, so a render can be
cancelled (a server's client that went away, a server stopping, Ctrl-C) by ending the process. A
render past a bound is one line naming the template and the bound; the parent is never blocked
longer than a bound, and its memory never holds what the template made.

minitf's own ChatML, written here and trusted, renders in this process (`InProcess`): no process
to start, no pipe to cross. chat_template.ChatTemplate picks one of the two.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref

from ..errors import MinitfError, first_line
from . import sandbox

RENDER_SECONDS = 1.0  # CPU time one render may take (a real template's render takes milliseconds)
RENDER_CHARS = 1 << 20  # characters one render may write, beyond twice the conversation's own (JSON) length
RENDER_MEMORY = 1 << 30  # bytes of address space the worker process may hold (RLIMIT_AS)
# wall-clock bounds the parent keeps itself, whatever the worker does: a render (its CPU time is
# bounded in the worker; this also covers a loaded machine and the conversation's way in and out)
# and a start (Python and jinja2 imported, the template compiled)
WAIT_SECONDS, START_SECONDS = 10 * RENDER_SECONDS, 30.0
POLL_SECONDS = 0.05  # how often a waiting render asks whether it was cancelled
# renders remembered, of small requests only: encode_conversation renders the same placeholders twice,
# and conversations of one shape (system, user, assistant) the same placeholders
MEMO, MEMO_BYTES = 16, 1 << 16


class RenderCancelled(Exception):
    """The render was cancelled (its caller's `cancelled()` became true) and its worker ended. Not a
    MinitfError, which a template's refusal is: code that tries another render on those lets this through."""


def describe(origin: str | None) -> str:
    """How an error names a template: where it came from, when known."""
    return f"the chat template from {origin}" if origin else "the chat template"


class InProcess:
    """A trusted template (minitf's ChatML), rendered in this process."""

    def __init__(self, source: str, special: dict, name: str):
        self.special, self.name = special, name
        try:
            self.program = sandbox.compile_template(source)
        except Exception as e:  # jinja2's TemplateSyntaxError, a RecursionError of a template nested too deep
            raise MinitfError(f"{name} is not valid Jinja ({first_line(e, 160)})") from None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.program.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.special)
        except Exception as e:  # a template's raise_exception, or a template error
            raise MinitfError(f"{self.name} refused the conversation ({first_line(e, 160)})") from None

    def cancelled_by(self, cancelled):
        return contextlib.nullcontext()


class Worker:
    """A template rendered in a worker process (sandbox.serve), within the bounds above. Thread-safe:
    renders from several threads take turns."""

    def __init__(self, source: str, special: dict, name: str):
        self.source, self.special, self.name = source, dict(special), name
        try:  # parsed, not compiled: a broken template is refused when it is loaded, as ChatML's would be
            sandbox.check_syntax(source)
        except Exception as e:
            raise MinitfError(f"{name} is not valid Jinja ({first_line(e, 160)})") from None
        self._lock, self._local = threading.Lock(), threading.local()
        self._proc: subprocess.Popen | None = None
        self._ender: weakref.finalize | None = None
        self._memo: dict[bytes, str] = {}

    def __reduce__(self):  # a copy (pickled with its tokenizer) starts a worker of its own
        return Worker, (self.source, self.special, self.name)

    @property
    def pid(self) -> int | None:
        """The worker process's id while it runs: None before the first render and once it is ended."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @contextlib.contextmanager
    def cancelled_by(self, cancelled):
        """A block in which this thread's renders stop as soon as cancelled() is true: the render
        under way has its worker ended, and RenderCancelled is raised."""
        before = getattr(self._local, "cancelled", None)
        self._local.cancelled = cancelled
        try:
            yield
        finally:
            self._local.cancelled = before

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        line = self._request(messages, add_generation_prompt)
        cancelled = getattr(self._local, "cancelled", None) or (lambda: False)
        while not self._lock.acquire(timeout=POLL_SECONDS):  # another thread's render, bounded too
            if cancelled():
                raise RenderCancelled(f"the render of {self.name} was cancelled")
        try:
            if line in self._memo:
                return self._memo[line]
            reply = self._exchange(line, cancelled)
            if "text" in reply:
                if len(line) <= MEMO_BYTES:
                    self._memo[line] = reply["text"]
                    while len(self._memo) > MEMO:
                        del self._memo[next(iter(self._memo))]
                return reply["text"]
            if reply["error"] == "memory":  # its heap may be left in pieces: a fresh process for the next render
                self._end()
        finally:
            self._lock.release()
        raise self._refusal(reply)

    def _request(self, messages, add_generation_prompt: bool) -> bytes:
        try:
            return json.dumps({"messages": messages, "add_generation_prompt": bool(add_generation_prompt)}).encode()
        except (TypeError, ValueError, RecursionError) as e:
            raise MinitfError(
                f"{self.name} can be given JSON values only (strings, numbers, lists, dicts): {first_line(e, 160)}; "
                f"pass the conversation as OpenAI-style messages"
            ) from None

    def _refusal(self, reply: dict) -> MinitfError:
        """One line for a render that did not end with its text."""
        bounds = {
            "time": f"ran past {RENDER_SECONDS:g} s, the bound on a render's time",
            "output": f"wrote more than {reply.get('limit', RENDER_CHARS):,} characters, the bound on a render's text",
            "memory": f"needed more than {RENDER_MEMORY >> 20:,} MiB, the bound on a render's memory",
            "size": reply.get("message"),  # a guard of sandbox.py: a power or a repetition too large
        }
        if reply["error"] == "template":
            return MinitfError(f"{self.name} refused the conversation ({_said(reply)})")
        if reply["error"] in bounds:
            why = bounds[reply["error"]]
            return MinitfError(
                f"{self.name} {why}; it is not a template a model can use: fix it, or use the model's own"
            )
        return MinitfError(
            f"the process rendering {self.name} ended unexpectedly ({reply['error']}); "
            f"if it happens again, fix the template or use the model's own"
        )

    def _exchange(self, line: bytes, cancelled) -> dict:
        """The worker's reply to one request line, or {"error": "time" | "memory" | ...} when it
        ended; the worker is ended (and started again next time) when the reply cannot be had."""
        try:
            if self._proc is not None and self._owner != os.getpid():  # a forked child: its parent's pipes
                self._proc = self._ender = None
            if self._proc is None:
                self._start(cancelled)
            return self._talk(line + b"\n", WAIT_SECONDS + len(line) / 10e6, cancelled)  # and 10 MB/s in and out
        except _Ended as ended:
            self._end()
            return {"error": ended.why}
        except BaseException:  # cancelled, Ctrl-C, a start refused: the render's state is unknown
            self._end()
            raise

    def _start(self, cancelled) -> None:
        command = [sys.executable, "-c", sandbox.BOOT, sandbox.__file__]
        try:  # a session of its own: Ctrl-C at a terminal is the parent's to handle
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise MinitfError(f"cannot start a process to render {self.name} in ({e.strerror or e})") from None
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._owner = os.getpid()
        self._ender = weakref.finalize(self, _end_process, self._proc, self._owner)
        start = {
            "source": self.source,
            "special": self.special,
            "seconds": RENDER_SECONDS,
            "chars": RENDER_CHARS,
            "memory": RENDER_MEMORY,
        }
        reply = self._talk(json.dumps(start).encode() + b"\n", START_SECONDS, cancelled)
        if "error" in reply:
            if reply["error"] == "template":
                raise MinitfError(f"{self.name} cannot be compiled ({_said(reply)})")
            raise _Ended(reply["error"])

    def _talk(self, line: bytes, seconds: float, cancelled) -> dict:
        """Write `line` to the worker and read its one-line reply, within `seconds` of wall time."""
        proc, deadline = self._proc, time.monotonic() + seconds
        into, out = proc.stdin.fileno(), proc.stdout.fileno()
        poller = select.poll()  # not select.select: a server's descriptors may be numbered past 1024
        poller.register(out, select.POLLIN)
        poller.register(into, select.POLLOUT)
        pending, got = memoryview(line), bytearray()
        while True:
            if cancelled():
                raise RenderCancelled(f"the render of {self.name} was cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Ended("time")
            for fd, _ in poller.poll(min(left, POLL_SECONDS) * 1000):
                if fd == into:
                    try:
                        pending = pending[os.write(into, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        continue
                    except OSError:  # the worker is gone: its reply (or end of file) says why
                        pending = pending[:0]
                    if not pending:
                        poller.unregister(into)
                elif fd == out:
                    chunk = os.read(out, 1 << 20)
                    if not chunk:
                        raise _Ended(_why_it_ended(proc))
                    got += chunk
                    if chunk.endswith(b"\n"):
                        try:
                            return json.loads(got)
                        except ValueError:
                            raise _Ended("its reply was not JSON") from None

    def _end(self) -> None:
        """End the worker (if any): the next render starts a fresh one."""
        if self._ender is not None:
            self._ender()
        self._proc = self._ender = None
        self._memo = {}


class _Ended(Exception):
    def __init__(self, why: str):
        self.why = why


def _why_it_ended(proc: subprocess.Popen) -> str:
    """What a worker's end of file means: "time" (its CPU timer's signal), else its exit status."""
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "its output ended while it ran on"
    if code == -signal.SIGPROF:
        return "time"
    if code < 0:
        return f"signal {-code}: past its {RENDER_MEMORY >> 20:,} MiB of memory?"
    return f"exit status {code}"


def _end_process(proc: subprocess.Popen, owner: int) -> None:
    """Kill a worker and reap it (in the process that started it only: a forked child leaves it be)."""
    if os.getpid() != owner:
        return
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            pipe.close()


def _said(reply: dict) -> str:
    """The first line of what a template's error said (sandbox.py sends it stripped, never empty)."""
    return reply["message"].splitlines()[0][:160]
