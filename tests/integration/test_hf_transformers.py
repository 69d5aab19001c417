"""Hugging Face GPT-2 interop (the hf extra): the same logits, tokens and greedy text both ways.

The tests that need transformers skip, with the reason, where it is not installed; the refusals
of settings GPT-2 cannot express run everywhere (they are checked before transformers is imported).
"""

import json
import subprocess
import sys

import pytest
import torch

import minitf
from minitf.config import SampleConfig
from minitf.export.hf import from_hf_gpt2, to_hf_gpt2
from minitf.generate import generate_tokens
from tests.support import ROOT

TEXTS = ["ROMEO: O love, sweet night!", "JULIET:\n\tgentle <|endoftext|> fair", "héllo wörld ✓  two  spaces"]


@pytest.fixture
def tf(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # everything here is local; never try the network
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


def random_gpt2(tf, activation="gelu_new", vocab_size=300, tied=True):
    """A randomly initialised HF GPT-2 (no download); biases and norm weights moved off their init."""
    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=vocab_size,
        n_positions=48,
        n_embd=32,
        n_layer=2,
        n_head=4,
        activation_function=activation,
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
        tie_word_embeddings=tied,
    )
    hf = tf.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return hf


def hf_logits(hf, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def mt_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0]


def test_export_loads_in_transformers_with_the_same_logits_and_tokens(tf, tiny_run, tmp_path):
    model, tok, cfg = minitf.load_run(tiny_run)
    out = to_hf_gpt2(model, tok, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    hf = tf.GPT2LMHeadModel.from_pretrained(out).eval()
    hf_tok = tf.AutoTokenizer.from_pretrained(out)
    assert hf.config.vocab_size == tok.vocab_size == 300 and model.wte.weight.size(0) == 320  # padding dropped
    assert hf.config.n_positions == cfg.model.block_size and hf.config.eos_token_id == tok.eot_id
    assert hf_tok.eos_token == hf_tok.bos_token == hf_tok.unk_token == "<|endoftext|>"
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf_tok(text)["input_ids"] == ids and hf_tok.decode(ids) == text
        a, b = mt_logits(model, ids), hf_logits(hf, ids)
        assert a.shape == b.shape == (len(ids), 300)
        assert (a - b).abs().max() < 1e-4 and a.std() > 0.5
    # and back: the directory imports as the same minitf model, tokenizer included
    back = from_hf_gpt2(out)
    assert back.config.block_size == cfg.model.block_size and back.config.gelu == "tanh"
    for name, p in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], p, rtol=0, atol=0)
    assert minitf.Tokenizer.load(out).encode(TEXTS[2]) == tok.encode(TEXTS[2])


@pytest.mark.parametrize("activation, gelu", [("gelu_new", "tanh"), ("gelu_pytorch_tanh", "tanh"), ("gelu", "exact")])
def test_import_random_gpt2_same_logits_and_greedy_tokens(tf, tmp_path, activation, gelu):
    hf = random_gpt2(tf, activation)
    model = from_hf_gpt2(hf)
    assert model.config.gelu == gelu and model.config.vocab_size == 300
    assert model.wte.weight[300:].abs().max() == 0  # the padding rows stay zero
    ids = [5, 17, 42, 9, 200, 3, 77]
    a, b = mt_logits(model, ids), hf_logits(hf, ids)
    assert (a - b).abs().max() < 1e-4 and a.std() > 0.5
    mine = torch.cat(list(generate_tokens(model, ids, SampleConfig(max_new_tokens=30, temperature=0)))).tolist()
    with torch.no_grad():
        theirs = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=30,
            pad_token_id=299,
        )[0, len(ids) :].tolist()
    assert 299 not in mine and theirs == mine and len(set(mine)) > 3  # not one token repeated
    hf.save_pretrained(tmp_path)  # and from a directory
    torch.testing.assert_close(mt_logits(from_hf_gpt2(tmp_path), ids), a, rtol=0, atol=0)


def test_import_untied_head(tf):
    hf = random_gpt2(tf, tied=False)
    model = from_hf_gpt2(hf)
    assert not model.config.tie_embeddings and model.lm_head.weight is not model.wte.weight
    ids = [1, 2, 3, 250]
    assert (mt_logits(model, ids) - hf_logits(hf, ids)).abs().max() < 1e-4


def test_import_refuses_gpt2_variants_and_bad_paths(tf, tmp_path):
    torch.manual_seed(0)
    odd = tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=300, n_positions=16, n_embd=32, n_layer=1, n_head=2, scale_attn_by_inverse_layer_idx=True
        )
    )
    with pytest.raises(minitf.MinitfError, match="scale_attn_by_inverse_layer_idx=True has no minitf equivalent"):
        from_hf_gpt2(odd)
    odd.config.scale_attn_by_inverse_layer_idx, odd.config.activation_function = False, "relu"
    with pytest.raises(minitf.MinitfError, match="activation_function='relu' has no minitf equivalent"):
        from_hf_gpt2(odd)
    with pytest.raises(minitf.MinitfError, match="could not load a model from .*nope"):
        from_hf_gpt2(tmp_path / "nope")
    with pytest.raises(minitf.MinitfError, match="takes a GPT2LMHeadModel or its directory, got a Linear"):
        from_hf_gpt2(torch.nn.Linear(2, 2))


def test_without_transformers_the_error_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    tok = minitf.Tokenizer.train(["some text"], vocab_size=300)
    model = minitf.Transformer(
        minitf.ModelConfig(
            vocab_size=tok.vocab_size, n_layer=1, n_embd=32, n_head=2, block_size=16, positions="learned"
        )
    )
    with pytest.raises(minitf.MinitfError, match=r"transformers is not installed; pip install -e '\.\[hf\]'"):
        to_hf_gpt2(model, tok, tmp_path)
    with pytest.raises(minitf.MinitfError, match="has no config.json"):  # import reads the files itself
        from_hf_gpt2(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", "import sys, minitf; print('transformers' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "False"  # import minitf never loads it


@pytest.mark.parametrize(
    "setting",
    ["positions=sinusoidal", "bias=false", "tie_embeddings=false", "norm_eps=1e-6"],
)
def test_gpt2_export_of_what_formats_calls_gpt2(tf, tmp_path, setting):
    """Sinusoidal positions (written as the learned table), no biases (zeros) and an untied head are GPT-2 too."""
    cfg = minitf.load_config(
        None,
        ["model.vocab_size=300", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=16"]
        + ["model.positions=learned", f"model.{setting}"],
    ).model
    torch.manual_seed(0)
    model = minitf.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tok = minitf.Tokenizer.train(["some text"], vocab_size=300)
    model.config.vocab_size = tok.vocab_size  # a tiny text trains fewer merges than asked
    hf = tf.GPT2LMHeadModel.from_pretrained(to_hf_gpt2(model, tok, tmp_path / "hf")).eval()
    ids = [1, 5, 263, 42, 7]
    assert (mt_logits(model, ids) - hf_logits(hf, ids)).abs().max() < 1e-4


def test_export_script(tf, tiny_run, tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "export_hf.py"), "--run", str(tiny_run), "--out", str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and f"wrote {tmp_path / 'hf'} as GPT-2 (GPT2LMHeadModel)" in r.stdout, r.stderr
    hf = tf.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    model, tok, _ = minitf.load_run(tiny_run)
    ids = tok.encode(TEXTS[0])
    assert (mt_logits(model, ids) - hf_logits(hf, ids)).abs().max() < 1e-4


def test_pipeline_generates_within_the_models_context(tf, tmp_path):
    """generation_config.json's max_length is the model's block_size: pipeline()'s own default of 256
    new tokens would run past a 32-token context (transformers warns that the maximum was exceeded)."""
    from minitf.export.hf import to_hf

    tok = minitf.Tokenizer.train([" ".join(TEXTS) * 20], vocab_size=300)
    cfg = minitf.ModelConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_embd=32, n_head=2)
    out, _ = to_hf(minitf.Transformer(cfg).eval(), tok, tmp_path / "hf")
    assert json.loads((out / "generation_config.json").read_text())["max_length"] == 32
    generated = tf.pipeline("text-generation", str(out))("ROMEO:", return_tensors=True, do_sample=False)
    assert len(tok.encode("ROMEO:")) < len(generated[0]["generated_token_ids"]) <= 32
