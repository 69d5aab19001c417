"""bench/gpu.sh, the one command prepared for a lent GPU, kept from rotting: its --dry-run runs the
whole script on the CPU at tiny sizes, through the same code, and every section must come back with
numbers (nanoGPT's skipped, saying why, as no clone is given)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_script_dry_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu"
    cmd = ["bash", "bench/gpu.sh", "--dry-run", "--out", str(out)]
    # the script's `python` is this one, so that the transformers check below asks the same environment
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (out / "gpu.log").is_file()
    res = json.loads((out / "gpu.json").read_text())
    assert res["dry_run"] is True and res["machine"]
    errors = {k: v["error"] for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not errors

    assert res["cuda_tests"]["files"] and res["cuda_tests"]["exit_code"] == 0
    assert res["cuda_tests"]["skipped"] >= 1  # no CUDA device here
    train = res["train"]
    for name in ("eager", "eager_resumed", "compiled", "compiled_resumed"):
        run = train[name]
        assert run["steps"] > 0 and run["tokens_per_s"] > 0 and run["peak_memory_mb"] > 0, name
        assert "mfu" in run and run["first_interval_s"] > 0 and run["wall_s"] > 0, name
    assert isinstance(train["compile_s"], float) and isinstance(train["compile_resumed_s"], float)

    ours = res["gpt2_small"]["minitf"]
    assert ours["tokens_per_s"] > 0 and ours["compile"] and ours["peak_memory_mb"] > 0
    assert isinstance(ours["compile_s"], float)
    assert "no nanoGPT clone" in res["gpt2_small"]["nanogpt"]["skipped"]

    decode = res["decode"]
    assert decode["dtype"] == "bfloat16" and decode["new_tokens"] > 0
    hf = ["hf"] if importlib.util.find_spec("transformers") else []
    for name in ("eager", "compiled", "compiled_cuda_graphs", *hf):
        assert decode[name]["tokens_per_s"] > 0 and decode[name]["first_call_s"] > 0, name
    assert decode["compiled"]["cudagraph_skips"] == 0  # none asked for
    # asked for on a CPU, the graphs are declined and counted (so the count is read): a GPU run must show 0
    assert decode["compiled_cuda_graphs"]["cudagraph_skips"] > 0
    if not hf:
        assert "transformers is not installed" in decode["hf"]["skipped"]
