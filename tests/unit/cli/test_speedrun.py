"""minitf speedrun (scripts/speedrun.py): recipes in turns at equal wall time, the time-to-reference rule, its JSON."""

import json
import subprocess
import sys

import pytest

import minitf
from minitf.cli import speedrun

from .helpers import ROOT


def test_time_to_reach_interpolates_between_evaluations():
    curve = [(10.0, 3.0), (20.0, 2.5), (30.0, 2.0)]
    assert speedrun.time_to_reach(curve, 2.25) == pytest.approx(25.0)
    assert speedrun.time_to_reach(curve, 3.0) == 10.0  # already there at the first evaluation
    assert speedrun.time_to_reach(curve, 2.0) == 30.0
    assert speedrun.time_to_reach(curve, 1.9) is None  # never reached


def test_parse_recipe(tmp_path):
    assert speedrun.parse_recipe("configs/tiny.yaml model.n_layer=1") == (
        "tiny",
        ["--config", "configs/tiny.yaml", "model.n_layer=1"],
    )
    assert speedrun.parse_recipe("fast=configs/tiny.yaml")[0] == "fast"
    with pytest.raises(minitf.MinitfError, match="not found"):
        speedrun.parse_recipe("x=configs/nope.yaml")


def test_two_recipes_in_turns_write_the_json(tmp_path, corpus):
    common = (
        f"data.source=file:{corpus} data.vocab_size=300 model.n_embd=32 model.block_size=32 "
        f"train.batch_size=4 train.eval_every=5 train.eval_batches=2 train.warmup_steps=2"
    )
    out = tmp_path / "speedrun.json"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/speedrun.py",
            f"a=configs/tiny.yaml {common}",
            f"b=configs/tiny.yaml {common} train.optimizer=muon",
            "--seconds",
            "3",
            "--rounds",
            "1",
            "--out-dir",
            str(tmp_path / "runs"),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"a", "b"} and result["machine"]["torch"]
    for label in ("a", "b"):
        (run,) = result["runs"][label]
        assert run["steps"] > 0 and 0 < run["full_val_bpb"] < 10 and run["seconds"] > 0
        # each run ends on its wall-clock budget (its last evaluation may be a step before the end:
        # training never evaluates twice in a row)
        assert "(time budget)" in (tmp_path / "runs" / f"{label}-r1.log").read_text()
        assert run["curve"][-1][1] == run["final_bpb"]
    assert result["runs"]["a"][0]["t_to_ref"] is not None  # the reference reaches its own final value
    assert "train.optimizer=muon" in result["recipes"]["b"]
    assert "a " in r.stdout and "b " in r.stdout  # the table
