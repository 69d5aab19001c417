"""The benchmarks as commands: scripts/bench.py and bench serve, smoke runs in their own processes."""

import json
import os
import subprocess
import sys

from tests.support import ROOT

# The benchmark harness runs end to end at tiny sizes (timings are printed, never asserted).


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


# The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors.


def test_the_bench_script_finds_bench_with_the_clone_already_on_the_path():
    """python scripts/bench.py puts scripts/ first on the path, and its bench.py is no package: the
    clone's bench/ must still be the one imported when the clone is on the path too (PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "scripts/bench.py", "--help"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stdout.startswith("usage: bench.py"), r.stderr[-2000:]


# The OpenAI-compatible server, spoken to by the official `openai` client over 127.0.0.1: its
# completions are minitf.generate's, its logprobs the model's own, its errors the client's own
# exception types; slow clients and closed connections are handled (observed through the server's
# hooks and logs, never through timings).


def test_bench_serve_smoke(tmp_path, tiny_run):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [sys.executable, "scripts/bench.py", "--only", "serve", "--run", str(tiny_run), "--new-tokens", "6"]
        + ["--rounds", "1", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())["serve"]
    assert [c["clients"] for c in res["runs"]] == [1, 8] and res["new_tokens"] == 6
    for c in res["runs"]:
        assert 0 < c["first_token_s"] <= c["first_token_max_s"] and c["tokens_per_s"] > 0
        assert len(c["tokens"]) == 1 and 0 < c["tokens"][0] <= c["clients"] * 6
    assert "8 clients at once: first token" in r.stdout
