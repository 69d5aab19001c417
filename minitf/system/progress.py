"""Progress that suits where it goes: a tqdm bar on a terminal, and in a file or a pipe (a SLURM
log, `| tee`, nohup) a plain line every few seconds instead of one endless line of carriage
returns, so a log shows life during a long tokenization and a long training run."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def progress_bar(
    total: float | None,
    desc: str,
    *,
    unit: str = "it",
    every: float = 10.0,
    disable: bool = False,
    file=None,
    **bar_kw,
):
    """tqdm on a terminal; elsewhere `Lines`, a line every `every` seconds. Either offers what
    minitf uses of a bar: update, n, set_postfix, write, close and `with`. bar_kw go to tqdm
    (unit_scale, unit_divisor, bar_format, initial, ...)."""
    file = file or sys.stderr
    if disable or _is_terminal(file):
        return tqdm(total=total, desc=desc, unit=unit, disable=disable, file=file, **bar_kw)
    return Lines(
        total,
        desc,
        unit=unit,
        every=every,
        file=file,
        initial=bar_kw.get("initial", 0),
        unit_scale=bar_kw.get("unit_scale", False),
        unit_divisor=bar_kw.get("unit_divisor", 1000),
        bar_format=bar_kw.get("bar_format"),
    )


def _is_terminal(file) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class Lines:
    """A progress report for logs: after every `every` seconds an update() prints one line such as
    `tokenizing: 31% 140M/456M [00:40<01:30, 3.50MB/s]` (tqdm's numbers, without the bar); close()
    prints a last one if any was printed."""

    def __init__(
        self,
        total: float | None,
        desc: str,
        *,
        unit: str = "it",
        every: float = 10.0,
        file=None,
        initial: float = 0,
        unit_scale: bool = False,
        unit_divisor: int = 1000,
        bar_format: str | None = None,
    ):
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.file = file or sys.stderr
        self.n = self.initial = initial
        self.unit_scale, self.unit_divisor = unit_scale, unit_divisor
        # a terminal bar's format, with the bar itself taken out
        self.bar_format = bar_format and bar_format.replace("{l_bar}{bar}| ", "{desc}: {percentage:.0f}% ")
        self.postfix = ""
        self.t0 = self.last = time.monotonic()
        self.printed = 0

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self._print(now)

    def set_postfix(self, values: dict | None = None, refresh: bool = True, **more) -> None:
        values = {**(values or {}), **more}
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def write(self, line: str) -> None:
        """A message of its own (an evaluation's numbers): on stdout, as tqdm.write puts it."""
        print(line, flush=True)

    def close(self) -> None:
        if self.printed:
            self._print(time.monotonic())
        self.printed = 0  # a second close prints nothing

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self, now: float) -> str:
        """The line as it stands at time `now` (time.monotonic())."""
        known = self.total is not None and self.total > 0
        counts = "{percentage:.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}" if known else ""
        fmt = self.bar_format or f"{{desc}}: {counts or '{n_fmt} [{elapsed}'}, {{rate_fmt}}{{postfix}}]"
        return tqdm.format_meter(
            self.n,
            self.total if known else None,
            now - self.t0,
            prefix=self.desc,
            unit=self.unit,
            unit_scale=self.unit_scale,
            unit_divisor=self.unit_divisor,
            initial=self.initial,
            postfix=self.postfix,
            bar_format=fmt,
        )

    def _print(self, now: float) -> None:
        print(self.line(now), file=self.file, flush=True)
        self.last = now
        self.printed += 1
