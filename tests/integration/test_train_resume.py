"""Training, then resuming: from the run directory alone, bit-identically, on a new schedule;
refused when the corpus, the optimizer or the weights do not match."""

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

import minitf
import minitf.corpus.prepare
import minitf.corpus.sources
import minitf.corpus.token_cache
import minitf.data
import minitf.system.files
from minitf.budget import budget_steps
from minitf.config import load_config
from minitf.errors import MinitfError
from minitf.optim import lr_at
from minitf.run_dir import STEPS, list_snapshots, snapshot_path
from minitf.training import checkpoint as ckpt
from minitf.training import session as session_module
from minitf.training.metrics import METRICS, read_rows
from minitf.training.setup import IN_BACKWARD_WORDS
from tests.support.corpus import make_play, same_size_edit
from tests.support.processes import command
from tests.support.runs import QUIET, TENSOR, copy_run, tiny_args, tiny_config, train_with_snapshot
from tests.support.runs import snapshot_weights as weights

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_and_resumes(tmp_path, corpus, monkeypatch, dtype):
    over = (f"train.dtype={dtype}",)
    run = minitf.train(tiny_config(tmp_path / "run", corpus, *over, "train.max_steps=4"), **QUIET)
    saved = torch.load(run / "state.pt", weights_only=True)["scaler"]
    loaded = []
    real = torch.amp.GradScaler.load_state_dict
    monkeypatch.setattr(torch.amp.GradScaler, "load_state_dict", lambda self, s: (loaded.append(s), real(self, s)))
    minitf.train(tiny_config(run, corpus, *over), resume=True, **QUIET)
    rows = read_rows(run / METRICS)
    assert [r["step"] for r in rows] == [4, 8]
    assert all(math.isfinite(r[k]) for r in rows for k in ("train_loss", "val_loss", "grad_norm"))
    assert loaded == [saved]
    if dtype == "float16":
        assert saved["scale"] > 0  # the grad scaler's scale is part of the checkpoint


# A corpus that is not what it seems or does not hold still: symlinks in a data directory, a file
# edited in place (same size, mtime put back), a file changed while it is tokenized, and --resume
# after the corpus changed. Each reads every real file once, or makes a new cache, or is refused in
# one line naming the file or the source.


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_resume_on_a_changed_corpus_is_refused(tmp_path, cache):
    c = tmp_path / "c"
    c.mkdir()
    for i in range(3):
        (c / f"play{i}.txt").write_text(make_play(i))
    run = minitf.train(tiny_config(tmp_path / "run", c, "train.max_steps=4"), log=lambda *a: None)
    state = (run / "state.pt").read_bytes()
    original = (c / "play1.txt").read_bytes()

    same_size_edit(c / "play1.txt")
    with pytest.raises(MinitfError) as e:
        minitf.train(run, resume=True, overrides=["train.max_steps=6"], log=lambda *a: None)
    assert str(e.value) == (
        f"--resume: the corpus data.source=file:{c} changed since this run was trained on it ({c / 'play1.txt'} "
        f"edited); put the original text back, or start a new run.out_dir on the new text"
    )
    assert (run / "state.pt").read_bytes() == state

    (c / "play3.txt").write_text(make_play(3))  # a new file is a change too
    (c / "play1.txt").write_bytes(original)
    (c / "play0.txt").rename(c / "play9.txt")
    with pytest.raises(MinitfError) as e:
        minitf.train(run, resume=True, overrides=["train.max_steps=6"], log=lambda *a: None)
    assert f"trained on it ({c / 'play3.txt'} added, {c / 'play9.txt'} added, {c / 'play0.txt'} removed);" in str(
        e.value
    )

    shutil.rmtree(cache / "tokens")  # without the cache it was trained from, the change is not itemised
    with pytest.raises(MinitfError, match=r"trained on it \(its files' content differs\); put the original"):
        minitf.train(run, resume=True, overrides=["train.max_steps=6"], log=lambda *a: None)
    (c / "play9.txt").rename(c / "play0.txt")

    (c / "play3.txt").unlink()  # the text as trained on (new times, same content): it resumes
    minitf.train(run, resume=True, overrides=["train.max_steps=6"], log=lambda *a: None)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 6


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_resume_needs_only_the_run_directory(tmp_path, corpus):
    run = tmp_path / "run"
    assert command("train", *tiny_args(run, corpus, "train.max_steps=4")[1:]).returncode == 0  # the script's arguments
    r = command("train", "--resume", f"run.out_dir={run}", "train.max_steps=8")
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"resuming {run} at step 4" in r.stdout
    assert "resume: train.max_steps 4 -> 8" in r.stdout
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8
    assert load_config(run / "config.yaml").train.max_steps == 8  # config.yaml states what produced the weights
    assert load_config(run / "config.yaml").data.source == f"file:{corpus}"


def test_resume_refuses_to_switch_the_corpus_or_the_model(tmp_path, corpus, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")  # as scripts/train.py trains it with tiny_args(..., max_steps=4)
    r = command("train", "--resume", f"run.out_dir={run}", "data.source=shakespeare", "model.n_layer=3")
    assert r.returncode == 2
    assert r.stderr.startswith(
        "error: --resume cannot change data.source, model.n_layer (the run was trained with "
        f"data.source='file:{corpus}', model.n_layer=2)"
    )
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_longer_budget_continues_on_the_new_schedule(tmp_path, corpus, run_4_steps, run_8_steps):
    logs = []
    short = copy_run(run_4_steps, tmp_path / "run")
    minitf.train(tiny_config(short, corpus, "train.max_steps=8"), resume=True, log=logs.append)
    assert any("the LR follows the schedule of the new budget" in line for line in logs)
    straight = run_8_steps  # 8 steps planned from the start
    lrs = lambda run: [r["lr"] for r in read_rows(run / METRICS)]
    tc = load_config(short / "config.yaml").train
    assert lrs(short)[-1] == lrs(straight)[-1] == pytest.approx(lr_at(7, 7 / 8, tc, budget_steps(tc)))
    # the first 4 steps ran on the 4-step schedule
    assert lrs(short)[0] == pytest.approx(lr_at(3, 3 / 4, tc, budget_steps(tc)))


def test_the_library_resumes_from_the_run_directory_alone(tmp_path, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    minitf.train(run, resume=True, overrides=["train.max_steps=6"], **QUIET)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 6


def test_resuming_a_finished_run_does_not_step(tmp_path, corpus, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    before = (run / "state.pt").read_bytes()
    logs = []
    minitf.train(tiny_config(run, corpus, "train.max_steps=4"), resume=True, log=logs.append)
    assert any("already finished (step 4 of train.max_steps=4" in line for line in logs)
    assert (run / "state.pt").read_bytes() == before


def test_a_stale_weights_file_is_repaired_from_the_commit(tmp_path, corpus, run_8_steps):
    run = copy_run(run_8_steps, tmp_path / "run")
    (run / "model.safetensors").unlink()
    logs = []
    minitf.train(tiny_config(run, corpus), resume=True, log=logs.append)
    assert any("repairing" in line for line in logs)
    assert ckpt.weights_step(run / "model.safetensors") == 8
    minitf.load_run(run)


# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_resume_refuses_a_training_state_with_non_finite_weights(tmp_path, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    state = torch.load(run / ckpt.STATE, weights_only=True)
    state["model"][TENSOR][0, 0] = float("nan")
    torch.save(state, run / ckpt.STATE)
    before = (run / ckpt.STATE).read_bytes()
    with pytest.raises(
        MinitfError,
        match=rf"^{run / ckpt.STATE}: tensor {TENSOR} holds NaN/inf values \(1 of \d+\); the weights are unusable "
        r"\(training diverged, or the file was damaged\): it cannot be resumed; start a new run.out_dir",
    ):
        minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)
    assert (run / ckpt.STATE).read_bytes() == before


def test_resume_without_the_runs_tokenizer_says_what_is_missing(tmp_path, corpus, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    own = (run / ckpt.TOKENIZER).read_bytes()
    (run / ckpt.TOKENIZER).unlink()
    r = command("train", "--resume", str(run), "train.max_steps=8")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(
        f"error: {run} has a checkpoint but no tokenizer.json, which --resume needs (the model's token ids mean "
        f"nothing without the tokenizer it was trained with); put the run's own tokenizer.json back"
    )
    # another tokenizer is not this run's either
    minitf.Tokenizer.train([(corpus / "play0.txt").read_text()[::-1]], vocab_size=300).save(run / ckpt.TOKENIZER)
    with pytest.raises(
        MinitfError, match=rf"^{run / ckpt.TOKENIZER} is not the tokenizer this run was trained with \(its hash"
    ):
        minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)
    (run / ckpt.TOKENIZER).write_bytes(own)  # the run's own: the resume goes on
    minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)
    assert torch.load(run / ckpt.STATE, weights_only=True)["step"] == 8


# Muon for the blocks' matrices beside AdamW for the rest: the split, one LR schedule for both,
# a step's update, exact resume, and DDP.


def test_muon_resume_is_bit_identical(tmp_path, corpus, monkeypatch):
    overrides = ("train.optimizer=muon", "train.muon_lr=0.05", "model.dropout=0.1")
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *overrides), snapshot, 4, monkeypatch)
    state = torch.load(snapshot / "state.pt", weights_only=True)["optimizer"]
    assert set(state) == {"adamw", "muon"} and state["muon"]["state"]  # both states, momentum included
    resumed = minitf.train(snapshot, resume=True, log=lambda *a: None)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = read_rows(resumed / METRICS)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_resume_refuses_another_optimizer(tmp_path, run_4_steps):
    run = copy_run(run_4_steps, tmp_path / "run")
    with pytest.raises(minitf.MinitfError, match="train.optimizer"):
        minitf.train(run, resume=True, overrides=["train.optimizer=muon", "train.max_steps=8"], log=lambda *a: None)


# train.snapshot_every: the weights every N steps, kept through a resume, refused for large
# models; and minitf heads, which scores and draws them.


def test_a_resume_keeps_the_snapshots_written_and_adds_its_own(tmp_path, corpus):
    over = ("train.snapshot_every=2", "train.max_steps=4")
    run = minitf.train(tiny_config(tmp_path / "run", corpus, *over), **QUIET)
    before = snapshot_path(run, 2).read_bytes()
    stale = snapshot_path(run, 10)  # as a killed run leaves past its last checkpoint: trained again, so dropped
    stale.write_bytes(snapshot_path(run, 4).read_bytes())
    minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)
    assert [s for s, _ in list_snapshots(run)] == [2, 4, 6, 8]
    assert snapshot_path(run, 2).read_bytes() == before
    final = weights(run / "model.safetensors")
    assert all(torch.equal(final[k], v) for k, v in weights(snapshot_path(run, 8)).items())


# Training: optimizer groups, schedule, exact resume, crash safety and bad input.


# the tiny recipe (learned positions, AdamW), the default recipe's parts (rotary positions, Muon),
# and weights held in bfloat16, whose stochastic rounding draws by the step
@pytest.mark.parametrize(
    "parts",
    [(), ("model.positions=rope", "train.optimizer=muon"), ("train.dtype=bfloat16", "train.param_dtype=bfloat16")],
    ids=["tiny", "default", "bfloat16-weights"],
)
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


def test_optimizer_in_backward_trains_as_the_whole_step_does_and_resumes_exactly(tmp_path, corpus, monkeypatch):
    """train.optimizer_in_backward: each weight updated as backward finishes its gradient gives the
    weights the step after a whole backward gives (no clipping in either), bit for bit; a resumed
    run repeats it; and the logged grad norms are the same gradients' (clip_grad_norm_ sums bfloat16 norms)."""
    held = ("model.dropout=0.1", "train.dtype=bfloat16", "train.param_dtype=bfloat16", "train.grad_clip=0")
    stepped = minitf.train(tiny_config(tmp_path / "stepped", corpus, *held), **QUIET)
    over = (*held, "train.optimizer_in_backward=true")
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *over), snapshot, 4, monkeypatch)
    said = []
    resumed = minitf.train(tiny_config(snapshot, corpus, *over), resume=True, log=said.append)
    assert any(IN_BACKWARD_WORDS in line for line in said)  # the start-up line says so
    a = load_file(stepped / "model.safetensors")
    for run in (straight, resumed):
        b = load_file(run / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), run.name
    norms = [[r["grad_norm"] for r in read_rows(run / STEPS)] for run in (stepped, straight)]
    assert len(norms[0]) == 4 and norms[1] == pytest.approx(norms[0], rel=1e-2)  # every other step is logged


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


def test_batches_read_ahead_leave_the_run_and_its_resume_bit_identical(tmp_path, corpus, monkeypatch):
    # on a GPU the next step's batches are read while the device computes (Session.prefetch); here
    # the CPU reads ahead too, and the run, straight or resumed, is the one that never read ahead
    over = ("train.grad_accum=2",)
    plain = load_file(minitf.train(tiny_config(tmp_path / "plain", corpus, *over), **QUIET) / "model.safetensors")
    monkeypatch.setattr(session_module, "PREFETCH_ON", {"cpu"})
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *over), snapshot, 4, monkeypatch)
    resumed = minitf.train(tiny_config(snapshot, corpus, *over), resume=True, **QUIET)
    for run in (straight, resumed):
        got = load_file(run / "model.safetensors")
        assert all(torch.equal(got[k], plain[k]) for k in plain), run.name
