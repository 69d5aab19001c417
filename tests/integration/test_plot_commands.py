"""minitf attention and minitf plot as a user runs them (in this process, as their scripts run
them): pictures written, tables printed, one-line errors (exit 2, no traceback) for bad input."""

import shutil

import matplotlib.image as mpimg
import pytest

import minitf
from minitf.inspection import token_label
from minitf.plots.figures import plot_runs
from tests.support.processes import command


def one_line_error(r, match):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert match in r.stderr, r.stderr


def picture(path):
    img = mpimg.imread(path)  # (height, width, 4)
    assert img.shape[0] > 300 and img.shape[1] > 300 and img[..., :3].std() > 0.1
    return img


def test_attention_grid_head_and_table(tiny_run, tmp_path):
    r = command(
        "attention", "--run", str(tiny_run), "--text", "The cat sat on the mat", "--out", str(tmp_path / "grid.png")
    )
    assert r.returncode == 0, r.stderr
    grid = picture(tmp_path / "grid.png")
    r = command(
        "attention",
        "--run",
        str(tiny_run),
        "--text",
        "The cat sat on the mat",
        "--layer",
        "-1",
        "--head",
        "1",
        "--print",
        "--out",
        str(tmp_path / "head.png"),
    )
    assert r.returncode == 0, r.stderr
    head = picture(tmp_path / "head.png")
    assert grid.shape[1] > head.shape[1]  # the grid has two heads side by side
    model, tok, _ = minitf.load_run(tiny_run)
    ins = minitf.inspect(model, tok, "The cat sat on the mat")
    w = ins.layers[-1].weights[1]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("layer 1, head 1: attention weights")
    assert f"wrote {tmp_path / 'head.png'}" in r.stdout
    first, last = lines[2].split(), lines[1 + len(w)].split()
    assert first == [token_label(ins.tokens[0]), "1.00"] and len(last) == len(w) + 1
    assert last[0] == token_label(ins.tokens[-1], 8)
    assert [float(c) for c in last[1:]] == pytest.approx(w[-1].tolist(), abs=0.005)


def test_attention_print_only_writes_nothing(tiny_run, tmp_path):
    r = command("attention", "--run", str(tiny_run), "--text", "O", "--print", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[2].split() == ["O", "1.00"], r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, match",
    [
        (["--layer", "2"], "layer 2 is out of range: the model has 2 layers, pass --layer 0..1"),
        (["--head", "-3"], "head -3 is out of range: the model has 2 heads per layer, pass --head 0..1"),
        (["--text", ""], "the text to inspect is empty"),
    ],
)
def test_attention_bad_input(tiny_run, tmp_path, args, match):
    one_line_error(
        command("attention", "--run", str(tiny_run), "--text", "ROMEO", *args, "--out", str(tmp_path / "a.png")),
        match,
    )
    assert not (tmp_path / "a.png").exists()


def test_attention_missing_run(tmp_path):
    one_line_error(command("attention", "--run", str(tmp_path / "nope"), "--text", "O"), "does not exist")


def test_plot_one_and_several_runs(tiny_run, tmp_path):
    r = command("plot", "--run", str(tiny_run), cwd=tmp_path)  # default --out loss.png
    assert r.returncode == 0 and "wrote loss.png" in r.stdout, r.stderr
    one = picture(tmp_path / "loss.png")
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    r = command("plot", "--run", str(tiny_run), "--run", str(other), "--out", str(tmp_path / "both.png"))
    assert r.returncode == 0, r.stderr
    assert picture(tmp_path / "both.png").shape == one.shape


def test_plot_bad_runs(tiny_run, tmp_path):
    one_line_error(command("plot", "--run", str(tmp_path / "nope")), "run directory")
    (tmp_path / "fresh").mkdir()
    with pytest.raises(minitf.MinitfError, match="has no evaluations yet; train longer"):
        plot_runs([tiny_run, tmp_path / "fresh"], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
