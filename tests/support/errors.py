"""What a user sees when something is wrong: a one-line message, the exit code of a command run in
this process; and a user's own file, which must never change."""

from pathlib import Path

import pytest

from minitf.cli import main


def writes_one_line(e: pytest.ExceptionInfo) -> str:
    """The message of a raised error, which must be one line and no traceback."""
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def exit_code(argv) -> int:
    """The exit code of `minitf *argv`, run in this process (it must exit)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def victim(tmp_path: Path, name: str = "precious.txt") -> tuple[Path, bytes]:
    """A user's file outside the run directory, and its bytes, which must never change."""
    path = tmp_path / name
    data = b"the user's own bytes\n"
    path.write_bytes(data)
    return path, data
