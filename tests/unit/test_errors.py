"""minitf.errors: another library's error fits one line."""

from minitf.errors import first_line

# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_another_librarys_error_fits_one_line():
    assert first_line(ValueError("  bad header\n  at byte 3\n")) == "bad header"
    assert first_line(RuntimeError("")) == "RuntimeError"  # no message: its type names it
    assert first_line(OSError("x" * 300), 160) == "x" * 160
