"""minitf.cli.bench, called in process: outside a clone it is one line."""

from tests.support.errors import exit_code

# The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors.


def test_bench_outside_a_clone_is_one_line(monkeypatch, tmp_path, capsys):
    """bench/ is not in the wheel: an installed minitf with no clone around it says so in one line."""
    import minitf.cli.bench

    monkeypatch.setattr(minitf.cli.bench, "CLONE", tmp_path)  # a top with no bench/cli.py, as site-packages
    assert exit_code(["bench", "--only", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: minitf bench runs from a clone of the repository") and err.count("\n") == 1
