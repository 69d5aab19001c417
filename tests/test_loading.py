"""Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
checkpoint), a run.init_from directory that does not describe one complete model is refused in
one line naming what is wrong (never random layers), and a resume without the run's tokenizer
says what is missing."""

import json
import pickle
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import minitf
from minitf.errors import MinitfError
from minitf.training import checkpoint as ckpt

from .helpers import ROOT, tiny_config, tiny_gpt2_config, tiny_train_args

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
    from minitf.cli import evaluate, export, export_gguf

    with pytest.raises(MinitfError, match=_refusal(nan_run).replace("(", r"\(")):
        evaluate.main(["--run", str(nan_run), "--batch-size", "2"])
    pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export.main(["--run", str(nan_run), "--out", str(tmp_path / "hf")])
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export_gguf.main(["--run", str(nan_run), "--out", str(tmp_path / "m.gguf")])
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()


def test_the_explorer_refuses_to_serve_it(nan_run):
    from minitf.web.explore import Explorer

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
    from minitf.optim import make_optimizer
    from minitf.training import fsdp

    cfg = tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4")
    run = minitf.train(cfg, **QUIET)
    cfg = minitf.load_config(run / ckpt.CONFIG)
    model = minitf.Transformer(cfg.model)
    optimizer = make_optimizer(model, cfg.train, torch.device("cpu"))
    state = fsdp.load_sharded(run, model, optimizer, print, True)
    with torch.no_grad():
        model.ln_f.weight[0] = float("nan")
    keep = {k: state[k] for k in ("scaler", "rng", "rank_rng", "elapsed", "best_val", "tokenizer", "data")}
    fsdp.save_sharded(run, model, optimizer, keep, 6, True)  # a checkpoint the trainer would never write
    with pytest.raises(
        MinitfError, match=r"sharded-00000006: tensor ln_f.weight holds NaN/inf values \(1 of 32\); .*cannot be resumed"
    ):
        minitf.train(run, resume=True, overrides=["train.max_steps=8"], **QUIET)


# ------------------------------------------------------------------ run.init_from: one complete model, or one line


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, corpus):
    """A small GPT-2 saved by transformers with its tokenizer.json: a valid run.init_from."""
    tf = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    tok = minitf.Tokenizer.train([p.read_text() for p in sorted(corpus.glob("*.txt"))], vocab_size=300)
    torch.manual_seed(0)
    config = tiny_gpt2_config(tf, tok)
    out = tmp_path_factory.mktemp("init") / "gpt2"
    tf.GPT2LMHeadModel(config).save_pretrained(out)
    tok.save(out / "tokenizer.json")
    return out


def _edit_weights(d, edit):
    tensors = load_file(str(d / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(d, edit):
    (d / "config.json").write_text(edit(json.loads((d / "config.json").read_text())))


def _to_pickle(d):
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


H = "transformer.h."
INIT_FROM_MISTAKES = {
    "missing tensors": (
        lambda d: _edit_weights(d, lambda t: [t.pop(H + "1.mlp.c_fc.weight"), t.pop(H + "0.ln_2.bias")]),
        r"does not hold one complete GPT-2 model of its config.json: missing transformer.h.0.ln_2.bias, "
        r"transformer.h.1.mlp.c_fc.weight; minitf never fills a layer with random values",
    ),
    "an extra layer": (
        lambda d: _edit_weights(d, lambda t: t.update({H + "2.ln_1.weight": torch.ones(32)})),
        r"does not hold one complete GPT-2 model of its config.json: no place for transformer.h.2.ln_1.weight;",
    ),
    "both": (
        lambda d: _edit_weights(d, lambda t: t.update({H + "2.ln_1.weight": t.pop(H + "1.ln_1.weight")})),
        r"missing transformer.h.1.ln_1.weight; no place for transformer.h.2.ln_1.weight;",
    ),
    "a wrong shape": (
        lambda d: _edit_weights(d, lambda t: t.update({H + "0.attn.c_attn.weight": torch.zeros(32, 64)})),
        r": tensors of another shape than its config.json describes: transformer.h.0.attn.c_attn.weight "
        r"\(32, 64\) where config.json needs \(32, 96\); the weights and config.json do not belong together",
    ),
    "a narrow embedding": (  # (300, 1) would broadcast into the (300, 32) table if it were copied unchecked
        lambda d: _edit_weights(d, lambda t: t.update({"transformer.wte.weight": torch.zeros(300, 1)})),
        r"transformer.wte.weight \(300, 1\) where config.json needs \(300 or more, 32\)",
    ),
    "a minimal config.json": (
        lambda d: _edit_config(d, lambda c: json.dumps({"model_type": "gpt2", "vocab_size": 300})),
        r": config.json lacks n_embd, n_layer, n_head, n_positions, which fix the model's shape; use the "
        r"config.json that save_pretrained wrote",
    ),
    "a config.json that is not JSON": (
        lambda d: _edit_config(d, lambda c: "{model_type: gpt2"),
        r"config.json is not valid JSON \(.*\); is it a save_pretrained config.json\?",
    ),
    "a size that is not a number": (
        lambda d: _edit_config(d, lambda c: json.dumps({**c, "n_layer": "2"})),
        r": config.json has n_layer='2'; each must be a positive integer",
    ),
    "NaN weights": (
        lambda d: _edit_weights(d, lambda t: t[H + "1.mlp.c_proj.weight"].view(-1).__setitem__(0, float("nan"))),
        r": tensor transformer.h.1.mlp.c_proj.weight holds NaN/inf values \(1 of 4096\);",
    ),
    "a pickle (.bin)": (_to_pickle, r"holds its weights as a pickle \(pytorch_model.bin\), which minitf never loads"),
    "a pickle (.pt)": (
        lambda d: [_to_pickle(d), (d / "pytorch_model.bin").rename(d / "model.pt")],
        r"holds its weights as a pickle \(model.pt\), which minitf never loads",
    ),
}


@pytest.mark.parametrize("case", INIT_FROM_MISTAKES)
def test_init_from_that_is_not_one_complete_model_is_one_line(case, gpt2_dir, tmp_path, corpus):
    edit, message = INIT_FROM_MISTAKES[case]
    broken = tmp_path / "broken"
    shutil.copytree(gpt2_dir, broken)
    edit(broken)
    with pytest.raises(MinitfError) as e:
        minitf.train(tiny_config(tmp_path / "ft", corpus, f"run.init_from={broken}"), **QUIET)
    assert re.search(message, str(e.value)) and "\n" not in str(e.value), str(e.value)
    assert str(e.value).startswith(str(broken))
    assert not (tmp_path / "ft").exists()  # refused before anything was written


def test_init_from_a_pickle_through_the_script_is_one_line_and_never_unpickled(gpt2_dir, tmp_path, corpus):
    broken = tmp_path / "pickled"
    shutil.copytree(gpt2_dir, broken)
    (broken / "model.safetensors").unlink()
    (broken / "pytorch_model.bin").write_bytes(pickle.dumps(_Evil()))
    r = subprocess.run(
        [sys.executable, "scripts/train.py", *tiny_train_args(tmp_path / "ft", corpus), f"run.init_from={broken}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "unpickled" not in r.stdout + r.stderr
    assert r.stderr.startswith(f"error: {broken} holds its weights as a pickle (pytorch_model.bin)")
    assert len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(
        MinitfError, match=r"pytorch_model.bin' is not a directory \(a pickle, which minitf never loads"
    ):
        minitf.train(tiny_config(tmp_path / "ft", corpus, f"run.init_from={broken / 'pytorch_model.bin'}"), **QUIET)


class _Evil:  # a pickle that would run code if it were loaded
    def __reduce__(self):
        return print, ("unpickled!",)


# ------------------------------------------------------------------ resume needs the run's own tokenizer


def test_resume_without_the_runs_tokenizer_says_what_is_missing(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    own = (run / ckpt.TOKENIZER).read_bytes()
    (run / ckpt.TOKENIZER).unlink()
    r = subprocess.run(
        [sys.executable, "scripts/train.py", "--resume", str(run), "train.max_steps=8"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
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
