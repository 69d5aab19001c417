"""The pages (README.md and docs/) and the shell commands they show."""

import shlex

from . import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_commands(text: str) -> list[list[str]]:
    """Each command line of a shell text as its words (continuations joined, comments dropped)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] not in ("if", "then", "else", "fi", "set", "cd"):
            out.append(words)
    return out
