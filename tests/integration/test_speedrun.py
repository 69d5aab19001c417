"""minitf speedrun end to end: two recipes in turns write the JSON."""

import json
import subprocess
import sys

from tests.support import ROOT

# minitf speedrun (scripts/speedrun.py): recipes in turns at equal wall time, the time-to-reference rule, its JSON.


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
