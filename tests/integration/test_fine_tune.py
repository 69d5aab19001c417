"""Fine-tuning from a local Hugging Face directory (run.init_from): train, sample and export; a
directory that is not one complete model is one line."""

import json
import math
import pickle
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

import minitf
from minitf.errors import MinitfError
from minitf.export import hf as minitf_hf
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.models import tiny_gpt2_config
from tests.support.processes import command
from tests.support.runs import QUIET, tiny_config, tiny_train_args

# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


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


def test_init_from_a_pickle_through_the_command_is_one_line_and_never_unpickled(gpt2_dir, tmp_path, corpus):
    broken = tmp_path / "pickled"
    shutil.copytree(gpt2_dir, broken)
    (broken / "model.safetensors").unlink()
    (broken / "pytorch_model.bin").write_bytes(pickle.dumps(_Evil()))
    r = command("train", *tiny_train_args(tmp_path / "ft", corpus), f"run.init_from={broken}")
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


# What a run logs (metrics.jsonl, steps.jsonl, TensorBoard), fine-tuning from a local GPT-2
# directory (run.init_from), and the note when a time budget bought far fewer steps than usual.


def _gpt2_dir(tmp_path, corpus):
    """A small randomly initialised GPT-2 saved by transformers, with a tokenizer in GPT-2's own
    files (vocab.json + merges.txt): what a user has after downloading a model with their tools."""
    tf = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    tok = minitf.Tokenizer.train(texts, vocab_size=300)
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tiny_gpt2_config(tf, tok))
    out = tmp_path / "gpt2"
    hf.save_pretrained(out)
    tok.backend.model.save(str(out))  # vocab.json, merges.txt
    return out, hf, tok


def test_fine_tune_from_a_local_gpt2_then_sample_and_export(tmp_path, corpus):
    gpt2, hf, tok = _gpt2_dir(tmp_path, corpus)
    model, loaded_tok = minitf_hf.load_pretrained(gpt2)
    assert loaded_tok.encode("Romeo.\nO soft<|endoftext|>") == tok.encode("Romeo.\nO soft<|endoftext|>")
    ids = torch.tensor([tok.encode("But soft, what light")])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids)[0], hf.eval()(ids).logits, atol=1e-4, rtol=1e-4)
    # model.* in the config is replaced by the pretrained model's shape
    cfg = tiny_config(tmp_path / "ft", corpus, f"run.init_from={gpt2}", "model.n_layer=7", "data.vocab_size=999")
    lines = []
    run = minitf.train(cfg, log=lines.append)
    assert any(f"init_from {gpt2}" in line for line in lines)
    said = "fine-tune rates: lr 0.003, min_lr 0.0003 (train.lr, train.min_lr as set; "  # AdamW: no muon_lr
    assert any(line.startswith(said) for line in lines)  # configs/tiny.yaml's lr and min_lr
    tuned, tuned_tok, tuned_cfg = minitf.load_run(run)
    assert tuned_cfg.train.muon_lr == pytest.approx(0.015)  # config.yaml keeps the rates a resume goes on with
    assert not any(line.startswith("optimizer:") for line in lines)  # configs/tiny.yaml asks for AdamW itself
    assert tuned_cfg.model.n_layer == 2 and tuned_cfg.model.block_size == 32 and tuned_tok.hash == tok.hash
    first = read_rows(run / METRICS)[0]
    assert first["train_loss"] < math.log(300) + 0.3  # trained from the pretrained weights, and they moved:
    assert not torch.equal(tuned.wte.weight[:300], model.wte.weight[:300])
    assert len(minitf.generate(tuned, tuned_tok, "Romeo.\n", max_new_tokens=10, seed=0)) > 0
    back = minitf_hf.to_hf_gpt2(tuned, tuned_tok, tmp_path / "back")
    tf = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    again = tf.GPT2LMHeadModel.from_pretrained(back).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, tuned(ids)[0], atol=1e-4, rtol=1e-4)
    resumed = minitf.train(run, resume=True, overrides=["train.max_steps=10"], log=lambda *a: None)
    assert torch.load(resumed / "state.pt", weights_only=True)["step"] == 10


def test_init_from_mistakes_are_one_line(tmp_path, corpus):
    with pytest.raises(minitf.MinitfError, match="is not a directory"):
        minitf.train(tiny_config(tmp_path / "a", corpus, f"run.init_from={tmp_path / 'nope'}"), log=lambda *a: None)
    gpt2, _, _ = _gpt2_dir(tmp_path, corpus)
    (gpt2 / "vocab.json").unlink()
    with pytest.raises(minitf.MinitfError, match="holds no tokenizer"):
        minitf.train(tiny_config(tmp_path / "b", corpus, f"run.init_from={gpt2}"), log=lambda *a: None)


@pytest.mark.slow
def test_the_docs_fine_tune_runs_from_a_local_directory(tiny_run, corpus, tmp_path):
    """docs/training.md's fine-tune block, run by bash in a folder holding runs/shakespeare (the tiny
    run) and my.txt, offline: it exports the run, fine-tunes from that directory (fewer steps here),
    samples and exports the result; the fine-tune starts from the exported weights."""
    import os

    pytest.importorskip("transformers", reason="the block exports: pip install -e '.[hf]'")
    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = page.split("## Fine-tune a pretrained model", 1)[1]
    block = re.search(r"^```bash\n(.*?)^```", section, re.M | re.S)[1]
    assert "run.init_from=hf/shakespeare" in block and "--out hf/shakespeare" in block  # made by the block itself
    steps = {"train.max_steps=500": "train.max_steps=3", "train.warmup_steps=20": "train.warmup_steps=1"}
    block = re.sub("|".join(steps), lambda m: steps[m[0]], block)  # seconds, not minutes
    shutil.copytree(tiny_run, tmp_path / "runs" / "shakespeare")
    (tmp_path / "my.txt").write_text("".join(p.read_text() for p in sorted(corpus.glob("*.txt"))[:2]))
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run(["bash", "-ec", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = minitf.load_config(tmp_path / "runs" / "mine" / "config.yaml")
    assert cfg.run.init_from == "hf/shakespeare" and cfg.train.max_steps == 3
    assert (tmp_path / "hf" / "mine" / "config.json").is_file() and "fine-tune rates" in r.stderr + r.stdout
    base = load_file(tmp_path / "hf" / "shakespeare" / "model.safetensors")
    tuned = load_file(tmp_path / "hf" / "mine" / "model.safetensors")
    assert base.keys() == tuned.keys() and not all(torch.equal(base[k], tuned[k]) for k in base)  # trained on
