"""minitf evaluate end to end (in this process, as its script runs it): the held-out split unless
asked for the train split, and its one-line mistakes."""

import pytest

import minitf
from minitf.errors import ConfigError
from minitf.evaluate import evaluate_text
from tests.support.processes import command, one_line

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_evaluate_script(tiny_run, corpus, tmp_path):
    (tmp_path / "other.txt").write_text("O Romeo, Romeo, wherefore art thou Romeo?\n" * 40)
    r = command("evaluate", "--run", str(tiny_run), "--data", f"file:{tmp_path / 'other.txt'}", "--best")
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"{tiny_run} (best weights) on file:{tmp_path / 'other.txt'}:" in r.stdout
    # a text the run never saw has no held-out split: one number, for all of it
    assert [line.split("  ")[1] for line in r.stdout.splitlines() if line.startswith("  ")] == ["the whole text"]
    r = command("evaluate", "--run", str(tiny_run), "--data", f"file:{tmp_path / 'none.txt'}")
    assert r.returncode == 2 and r.stderr.startswith("error: data.source=file:") and "Traceback" not in r.stderr


def test_evaluate_scores_the_held_out_split_unless_asked_for_the_train_split(tiny_run):
    r = command("evaluate", "--run", str(tiny_run))
    assert r.returncode == 0, r.stderr[-1500:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("  ")]  # after the data's own lines
    assert [line.split("  ")[1] for line in rows] == ["val (held out)"]
    model, tok, cfg = minitf.load_run(tiny_run)
    from minitf.evaluate import evaluate_text

    val = evaluate_text(model, tok, cfg.data, log=lambda *a: None, splits=("val",))["val"]
    assert f"{val['tokens']:,} tokens  loss {val['loss']:.4f}" in r.stdout
    r = command("evaluate", "--run", str(tiny_run), "--with-train")
    rows = [line.split("  ")[1] for line in r.stdout.splitlines() if line.startswith("  ")]
    assert rows == ["val (held out)", "train split", "both"]


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


@pytest.mark.parametrize("size", ["0", "-1"])
def test_evaluate_batch_size_below_one(tiny_run, size):
    line = one_line(command("evaluate", "--run", str(tiny_run), "--batch-size", size))
    assert line == f"error: --batch-size must be a whole number of at least 1 (windows per forward pass), got {size}"
    model, tok, cfg = minitf.load_run(tiny_run)
    with pytest.raises(ConfigError, match=f"^batch_size must be a whole number of at least 1 .*, got {size}$"):
        evaluate_text(model, tok, cfg.data, batch_size=int(size))
