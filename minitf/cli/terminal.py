"""What a model writes, made safe for a terminal: its control characters shown, not obeyed.

A model samples bytes, and a terminal obeys some of them: ESC starts sequences that move the
cursor, clear the screen, set the window title or (in some terminals) write to the clipboard; a
carriage return or backspace overwrites what was printed; a bidi override makes a line read in an
order other than the one it has. So when stdout is a terminal, `minitf chat` and `minitf generate`
print every such character as its escape (`\\x1b`, `\\u202e`), and newline and tab as they are.
Piped or redirected output stays exact: a program or a file gets the text the model wrote, and
what it does with the bytes is its own choice.
"""

from __future__ import annotations

import re
import sys

# C0 controls but tab and newline, DEL, the C1 controls, and the bidi embeddings, overrides and
# isolates (U+202A-U+202E, U+2066-U+2069) that reorder how a line reads
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown(text: str) -> str:
    """text with each control character written as its Python escape: ESC as \\x1b, U+202E as \\u202e."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def for_stdout(text: str) -> str:
    """text as it should reach stdout: shown() on a terminal, exact otherwise."""
    return shown(text) if sys.stdout.isatty() else text
