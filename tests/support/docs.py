"""The pages (README.md and docs/) and the shell commands they show."""

import re
import shlex

from . import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_commands(text: str) -> list[list[str]]:
    """Each command line of a shell text as its words (continuations joined, comments dropped, and
    the environment set before it, MINITF_ALL_EXTRAS=1 python ..., left out: the command is the same)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words = words[1:]
        if words and words[0] not in ("if", "then", "else", "fi", "set", "cd"):
            out.append(words)
    return out
