"""The benchmark harness runs end to end at tiny sizes (timings are printed, never asserted)."""

import torch

import minitf
import minitf.trainer
from tests.support import ROOT


def test_the_train_benchmark_times_the_trainers_own_step(monkeypatch):
    from bench import core as benchmarks

    assert benchmarks.train_step is minitf.trainer.train_step  # the trainer's function, not a copy
    runs = []

    def counted(run, lr, interrupted):
        runs.append(run)
        before = [p.detach().clone() for p in run.raw_model.parameters()]
        out = minitf.trainer.train_step(run, lr, interrupted)
        assert any(not torch.equal(a, p) for a, p in zip(before, run.raw_model.parameters()))  # a real step
        return out

    monkeypatch.setattr(benchmarks, "train_step", counted)
    cfg = minitf.load_config(ROOT / "configs" / "tiny.yaml", ["model.n_embd=32", "train.batch_size=2"])
    cfg.model.vocab_size = 97
    r = benchmarks.train_throughput(cfg, torch.device("cpu"), steps=2, warmup=1, repeats=2)
    assert len(runs) == 1 + 2 * 2 and r["tokens_per_s"] > 0 and r["batch"] == 2
    assert all(run is runs[0] and run.cfg.train.lr == cfg.train.lr for run in runs)  # one Session throughout


def test_the_profile_splits_a_real_step_by_phase_and_operator(tmp_path, corpus):
    from bench.profile import PHASES, describe, profile_step
    from tests.support.runs import tiny_config

    r = profile_step(tiny_config(tmp_path / "run", corpus), torch.device("cpu"), steps=3, warmup=1)
    phases = r["phases_ms"]
    assert list(phases) == [*PHASES, "rest of the step"]
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0
    # the phases are spans of the step's wall time: together they cannot exceed it
    assert sum(v for k, v in phases.items() if k != "rest of the step") <= r["ms_per_step"] * 1.05
    assert any(op in r["operators_ms"] for op in ("aten::mm", "aten::addmm"))  # the matmuls are there
    assert r["compile"] is False and r["dtype"] == "float32"  # the tiny recipe: float32, so auto stays eager
    assert describe(r)[1].split()[:2] == ["phase", "data"]
