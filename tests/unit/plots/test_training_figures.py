"""minitf.plots.training_figures: a run's curves, several runs as their own curves, against seconds,
and charts of one or two points."""

import json
import shutil

import pytest

from minitf.plots import figures as plotting
from minitf.training.metrics import METRICS, read_rows

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_two_runs_are_drawn_as_their_own_curves(tmp_path, tiny_run, monkeypatch):
    import minitf.plots.figures as plotting

    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    rows = read_rows(other / METRICS)
    for r in rows:
        r["val_loss"] += 1.0  # another curve than the first run's
    (other / "metrics.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    plotting.plot_runs([tiny_run, other], tmp_path / "both.png")
    ax_loss, ax_bpb, ax_lr = figures[0].axes
    lines = {line.get_label(): line for line in ax_loss.get_lines()}
    assert set(lines) == {"tiny train", "tiny val", "other train", "other val"}
    assert list(lines["other val"].get_ydata()) == [r["val_loss"] for r in rows]
    assert list(lines["tiny val"].get_ydata()) == [r["val_loss"] for r in read_rows(tiny_run / METRICS)]
    assert [line.get_label() for line in ax_bpb.get_lines()] == ["tiny", "other"]
    assert [line.get_label() for line in ax_lr.get_lines()] == ["tiny", "other"]


def test_curves_against_seconds_and_a_single_evaluation(tmp_path, tiny_run, monkeypatch):
    import minitf.plots.figures as plotting

    one = tmp_path / "one"
    shutil.copytree(tiny_run, one)
    rows = read_rows(one / METRICS)[:1]
    (one / "metrics.jsonl").write_text(__import__("json").dumps(rows[0]) + "\n")
    (one / "steps.jsonl").unlink(missing_ok=True)
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    plotting.plot_runs([one], tmp_path / "one.png", x="seconds")
    ax_loss, ax_bpb, ax_lr = figures[0].axes
    (bpb,) = ax_bpb.get_lines()
    assert list(bpb.get_xdata()) == [rows[0]["elapsed_s"]] and bpb.get_marker() == "o"  # a point, not nothing
    assert list(ax_lr.get_lines()[0].get_ydata()) == [rows[0]["lr"]]
    assert "seconds" in ax_bpb.get_xlabel()


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


@pytest.mark.parametrize("evals", [1, 2])
def test_a_one_or_two_point_chart_shows_its_points_at_whole_steps(tmp_path, monkeypatch, evals):
    rows = [
        {"step": 4 * (i + 1), "train_loss": 5.0 - i, "val_loss": 5.1 - i, "val_bpb": 2.5, "lr": 1e-3}
        for i in range(evals)
    ]
    (tmp_path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, out, **kw: figures.append(fig))
    plotting.plot_loss(tmp_path)
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        for line in ax.get_lines():
            assert line.get_marker() == "o" and list(line.get_xdata()) == [r["step"] for r in rows]
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
        assert all(r["step"] in ticks or ax.get_xlim()[0] < r["step"] < ax.get_xlim()[1] for r in rows)


def test_heads_out_never_replaces_a_fifo_or_a_file_it_did_not_draw(tiny_run, tmp_path):
    import os

    from minitf.cli import heads
    from minitf.errors import MinitfError

    fifo = tmp_path / "heads.png"
    os.mkfifo(fifo)
    with pytest.raises(MinitfError, match=r"heads.png is a FIFO, not a regular file; minitf replaces regular"):
        heads.main(["--run", str(tiny_run), "--out", str(fifo)])
    assert fifo.is_fifo()
    notes = tmp_path / "notes.png"
    notes.write_text("mine")
    with pytest.raises(MinitfError, match=r"notes.png already exists; pass --force to replace it"):
        heads.main(["--run", str(tiny_run), "--out", str(notes)])  # checked before the snapshots are scored
    assert notes.read_text() == "mine"
