"""The Jinja sandbox a chat template runs in, and the worker process that runs a downloaded one.

A template is compiled as transformers compiles it (`compile_template`): jinja2's immutable sandbox,
which cannot reach Python's internals, trim_blocks and lstrip_blocks, loop controls, and the
helpers templates call (raise_exception, strftime_now, tojson). Two cheap guards come on top: no
`lipsum` (a thousand paragraphs of lorem ipsum per call), and `**` or `*` whose result would be
huge (`9 ** (9 ** 9)`, `'x' * 10 ** 9`) refused before it is computed. The sandbox's `range`
already stops at 100,000 items.

The guards cannot stop a loop that simply runs on, or a string doubled until memory is gone: a
downloaded template is rendered in a process of its own (`serve`, run by bounded.py), which puts a
bound on its own memory (RLIMIT_AS) and on each render's CPU time (a timer whose signal ends the
process: nothing the template computes can hold it off), and stops a render whose text passes its
bound. It speaks JSON lines on stdin and stdout, never pickle. This file imports nothing of minitf,
so that process starts with Python and jinja2 alone (run by path: `python -c BOOT sandbox.py`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import sys
from datetime import datetime

MAX_POWER_BITS = 1 << 16  # the largest integer a template's ** may make (~20,000 digits)
MAX_REPEAT = 1 << 20  # the most characters (or items) a template's `*` may repeat a string (or list) to
# how bounded.py starts this file as a process: the script's own folder is kept off sys.path, so
# minitf/conversations/*.py cannot stand in for a module of the standard library
BOOT = "import sys, runpy; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"


class TooLarge(Exception):
    """A `**` or `*` whose result would be too large for a chat template (MAX_POWER_BITS, MAX_REPEAT)."""


@functools.lru_cache(maxsize=8)
def compile_template(source: str):
    """The template compiled as transformers compiles it (see the module docstring); jinja2's
    TemplateError for one that is not valid Jinja."""
    return environment().from_string(source)


def check_syntax(source: str) -> None:
    """Parse the template without compiling it (compiling folds its constants: `9 ** (9 ** 9)`
    would be computed there); jinja2's TemplateError for one that is not valid Jinja."""
    environment().parse(source)


@functools.lru_cache(maxsize=1)
def environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # {% generation %}...{% endgeneration %}: its body, as it is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})  # also keeps them from being folded while compiling

        def call_binop(self, context, operator, left, right):
            too_large = _too_large(operator, left, right)
            if too_large:
                raise TooLarge(too_large)
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.pop("lipsum", None)
    env.globals.update(
        raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt), dict=dict
    )
    return env


def _too_large(operator: str, left, right) -> str | None:
    """Why `left operator right` is refused, or None: a power of more than MAX_POWER_BITS bits, or a
    string or list repeated past MAX_REPEAT."""
    if operator == "**" and type(left) is int and type(right) is int and right > 0 and abs(left) > 1:
        if (abs(left).bit_length() - 1) * right > MAX_POWER_BITS:
            return f"computes a power of more than {MAX_POWER_BITS:,} bits (an integer ** {right:,})"
    if operator == "*":
        seq, n = (left, right) if type(right) is int else (right, left)
        if isinstance(seq, (str, list, tuple)) and type(n) is int and len(seq) * n > MAX_REPEAT:
            return f"repeats a {type(seq).__name__} to {len(seq) * n:,} items, more than {MAX_REPEAT:,}"
    return None


def serve(stdin=None, stdout=None) -> None:
    """The worker: one JSON line from its parent to start, {source, special, seconds, chars, memory};
    then a line per render, {messages, add_generation_prompt}, each answered with one line:
    {"text"} or {"error": "template" | "output" | "memory" | "size", ...}. A render past `seconds` of CPU time
    ends the process (SIGPROF), which the parent reads as the time bound. Returns at end of input."""
    import resource

    stdin, stdout = stdin or sys.stdin.buffer, stdout or sys.stdout.buffer
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's, which ends this process itself
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the time bound: the timer's signal ends the process
    start = json.loads(stdin.readline() or "null")
    if start is None:
        return
    memory = start["memory"]
    try:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        memory = memory if hard == resource.RLIM_INFINITY else min(memory, hard)
        resource.setrlimit(resource.RLIMIT_AS, (memory, hard))
    except (ValueError, OSError):  # a system that does not bound address space: the time bound remains
        pass

    def answer(reply: dict) -> None:
        stdout.write(json.dumps(reply).encode() + b"\n")
        stdout.flush()

    try:
        with _cpu_time(start["seconds"]):
            template = compile_template(start["source"])
    except MemoryError:
        return answer({"error": "memory"})
    except Exception as e:
        return answer({"error": "template", "message": _said(e)})
    answer({"ok": True})
    for line in stdin:
        request = json.loads(line)
        answer(_render(template, request, start["special"], start["seconds"], start["chars"] + 2 * len(line)))


def _render(template, request: dict, special: dict, seconds: float, limit: int) -> dict:
    """One render: its text, or why not (the template's own error, its text past `limit` characters,
    its memory past the bound)."""
    pieces, size = [], 0
    try:
        with _cpu_time(seconds):
            context = {**special, "messages": request["messages"]}
            for piece in template.generate(**context, add_generation_prompt=request["add_generation_prompt"]):
                size += len(piece)
                if size > limit:
                    return {"error": "output", "limit": limit}
                pieces.append(piece)
        return {"text": "".join(pieces)}
    except MemoryError:
        pieces.clear()
        return {"error": "memory"}
    except TooLarge as e:
        return {"error": "size", "message": str(e)}
    except Exception as e:  # a template's raise_exception, a template error, a guard above
        return {"error": "template", "message": _said(e)}


@contextlib.contextmanager
def _cpu_time(seconds: float):
    """A block that may take at most `seconds` of this process's CPU time: past it, SIGPROF ends the
    process (its default action), even inside one long operation such as a big multiplication."""
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def _said(e: BaseException) -> str:
    """What an error says, at most a thousand characters (the parent keeps its first line)."""
    return str(e).strip()[:1000] or type(e).__name__


if __name__ == "__main__":
    serve()
