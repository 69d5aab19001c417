"""The two exceptions: for things a user can fix, which the commands print as one line.

Beside them, first_line(), which makes another library's error fit in that line, and shown(),
which makes a user's value fit in it."""

import reprlib


class MinitfError(Exception):
    """A user mistake or an environment problem: the scripts print it as one line, no traceback."""


class ConfigError(MinitfError, ValueError):
    """A configuration key or value that cannot be used."""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (at most `limit` characters), or its type's name when
    it has none: how a library's multi-line error goes into minitf's one-line message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()[:limit]


SHOWN_CHARS = 80  # the most of a user's value an error message echoes back


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """A value as an error message shows it: its repr, at most `limit` characters (then '…').

    A value from a file or the command line can be megabytes long, or a list nested thousands
    deep: reprlib stops at a few items and levels, so even those are never formatted whole. An
    integer with more digits than Python converts to text (4300) is described by its size."""
    try:
        text = _SHORT.repr(value)
    except ValueError:  # int -> str refused past sys.get_int_max_str_digits()
        text = f"<an integer of {value.bit_length():,} bits>" if isinstance(value, int) else type(value).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel = 3
    r.maxdict = r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxstring = r.maxother = r.maxlong = 4 * SHOWN_CHARS  # past the cut: its "..." never shows
    return r


_SHORT = _short_repr()
