"""minitf.cli.plot, called in process: --out replaces only a plot it drew, or any file with --force."""

import pytest

from minitf.cli import plot
from minitf.errors import MinitfError
from minitf.plots.figures import figure_kind


def test_plot_out_asks_for_force_before_replacing_a_file_it_did_not_write(tiny_run, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"weights")
    with pytest.raises(MinitfError, match=r"model.safetensors already exists; pass --force to replace it"):
        plot.main(["--run", str(tiny_run), "--out", str(out)])
    assert out.read_bytes() == b"weights"
    plot.main(["--run", str(tiny_run), "--out", str(out), "--force"])
    assert figure_kind(out) == "loss" and capsys.readouterr().out == f"wrote {out}\n"
    plot.main(["--run", str(tiny_run), "--out", str(out)])  # its own plot: replaced without --force
    assert figure_kind(out) == "loss"
