"""minitf speedrun (scripts/speedrun.py): recipes in turns at equal wall time, the time-to-reference rule, its JSON."""

import pytest

import minitf
from minitf.cli import speedrun


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
