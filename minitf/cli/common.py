"""What the commands share: user mistakes become one line on stderr and a non-zero exit code;
the newest run, prompts from stdin."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from pathlib import Path

from ..errors import MinitfError
from ..system.files import read_at_most

SAMPLING_DTYPES = ("float32", "bfloat16", "float16")  # --dtype of generate, chat and serve (torch's names)

# the most a prompt read from a file or a piped line may hold: 1 MB is hundreds of times the
# context of any model minitf trains (a longer prompt keeps only its last block_size tokens), and
# reading past it would let /dev/zero or an endless pipe fill the memory
MAX_PROMPT_BYTES = 1 << 20


def run_main(main) -> None:
    """Run main(); a MinitfError prints 'error: ...' and exits 2, Ctrl-C exits 130. No tracebacks.
    A warning prints as one line, 'warning: ...', not Python's file:line form with its source line."""
    from .start import interrupted

    if signal.getsignal(signal.SIGINT) is interrupted:  # start-up's imports are over: Ctrl-C is caught below
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning
            main()
        _quiet_late_ctrl_c()
    except MinitfError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        _forget_unhandled_interrupt()
        sys.exit(130)
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(0)


def _forget_unhandled_interrupt() -> None:
    """A Ctrl-C that lands in source run by exec() (dataclasses build their methods so, and fastapi
    and pydantic define hundreds while `serve` imports them) is marked unhandled by CPython even
    though run_main caught it, and the interpreter then ends itself by SIGINT at exit instead of
    with our 130. Running any source through exec() clears that mark: CPython resets it there."""
    exec("pass")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=file or sys.stderr)


def _quiet_late_ctrl_c() -> None:
    """main() has returned, but a second Ctrl-C may still come while the interpreter shuts down
    (torch's exit handlers take a moment): end then with 'interrupted' and 130, not a traceback."""

    def abort(*_):
        print("interrupted", file=sys.stderr)
        os._exit(130)

    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, abort)


def device_option(name: str) -> str:
    """argparse's type for --device: the name as given (auto, cpu, cuda, cuda:N, mps), once it names
    a device this machine has. Checked while the arguments are parsed, before a run is loaded;
    the error is a MinitfError that is not a ValueError, so argparse lets it through to run_main
    as one line instead of printing its usage."""
    from ..system.runtime import resolve_device  # imported on use: `--help` never waits for torch

    try:
        resolve_device(name, what="--device")
    except MinitfError as e:
        raise MinitfError(str(e)) from None
    return name


def add_device_argument(parser) -> None:
    """--device, as every command that loads a run takes it: auto by default, checked as it is parsed."""
    parser.add_argument(
        "--device",
        default="auto",
        type=device_option,
        help="auto (a CUDA GPU, else MPS, else the CPU), cpu, cuda[:N] or mps (default: auto)",
    )


def add_dtype_argument(parser) -> None:
    """--dtype, for the commands that sample: the weights' dtype while they decode."""
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=SAMPLING_DTYPES,
        help="the weights' dtype while sampling: bfloat16 or float16 read half the bytes a token needs "
        "(about 2x float32's tokens/s on a CPU, docs/generation.md), with the logits rounded to it "
        "(default: float32, as trained)",
    )


def dtype_words(dtype: str) -> str:
    """The start-up line's words for --dtype: nothing for float32."""
    return "" if dtype == "float32" else f", in {dtype}"


def newest_run(root: str | Path = "runs") -> Path:
    """The run directory under `root` whose weights were written last."""
    runs = sorted(Path(root).glob("*/model.safetensors"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise MinitfError(f"no trained run under {root}/; train one with minitf train, or pass --run DIR")
    return runs[-1].parent


def stdin_prompts():
    """Prompts from standard input: on a terminal, typed at a '> ' prompt (a line ending in a
    backslash goes on to the next line); piped, one per line, where a line that is not UTF-8 is
    reported and skipped, not fatal. A line longer than MAX_PROMPT_BYTES ends the command with
    one line: it is never read whole (a pipe from /dev/zero is one endless line)."""
    if sys.stdin.isatty():
        yield from _typed_prompts()
        return
    n = 0
    while raw := sys.stdin.buffer.readline(MAX_PROMPT_BYTES + 1):
        n += 1
        if len(raw.rstrip(b"\r\n")) > MAX_PROMPT_BYTES:
            raise MinitfError(
                f"input line {n} is longer than {MAX_PROMPT_BYTES:,} bytes; the model reads only its last "
                f"block_size tokens, so pass the end of the text (e.g. tail -c 100000)"
            )
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            print(f"error: input line {n} is not valid UTF-8 (byte {e.start}); skipped", file=sys.stderr)


def _typed_prompts():
    print("type a prompt and press Enter; end a line with \\ to go on to the next; Ctrl-D quits", file=sys.stderr)
    while True:
        lines = []
        try:
            while True:
                line = input("> " if not lines else ". ")
                if not line.endswith("\\"):
                    break
                lines.append(line[:-1])
        except EOFError:  # Ctrl-D
            print(file=sys.stderr)
            return
        yield "\n".join([*lines, line])


def read_prompt(path: str) -> str:
    """The text of --prompt-file: at most MAX_PROMPT_BYTES are read, so a huge file or an endless
    one (/dev/zero, a pipe that never ends) is refused in one line instead of filling the memory."""
    try:
        data = read_at_most(path, MAX_PROMPT_BYTES)
        if data is None:
            raise MinitfError(
                f"--prompt-file {path} is larger than {MAX_PROMPT_BYTES:,} bytes; the model reads only its last "
                f"block_size tokens, so pass the end of it (e.g. tail -c 100000 {path} > prompt.txt)"
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MinitfError(f"could not read --prompt-file {path}: {getattr(e, 'strerror', None) or e}") from None
