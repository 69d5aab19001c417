"""Training: optimizer groups, schedule, exact resume, crash safety and bad input."""

import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import minitf
import minitf.system.files
from minitf.errors import ConfigError, MinitfError
from minitf.system import runtime
from minitf.training.metrics import METRICS, read_rows
from tests.support.processes import command
from tests.support.runs import QUIET, copy_run, tiny_config


def test_train_writes_a_complete_run(run_8_steps):
    run = run_8_steps
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


def test_refuses_to_overwrite_or_mismatch(tmp_path, corpus, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    with pytest.raises(MinitfError, match="already holds a run; pass --resume"):
        minitf.train(tiny_config(run, corpus), log=lambda *a: None)
    with pytest.raises(
        minitf.ConfigError,
        match=r"--resume cannot change model.n_layer \(the run was trained with "
        r"model.n_layer=2\)",
    ):
        minitf.train(tiny_config(run, corpus, "model.n_layer=3"), resume=True, log=lambda *a: None)
    with pytest.raises(minitf.ConfigError, match=r"--resume cannot change train.lora_rank \(the run was trained with "):
        minitf.train(tiny_config(run, corpus, "train.lora_rank=4"), resume=True, log=lambda *a: None)  # another rank
    with pytest.raises(MinitfError, match="no checkpoint to resume"):
        minitf.train(tiny_config(tmp_path / "new", corpus), resume=True, log=lambda *a: None)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(minitf.ConfigError, match="is a file"):
        minitf.train(tiny_config(tmp_path / "afile", corpus), log=lambda *a: None)


def test_disk_full_keeps_previous_checkpoint(tmp_path, corpus, monkeypatch, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
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


def test_script_errors_are_one_line(tmp_path):
    r = command("train", "--config", "configs/tiny.yaml", "model.n_layers=2")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown config key 'model.n_layers' (did you mean 'model.n_layer'?)"
    r = command("train", "--help")
    assert r.returncode == 0 and "values a plain run uses, from configs/shakespeare.yaml" in r.stdout
    assert "train.max_seconds = 210.0" in r.stdout and "model.n_embd = 128" in r.stdout  # not the dataclass 256


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


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bf16_only_on_a_cpu_that_multiplies_it_natively(tmp_path, corpus, monkeypatch, native):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    assert runtime.resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert runtime.resolve_dtype("float32", torch.device("cpu")) == torch.float32
    logs = []
    minitf.train(tiny_config(tmp_path / "run", corpus, "train.dtype=auto", "train.max_steps=2"), log=logs.append)
    said = "bfloat16 (auto: native bf16 on this CPU)" if native else "float32 (auto: no native bf16 on this CPU)"
    assert any(f"| dtype {said} |" in line for line in logs)


def test_train_leaves_the_callers_random_state_alone(tmp_path, corpus):
    import random

    import numpy as np

    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    expected = torch.rand(3), random.random(), np.random.rand()
    handler = signal.getsignal(signal.SIGINT)
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert np.random.rand() == expected[2]
    assert signal.getsignal(signal.SIGINT) is handler  # the stop flag's handler is gone again


def test_compile_and_an_explicit_device_in_the_trainer(tmp_path, corpus):
    run = minitf.train(
        tiny_config(tmp_path / "run", corpus, "train.compile=true", "run.device=cpu", "train.max_steps=4"), **QUIET
    )
    keys = load_file(run / "model.safetensors").keys()
    assert keys and not any(k.startswith("_orig_mod.") for k in keys)  # the compiled wrapper is not saved
    assert not any(k.startswith("_orig_mod.") for k in torch.load(run / "state.pt", weights_only=True)["model"])
    minitf.load_run(run)


def test_skipped_steps_are_not_applied(tmp_path, corpus, monkeypatch):
    real_forward = minitf.Transformer.forward
    calls = []

    def nan_on_steps_5_and_6(self, idx, targets=None, cache=None, logits=True):
        logits, loss = real_forward(self, idx, targets, cache, logits=logits)
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) in (5, 6):
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(minitf.Transformer, "forward", nan_on_steps_5_and_6)
    logs = []
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_bad_steps=3"), log=logs.append)
    assert sum("step skipped" in line for line in logs) == 2
    # had a NaN gradient reached the weights, every later weight and loss would be NaN
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8
    assert all(torch.isfinite(t).all() for t in load_file(run / "model.safetensors").values())
    assert math.isfinite(read_rows(run / METRICS)[-1]["train_loss"])


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_no_checkpoint_after_non_finite_steps(tmp_path, corpus):
    with pytest.raises(MinitfError, match="no checkpoint was written in .*Lower train.lr"):
        minitf.train(
            tiny_config(tmp_path / "run", corpus, "train.lr=1e9", "train.min_lr=0", "train.max_steps=20"), **QUIET
        )
    assert not (tmp_path / "run" / "state.pt").exists() and not (tmp_path / "run" / "model.safetensors").exists()


def test_a_fresh_run_never_overwrites_weights(tmp_path, corpus, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    (run / "state.pt").unlink()
    with pytest.raises(MinitfError, match="already holds a run; .*model.safetensors, best.safetensors"):
        minitf.train(tiny_config(run, corpus), **QUIET)
    with pytest.raises(MinitfError, match="has weights but no training state"):
        minitf.train(tiny_config(run, corpus), resume=True, **QUIET)


def test_a_full_disk_during_training_keeps_the_checkpoint(tmp_path, corpus, monkeypatch, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    before = (run / "state.pt").read_bytes()
    real_save = torch.save

    def full(obj, f, *a, **kw):
        real_save(obj, f, *a, **kw)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 64")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(
        MinitfError, match=r"could not write .*state.pt: .*unexpected pos.*previous file there is intact"
    ):
        minitf.train(tiny_config(run, corpus, "train.max_steps=8"), resume=True, **QUIET)
    assert (run / "state.pt").read_bytes() == before
    assert not list(run.glob(".*.tmp"))


def test_files_follow_the_umask(tmp_path, corpus):
    old = os.umask(0o027)
    try:
        run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    finally:
        os.umask(old)
    for name in ("model.safetensors", "best.safetensors", "state.pt", "config.yaml", "tokenizer.json", "loss.png"):
        assert (run / name).stat().st_mode & 0o777 == 0o640, name


def test_damaged_run_directories_are_named(tmp_path, corpus, tiny_run, run_4_steps):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(tiny_run, run)
    (run / "config.yaml").write_bytes(b"\x00\x01\xff binary")
    with pytest.raises(ConfigError, match="config.yaml is not UTF-8 text"):
        minitf.load_run(run)
    with pytest.raises(MinitfError, match="load_run takes the path of a run directory, got NoneType"):
        minitf.load_run(None)
    other = minitf.train(tiny_config(tmp_path / "other", corpus, "model.n_embd=64", "train.max_steps=4"), **QUIET)
    small = copy_run(run_4_steps, tmp_path / "small" / "run")
    shutil.copy(other / "state.pt", small / "state.pt")  # another architecture's state
    with pytest.raises(MinitfError, match="state.pt holds a model of another shape"):
        minitf.train(tiny_config(small, corpus, "train.max_steps=8"), resume=True, **QUIET)


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_a_val_split_too_small_is_refused_before_training(tmp_path, corpus):
    cfg = tiny_config(tmp_path / "run", corpus / "play0.txt", "data.val_fraction=0.0001")
    with pytest.raises(MinitfError) as e:
        minitf.train(cfg, log=lambda *a: None)
    assert str(e.value) == (
        "the val split has only 2 tokens, fewer than block_size+1=33; use a bigger corpus, a smaller "
        "model.block_size or a larger data.val_fraction"
    )
    assert not (tmp_path / "run").exists()  # no step, no run files, and the directory it made is gone


def test_a_file_named_tensorboard_in_the_run_directory(tmp_path, corpus):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("my notes")
    with pytest.raises(MinitfError) as e:
        minitf.train(tiny_config(tmp_path / "run", corpus, "train.logger=tensorboard"), log=lambda *a: None)
    assert str(e.value) == (
        f"{tmp_path / 'run' / 'tensorboard'} is a file; train.logger=tensorboard writes its event files in a "
        f"directory of that name: move the file away, or use train.logger=jsonl"
    )
    assert (tmp_path / "run" / "tensorboard").read_text() == "my notes"
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the data was prepared
