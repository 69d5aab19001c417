"""minitf.cli.attention, called in process: --out is checked before the model is loaded."""

import os

import pytest

from minitf.cli import attention
from minitf.errors import MinitfError
from minitf.plots.figures import figure_kind


def test_attention_out_refuses_a_fifo_and_a_file_it_did_not_draw(tiny_run, tmp_path):
    fifo = tmp_path / "attn.png"
    os.mkfifo(fifo)
    with pytest.raises(MinitfError, match=r"attn.png is a FIFO, not a regular file; minitf replaces regular"):
        attention.main(["--run", str(tmp_path / "no-run"), "--text", "The cat", "--out", str(fifo), "--force"])
    assert fifo.is_fifo()  # refused before the (missing) run was even read
    notes = tmp_path / "notes.png"
    notes.write_text("mine")
    with pytest.raises(MinitfError, match=r"notes.png already exists; pass --force to replace it"):
        attention.main(["--run", str(tiny_run), "--text", "The cat", "--out", str(notes)])
    attention.main(["--run", str(tiny_run), "--text", "The cat", "--out", str(notes), "--force", "--head", "0"])
    attention.main(["--run", str(tiny_run), "--text", "The cat", "--out", str(notes)])  # its own: replaced
    assert figure_kind(notes) == "attention"
