"""The two exceptions minitf raises for things a user can fix (the scripts print them as one line),
and first_line(), which makes another library's error fit in that line."""


class MinitfError(Exception):
    """A user mistake or an environment problem: the scripts print it as one line, no traceback."""


class ConfigError(MinitfError, ValueError):
    """A configuration key or value that cannot be used."""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (at most `limit` characters), or its type's name when
    it has none: how a library's multi-line error goes into minitf's one-line message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0].strip()[:limit]
