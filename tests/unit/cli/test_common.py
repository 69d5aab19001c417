"""minitf.cli.common: the newest run among several is the one a command reads by default."""

import os
import shutil

from minitf.cli.common import newest_run

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_newest_run_among_several(tmp_path, tiny_run):
    for i, name in enumerate(["b", "a", "c"]):
        shutil.copytree(tiny_run, tmp_path / name)
        os.utime(tmp_path / name / "model.safetensors", (1000 + i, 1000 + i))
    assert newest_run(tmp_path) == tmp_path / "c"
    os.utime(tmp_path / "a" / "model.safetensors", (5000, 5000))
    assert newest_run(tmp_path) == tmp_path / "a"
