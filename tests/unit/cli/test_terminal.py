"""What a terminal is shown of a model's text: every control character but newline and tab, and
the bidi reordering characters, as escapes; the rest exactly; and piped output untouched."""

import io
import sys

from minitf.cli.terminal import for_stdout, shown


def test_controls_are_escaped_and_text_is_not():
    assert shown("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert shown("a\rb\x08c\x00d\x7fe") == "a\\rb\\x08c\\x00d\\x7fe"
    assert shown("\x9b2J \x85") == "\\x9b2J \\x85"  # C1: CSI and NEL, one character each
    assert shown("abc\u202edef\u2066x\u2069") == "abc\\u202edef\\u2066x\\u2069"
    plain = "line one\n\ttabbed, é, 日本, emoji \U0001f600, \u200d, «quotes»"
    assert shown(plain) == plain
    every = "".join(map(chr, range(0x250)))
    kept = {c for c in every if shown(c) == c}
    assert kept == set(every) - set(map(chr, [*range(0x00, 0x20), *range(0x7F, 0xA0)])) | {"\n", "\t"}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_only_a_terminal_gets_escapes(monkeypatch):
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert for_stdout("\x1b[2J\n") == "\\x1b[2J\n"
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert for_stdout("\x1b[2J\n") == "\x1b[2J\n"
