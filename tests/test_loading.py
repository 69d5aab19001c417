"""Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
checkpoint), a run.init_from directory that does not describe one complete model is refused in
one line naming what is wrong (never random layers), and a resume without the run's tokenizer
says what is missing."""

import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import minitf
from minitf import checkpoint as ckpt
from minitf.config import MinitfError

from .helpers import ROOT, tiny_config

QUIET = dict(log=lambda *a: None)
TENSOR = "blocks.0.attn.c_attn.weight"


def _poison(path, name=TENSOR, value=float("nan")):
    """Overwrite one value of tensor `name` in a safetensors file, its metadata (step, tokenizer) kept."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(path), metadata=meta)


@pytest.fixture
def nan_run(tmp_path, tiny_run):
    """A copy of the trained tiny run whose model.safetensors holds one NaN (best.safetensors is intact)."""
    run = tmp_path / "nan"
    shutil.copytree(tiny_run, run)
    _poison(run / ckpt.WEIGHTS)
    return run


def _refusal(run, name=TENSOR) -> str:
    """The line every loader gives for a NaN in run's model.safetensors."""
    return f"{run / ckpt.WEIGHTS}: tensor {name} holds NaN/inf values (1 of "


def test_load_run_names_the_file_and_the_tensor_and_a_way_out(nan_run):
    with pytest.raises(MinitfError) as e:
        minitf.load_run(nan_run)
    line = str(e.value)
    assert line.startswith(_refusal(nan_run)) and "\n" not in line
    assert line.endswith("use best.safetensors (--best) or train again with a lower train.lr")
    model, _, _ = minitf.load_run(nan_run, best=True)  # the way out it names works
    assert all(torch.isfinite(p).all() for p in model.parameters())
    _poison(nan_run / ckpt.BEST, "wte.weight" if "wte.weight" in load_file(nan_run / ckpt.BEST) else "lm_head.weight")
    with pytest.raises(MinitfError, match=r"best.safetensors: tensor (wte|lm_head).weight holds NaN/inf .*--best\)"):
        minitf.load_run(nan_run, best=True)


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinities_are_refused_too(nan_run, value):
    _poison(nan_run / ckpt.WEIGHTS, "ln_f.weight", value)
    _poison(nan_run / ckpt.WEIGHTS, TENSOR, 0.0)
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor ln_f.weight holds NaN/inf values \(1 of 32\)"):
        minitf.load_run(nan_run)


def test_the_generate_script_says_it_in_one_line(nan_run):
    r = subprocess.run(
        [sys.executable, "scripts/generate.py", "--run", str(nan_run), "--max-new-tokens", "3"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: " + _refusal(nan_run)) and len(r.stderr.strip().splitlines()) == 1


def test_evaluate_and_both_exports_refuse_before_writing(nan_run, tmp_path):
    from minitf.commands import evaluate, export, export_gguf

    with pytest.raises(MinitfError, match=_refusal(nan_run).replace("(", r"\(")):
        evaluate.main(["--run", str(nan_run), "--batch-size", "2"])
    pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export.main(["--run", str(nan_run), "--out", str(tmp_path / "hf")])
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export_gguf.main(["--run", str(nan_run), "--out", str(tmp_path / "m.gguf")])
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()


def test_the_explorer_refuses_to_serve_it(nan_run):
    from minitf.explore import Explorer

    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        Explorer(nan_run)


def test_resume_refuses_a_training_state_with_non_finite_weights(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
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


def test_a_sharded_checkpoint_with_non_finite_weights_is_refused(tmp_path, corpus):
    from minitf import parallel
    from minitf.optim import make_optimizer

    cfg = tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4")
    run = minitf.train(cfg, **QUIET)
    cfg = minitf.load_config(run / ckpt.CONFIG)
    model = minitf.Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    state = parallel.load_sharded(run, model, optimizer, print, True)
    with torch.no_grad():
        model.ln_f.weight[0] = float("nan")
    keep = {k: state[k] for k in ("scaler", "rng", "rank_rng", "elapsed", "best_val", "tokenizer", "data")}
    parallel.save_sharded(run, model, optimizer, keep, 6, True)  # a checkpoint the trainer would never write
    with pytest.raises(
        MinitfError, match=r"sharded-00000006: tensor ln_f.weight holds NaN/inf values \(1 of 32\); .*cannot be resumed"
    ):
        minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)
