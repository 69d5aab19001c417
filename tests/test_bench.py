"""The benchmark harness runs end to end at tiny sizes (timings are printed, never asserted)."""

import json
import subprocess
import sys

from .helpers import ROOT


def test_bench_smoke(tmp_path, tiny_run):
    out = tmp_path / "bench.json"
    # an override right after --only's words is still an override (batch 2 below)
    r = subprocess.run(
        [
            sys.executable,
            "scripts/bench.py",
            "--config",
            "configs/tiny.yaml",
            "--only",
            "train",
            "generate",
            "startup",
            "explore",
            "train.batch_size=2",
            "--run",
            str(tiny_run),
            "--new-tokens",
            "8",
            "--steps",
            "2",
            "--rounds",
            "2",
            "--json",
            str(out),
            "--vocab",
            "97",
            "model.n_embd=32",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["machine"]["cores"] >= 1 and res["machine"]["torch"]
    assert res["train"]["tokens_per_s"] > 0 and res["train"]["batch"] == 2 and res["train"]["vocab"] == 97
    assert {(g["batch"], g["cache"], g["compile"]) for g in res["generate"]} == {
        (1, True, False),
        (1, False, False),
        (8, True, False),
        (8, False, False),
        (1, True, True),
    }
    assert next(g for g in res["generate"] if g["compile"])["first_call_s"] > 0
    assert all(g["new_tokens"] == 8 and len(g["rates"]) == 2 for g in res["generate"])
    assert res["startup"]["ok"] and res["startup"]["first_token_s"] > 0
    assert "KV cache speed-up at batch 1 (compiled)" in r.stdout
    ex = res["explore"]
    assert ex["warmup_s"] > 0 and 30 <= ex["long_prompt"]["tokens"] <= 32  # tiny_run: block_size 32
    assert all(
        len(ex[k]["times"]) == 5 and 0 < ex[k]["first_token_s"] <= ex[k]["max_s"] for k in ("prompt", "long_prompt")
    )
