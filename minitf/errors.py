"""The two exceptions minitf raises for things a user can fix; the scripts print them as one line."""


class MinitfError(Exception):
    """A user mistake or an environment problem: the scripts print it as one line, no traceback."""


class ConfigError(MinitfError, ValueError):
    """A configuration key or value that cannot be used."""
