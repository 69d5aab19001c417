"""Training: optimizer groups, schedule, exact resume, crash safety and bad input."""

import math
import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import minitf
import minitf.system.files
from minitf import optim
from minitf.budget import budget_steps
from minitf.config import TrainConfig
from minitf.errors import MinitfError
from minitf.training.metrics import METRICS, read_rows

from .helpers import ROOT, tiny_config, tiny_train_args, train_with_snapshot


def test_optimizer_groups_decay_only_linear_matrices():
    m = minitf.Transformer(minitf.ModelConfig(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=32))
    opt = optim.make_optimizer(m, TrainConfig(optimizer="adamw", weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    # 4 linear matrices per block; not the tied embedding/head, positions, norms or biases
    assert decayed == sorted(
        f"blocks.{i}.{w}.weight" for i in range(2) for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def test_lr_schedule_warmup_then_cosine():
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100)
    assert optim.lr_at(0, 0.0, tc, budget_steps(tc)) == pytest.approx(0.1)  # (0+1)/10 of the peak
    assert optim.lr_at(9, 0.09, tc, budget_steps(tc)) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.09)))
    assert optim.lr_at(50, 0.5, tc, budget_steps(tc)) == pytest.approx(0.55)
    assert optim.lr_at(100, 1.0, tc, budget_steps(tc)) == pytest.approx(0.1)
    assert optim.lr_at(100, 1.7, tc, budget_steps(tc)) == pytest.approx(0.1)  # past a time budget it stays at min_lr


def test_train_writes_a_complete_run(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus), log=lambda *a: None)
    for name in (
        "config.yaml",
        "tokenizer.json",
        "model.safetensors",
        "best.safetensors",
        "state.pt",
        "metrics.jsonl",
        "loss.png",
    ):
        assert (run / name).is_file(), name
    rows = read_rows(run / METRICS)
    assert [r["step"] for r in rows] == [4, 8]
    assert set(rows[0]) >= {"step", "train_loss", "val_loss", "val_bpb", "lr", "grad_norm", "tokens_per_s", "elapsed_s"}
    assert rows[1]["train_loss"] < rows[0]["train_loss"] < math.log(300) + 0.5
    weights = load_file(run / "model.safetensors")
    assert not any(k.startswith("_orig_mod.") for k in weights)
    model, tok, cfg = minitf.load_run(run)
    assert cfg.model.vocab_size == tok.vocab_size and cfg.train.max_steps == 8
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["step"] == 8


# the tiny recipe (learned positions, AdamW), and the default recipe's parts (rotary positions, Muon)
@pytest.mark.parametrize("parts", [(), ("model.positions=rope", "train.optimizer=muon")], ids=["tiny", "default"])
def test_exact_resume_is_bit_identical(tmp_path, corpus, monkeypatch, parts):
    # dropout on, so the torch RNG state must come back too
    over = ("model.dropout=0.1", "train.grad_accum=2", *parts)
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *over), snapshot, 4, monkeypatch)
    resumed = minitf.train(tiny_config(snapshot, corpus, *over), resume=True, log=lambda *a: None)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["step"] for r in read_rows(resumed / METRICS)] == [4, 8]


def test_a_compiled_run_resumes_bit_identically_in_float32(tmp_path, corpus, monkeypatch):
    # torch.compile's kernels are the same code after a resume, so the resumed run repeats the straight one
    over = ("train.compile=true", "train.dtype=float32")
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *over), snapshot, 4, monkeypatch)
    resumed = minitf.train(tiny_config(snapshot, corpus, *over), resume=True, log=lambda *a: None)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_refuses_to_overwrite_or_mismatch(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), log=lambda *a: None)
    with pytest.raises(MinitfError, match="already holds a run; pass --resume"):
        minitf.train(tiny_config(run, corpus), log=lambda *a: None)
    with pytest.raises(
        minitf.ConfigError,
        match=r"--resume cannot change model.n_layer \(the run was trained with "
        r"model.n_layer=2\)",
    ):
        minitf.train(tiny_config(run, corpus, "model.n_layer=3"), resume=True, log=lambda *a: None)
    with pytest.raises(MinitfError, match="no checkpoint to resume"):
        minitf.train(tiny_config(tmp_path / "new", corpus), resume=True, log=lambda *a: None)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(minitf.ConfigError, match="is a file"):
        minitf.train(tiny_config(tmp_path / "afile", corpus), log=lambda *a: None)


def test_disk_full_keeps_previous_checkpoint(tmp_path, corpus, monkeypatch):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), log=lambda *a: None)
    before = (run / "model.safetensors").read_bytes()
    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith(".safetensors"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(minitf.system.files.os, "replace", full)
    with pytest.raises(MinitfError, match="No space left on device; the previous file there is intact"):
        minitf.train(tiny_config(run, corpus, "train.max_steps=8"), resume=True, log=lambda *a: None)
    assert (run / "model.safetensors").read_bytes() == before
    assert not list(run.glob(".*.tmp"))
    minitf.load_run(run)  # still loads


def test_non_finite_steps_are_skipped_then_stop(tmp_path, corpus, monkeypatch):
    real_forward = minitf.Transformer.forward

    def nan_after_4(self, idx, targets=None, cache=None, logits=True):
        logits, loss = real_forward(self, idx, targets, cache, logits=logits)
        if targets is not None and self.training and nan_after_4.calls >= 4:
            loss = loss * float("nan")
        nan_after_4.calls += self.training
        return logits, loss

    nan_after_4.calls = 0
    monkeypatch.setattr(minitf.Transformer, "forward", nan_after_4)
    logs = []
    with pytest.raises(MinitfError, match="3 non-finite steps in a row at step 6"):
        minitf.train(
            tiny_config(tmp_path / "run", corpus, "train.max_bad_steps=3", "train.max_steps=20"), log=logs.append
        )
    assert sum("step skipped" in line for line in logs) == 3
    state = torch.load(tmp_path / "run" / "state.pt", weights_only=True)
    assert state["step"] == 4  # the last good checkpoint stays
    w = load_file(tmp_path / "run" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in w.values())


def _script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def test_script_errors_are_one_line(tmp_path):
    r = _script("scripts/train.py", "--config", "configs/tiny.yaml", "model.n_layers=2")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown config key 'model.n_layers' (did you mean 'n_layer'?)"
    r = _script("scripts/train.py", "--help")
    assert r.returncode == 0 and "values a plain run uses, from configs/shakespeare.yaml" in r.stdout
    assert "train.max_seconds = 210.0" in r.stdout and "model.n_embd = 128" in r.stdout  # not the dataclass 256


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path, corpus):
    run = tmp_path / "run"
    args = [
        "scripts/train.py",
        *tiny_train_args(run, corpus),
        "train.max_steps=100000",
        "train.ckpt_every=5",
        "train.eval_every=1000",
        "train.eval_batches=1",
    ]
    env = {**os.environ, "MINITF_CACHE": os.environ["MINITF_CACHE"]}
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if (run / "state.pt").is_file() and torch.load(run / "state.pt", weights_only=True)["step"] >= 10:
            break
        time.sleep(0.2)
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    killed_at = torch.load(run / "state.pt", weights_only=True)["step"]
    assert killed_at >= 10 and killed_at % 5 == 0
    minitf.load_run(run)  # the last complete checkpoint reads
    r = _script(
        *args[:-4],
        f"train.max_steps={killed_at + 5}",
        "train.ckpt_every=5",
        "train.eval_every=5",
        "train.eval_batches=1",
        "--resume",
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming {run} at step {killed_at}" in r.stdout
    assert torch.load(run / "state.pt", weights_only=True)["step"] == killed_at + 5


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_big_blocks_are_reused_without_page_faults():
    # in a child process: the allocator setting is process-wide and would outlive this test
    code = """
import resource, torch
from minitf.system.runtime import keep_freed_memory

def faults_for_five_40mb_tensors():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        torch.empty(10_000_000).fill_(1.0)  # 40 MB, written, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(faults_for_five_40mb_tensors())  # glibc's default: mmap and unmap each block
keep_freed_memory()
for _ in range(3):  # the heap grows to hold them, once; that may take a round or two
    faults_for_five_40mb_tensors()
print(faults_for_five_40mb_tensors())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after = map(int, r.stdout.split())
    assert before > 20_000  # ~10,000 faults of 4 KB pages per block without the setting
    assert after < 2_000
