"""minitf.plots.figures' writes: a figure lands only where it is told, replaces a file only when it
drew that file itself (its PNG tag) or is forced, and never replaces a FIFO or a device."""

import os

import pytest

import minitf
from minitf.errors import MinitfError
from minitf.plots.figures import figure_kind, plot_attention, plot_runs
from tests.support.errors import writes_one_line as one_line


def test_plot_runs_replaces_its_own_plot_and_nothing_else(tiny_run, tmp_path):
    out = plot_runs([tiny_run], tmp_path / "loss.png")
    assert figure_kind(out) == "loss" and out.read_bytes().startswith(b"\x89PNG")
    assert plot_runs([tiny_run], out, x="seconds") == out  # the same command again: replaced, no --force
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"the user's own bytes")
    with pytest.raises(MinitfError) as e:
        plot_runs([tiny_run], notes)
    assert one_line(e) == f"--out {notes} already exists; pass --force to replace it, or choose another name"
    assert notes.read_bytes() == b"the user's own bytes"
    assert figure_kind(plot_runs([tiny_run], notes, force=True)) == "loss"


def test_a_figure_never_replaces_a_run_file_a_fifo_or_another_kind_of_figure(tiny_run, tmp_path):
    weights = (tiny_run / "model.safetensors").read_bytes()
    with pytest.raises(MinitfError, match=r"model.safetensors already exists; pass --force"):
        plot_runs([tiny_run], tiny_run / "model.safetensors")
    assert (tiny_run / "model.safetensors").read_bytes() == weights
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(MinitfError, match=r"pipe.png is a FIFO, not a regular file; minitf replaces regular files"):
        plot_runs([tiny_run], fifo, force=True)
    assert fifo.is_fifo()
    loss = plot_runs([tiny_run], tmp_path / "loss.png")
    model, tok, _ = minitf.load_run(tiny_run)
    ins = minitf.inspect(model, tok, "The cat")
    with pytest.raises(MinitfError, match="loss.png already exists; pass --force"):
        plot_attention(ins, loss)  # a picture, but not one this command drew
    assert figure_kind(plot_attention(ins, tmp_path / "attn.png")) == "attention"
    assert figure_kind(plot_attention(ins, tmp_path / "attn.png", head=0)) == "attention"
    assert figure_kind(tiny_run / "model.safetensors") is None and figure_kind(tmp_path / "missing.png") is None
