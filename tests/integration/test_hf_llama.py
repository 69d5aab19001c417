"""Hugging Face export and import for every architecture minitf.export.architecture names: GPT-2, GPT-NeoX,
Llama (with and without biases, grouped KV heads) and Qwen3, checked against transformers itself:
the same logits, the same 50 greedy tokens, the same token ids, pipeline("text-generation") with
no extra argument, and export -> import -> export giving the same weights bit for bit.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.config import SampleConfig
from minitf.export.hf import from_hf, load_pretrained, to_hf
from minitf.generate import generate_tokens
from tests.support.models import LLAMA

STRINGS = [
    "ROMEO: O love, sweet night!",
    "JULIET:\n\tgentle <|endoftext|> fair",
    "héllo wörld ✓  two  spaces",
    "emoji 🎭🗡️ and 👩‍👩‍👧",
    "  leading spaces",
    "trailing spaces   ",
    "\n\n\nnewlines\r\nwindows",
    "日本語のテキスト",
    "Ελληνικά κείμενο",
    "مرحبا بالعالم",
    "numbers 12345 67.89 -0",
    "it's they're we've I'm",
    "tabs\tand\tmore\ttabs",
    "MiXeD CaSe WoRdS",
    "a",
    " ",
    "<|endoftext|>",
    "x<|endoftext|>y",
    "punctuation!?.,;:()[]{}",
    "zero\u200bwidth and combining e\u0301",
]


PROMPT = "ROMEO: O love"


NEW = 50


@pytest.fixture
def tf(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # everything here is local; never try the network
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


@pytest.fixture(scope="module")
def tok():
    text = " ".join(STRINGS) * 3 + " the quick brown fox jumps over the lazy dog " * 20
    return minitf.Tokenizer.train([text], vocab_size=300)


def random_minitf(tok, **options) -> minitf.Transformer:
    """A minitf model with every weight moved off its initial value (norms, biases, a zero head too)."""
    torch.manual_seed(0)
    cfg = minitf.ModelConfig(
        vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_embd=64, n_head=4, **{"bias": False, **options}
    )
    model = minitf.Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.1))
            if name in ("wte.weight", "lm_head.weight"):
                p[tok.vocab_size :].zero_()  # padding rows stay zero, as training keeps them
    return model.eval()


def mt_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0]


def hf_logits(hf, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


def greedy_minitf(model, ids) -> list[int]:
    return torch.cat(list(generate_tokens(model, ids, SampleConfig(max_new_tokens=NEW, temperature=0)))).tolist()


def greedy_hf(tf, hf, ids) -> list[int]:
    # no stop token here: minitf's generate_tokens does not stop either, so 50 tokens compare one to one
    # (generate fills a config's unset keys from the model's own, so the stop token goes there)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW,
        )
    assert out.size(1) == len(ids) + NEW
    return out[0, len(ids) :].tolist()


def tensors(path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


EXPORTS = [
    ({"positions": "learned"}, "gpt2", "GPT2LMHeadModel"),
    ({"positions": "sinusoidal", "tie_embeddings": False}, "gpt2", "GPT2LMHeadModel"),
    ({"positions": "rope", "bias": True}, "gptneox", "GPTNeoXForCausalLM"),
    ({"positions": "rope", "tie_embeddings": False, "rope_base": 500.0}, "gptneox", "GPTNeoXForCausalLM"),
    (LLAMA, "llama", "LlamaForCausalLM"),
    ({**LLAMA, "bias": True, "tie_embeddings": False}, "llama", "LlamaForCausalLM"),
    ({**LLAMA, "n_kv_head": 2, "rope_base": 500.0, "norm_eps": 1e-6}, "llama", "LlamaForCausalLM"),
    ({**LLAMA, "n_kv_head": 1, "ffn_hidden": 96}, "llama", "LlamaForCausalLM"),
    ({**LLAMA, "qk_norm": True}, "qwen3", "Qwen3ForCausalLM"),
    ({**LLAMA, "qk_norm": True, "n_kv_head": 2, "tie_embeddings": False}, "qwen3", "Qwen3ForCausalLM"),
]


@pytest.mark.parametrize("options, fmt, arch", EXPORTS, ids=[f"{e[1]}-{i}" for i, e in enumerate(EXPORTS)])
def test_export_computes_the_same_model_in_transformers(tf, tok, tmp_path, options, fmt, arch):
    model = random_minitf(tok, **options)
    out, written = to_hf(model, tok, tmp_path / "hf")
    assert written == fmt
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch] and config["vocab_size"] == tok.vocab_size == 300
    assert config["tie_word_embeddings"] == model.config.tie_embeddings
    assert config["bos_token_id"] == config["eos_token_id"] == tok.eot_id
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["pad_token_id"] == tok.eot_id
    if fmt in ("llama", "qwen3"):
        assert config["num_key_value_heads"] == model.config.kv_heads and config["head_dim"] == 16
        assert config["rms_norm_eps"] == model.config.norm_eps
        assert config["rope_parameters"]["rope_theta"] == model.config.rope_base

    hf = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == arch
    ids = tok.encode(" ".join(STRINGS[:6]))[:60]
    a, b = mt_logits(model, ids), hf_logits(hf, ids)
    assert a.shape == b.shape == (len(ids), 300) and a.std() > 0.5
    diff = (a - b).abs().max().item()
    assert diff < 1e-4, diff

    prompt = tok.encode(PROMPT)
    mine = greedy_minitf(model, prompt)
    assert greedy_hf(tf, hf, prompt) == mine

    hf_tok = tf.AutoTokenizer.from_pretrained(out)
    for text in STRINGS:
        assert hf_tok(text)["input_ids"] == tok.encode(text), text
    assert hf_tok.eos_token == hf_tok.bos_token == "<|endoftext|>"

    # export -> import -> export: the same tensors, bit for bit
    back = from_hf(out)
    again, fmt_again = to_hf(back, tok, tmp_path / "again")
    assert fmt_again == fmt
    assert_same_tensors(tensors(out), tensors(again))
    torch.testing.assert_close(mt_logits(back, ids), a, rtol=0, atol=1e-6)


def test_export_command_says_which_architecture_and_refuses_in_one_line(tf, tok, tmp_path, capsys):
    from minitf.cli.export import main
    from minitf.training import checkpoint as ckpt

    for name, options in (("llama", {**LLAMA, "n_kv_head": 2}), ("odd", {**LLAMA, "ffn": "relu2", "logit_softcap": 9})):
        cfg = minitf.Config()
        cfg.model = random_minitf(tok, **options).config
        run = tmp_path / name
        run.mkdir()
        ckpt.write_run_files(run, cfg, tok)
        ckpt.save_weights(random_minitf(tok, **options), run / ckpt.WEIGHTS, 0, tok.hash)
        if name == "llama":
            main(["--run", str(run), "--out", str(tmp_path / "hf")])
            assert (
                capsys.readouterr().out.strip()
                == f"wrote {tmp_path / 'hf'} as Llama (LlamaForCausalLM) in float32 (run.weights_dtype)"
            )
        else:
            with pytest.raises(minitf.MinitfError) as e:
                main(["--run", str(run), "--out", str(tmp_path / "no")])
            assert "(model.ffn=relu2, model.logit_softcap=9.0 block it)" in str(e.value) and "\n" not in str(e.value)
            assert not (tmp_path / "no").exists()


def test_pipeline_runs_with_no_extra_argument(tf, tok, tmp_path):
    for options in ({}, LLAMA, {**LLAMA, "qk_norm": True}, {"positions": "rope"}):
        out, _ = to_hf(random_minitf(tok, **options), tok, tmp_path / str(len(options)))
        text = tf.pipeline("text-generation", model=str(out))(PROMPT, max_new_tokens=5, do_sample=False)
        assert text[0]["generated_text"].startswith(PROMPT)


def saved_by_transformers(tf, tok, tmp_path, kind: str, **overrides):
    """A random HF model of `kind` with perturbed weights, saved with our tokenizer beside it."""
    torch.manual_seed(1)
    shape = dict(
        vocab_size=tok.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        bos_token_id=tok.eot_id,
        eos_token_id=tok.eot_id,
    )
    if kind == "gptneox":
        cfg = tf.GPTNeoXConfig(
            **shape,
            intermediate_size=256,
            hidden_act="gelu_pytorch_tanh",
            use_parallel_residual=False,
            rotary_pct=1.0,
            rotary_emb_base=500.0,
            tie_word_embeddings=False,
        )
        cfg.update(overrides)
        hf = tf.GPTNeoXForCausalLM(cfg)
    elif kind == "llama":
        cfg = tf.LlamaConfig(
            **shape, num_key_value_heads=2, intermediate_size=96, rms_norm_eps=1e-5, tie_word_embeddings=False
        )
        cfg.update(overrides)
        hf = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.Qwen3Config(
            **shape, num_key_value_heads=2, head_dim=16, intermediate_size=192, tie_word_embeddings=True
        )
        cfg.update(overrides)
        hf = tf.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():  # every weight off its init, q/k-norm gains too, as a trained model's
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.1))
    out = tmp_path / kind
    hf.save_pretrained(out)
    tok.save(out / "tokenizer.json")
    return hf.eval(), out


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_import_a_model_saved_by_transformers(tf, tok, tmp_path, kind):
    hf, path = saved_by_transformers(tf, tok, tmp_path, kind)
    model, loaded = load_pretrained(path)
    model.eval()
    c = model.config
    assert (c.positions, c.norm, c.ffn, c.n_kv_head, c.qk_norm) == ("rope", "rmsnorm", "swiglu", 2, kind == "qwen3")
    assert c.ffn_hidden == (96 if kind == "llama" else None)  # qwen3's 192 is swiglu_hidden(64): the default
    assert c.norm_eps == (1e-5 if kind == "llama" else 1e-6) and c.tie_embeddings == (kind == "qwen3")
    assert loaded.hash == tok.hash
    ids = tok.encode(STRINGS[0] + STRINGS[2])
    a, b = mt_logits(model, ids), hf_logits(hf, ids)
    assert (a - b).abs().max() < 1e-4 and a.std() > 0.5
    prompt = tok.encode(PROMPT)
    assert greedy_minitf(model, prompt) == greedy_hf(tf, hf, prompt)
    # import -> export: transformers' own file again, bit for bit
    out, fmt = to_hf(model, tok, tmp_path / "again")
    assert fmt == kind
    assert_same_tensors(tensors(path), tensors(out))


def test_import_a_gptneox_saved_by_transformers(tf, tok, tmp_path):
    hf, path = saved_by_transformers(tf, tok, tmp_path, "gptneox")
    model = from_hf(path)
    c = model.config
    assert (c.positions, c.norm, c.ffn, c.gelu, c.rope_base, c.tie_embeddings) == (
        "rope",
        "layernorm",
        "gelu",
        "tanh",
        500.0,
        False,
    )
    ids = tok.encode(STRINGS[0] + STRINGS[3])
    a, b = mt_logits(model, ids), hf_logits(hf, ids)
    assert (a - b).abs().max() < 1e-4 and a.std() > 0.5
    prompt = tok.encode(PROMPT)
    assert greedy_minitf(model, prompt) == greedy_hf(tf, hf, prompt)
    out, fmt = to_hf(model, tok, tmp_path / "again")
    assert fmt == "gptneox"
    assert_same_tensors(tensors(path), tensors(out))
    hf.config.use_parallel_residual = True  # attention and MLP side by side: not minitf's block
    with pytest.raises(minitf.MinitfError, match="use_parallel_residual=True"):
        from_hf(hf)


def test_import_llama_with_attention_biases_only(tf, tok, tmp_path):
    hf, path = saved_by_transformers(tf, tok, tmp_path, "llama", attention_bias=True)
    model = from_hf(path)
    assert model.config.bias and model.blocks[0].mlp.c_fc.bias.abs().max() == 0  # the MLP's biases are zero
    ids = tok.encode(STRINGS[3])
    assert (mt_logits(model, ids) - hf_logits(hf, ids)).abs().max() < 1e-4


def test_import_names_every_missing_feature_in_one_line(tf, tok, tmp_path):
    _, path = saved_by_transformers(tf, tok, tmp_path, "qwen3", head_dim=32, use_sliding_window=True)
    config = json.loads((path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}
    config["hidden_act"] = "gelu"
    config["partial_rotary_factor"] = 0.5
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(minitf.MinitfError) as e:
        from_hf(path)
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("rope_type='yarn'", "hidden_act='gelu'", "partial_rotary_factor=0.5", "use_sliding_window=True"):
        assert part in msg, msg
    assert "have no minitf equivalent" in msg


def test_import_refuses_pickles_and_other_models(tf, tok, tmp_path):
    hf, path = saved_by_transformers(tf, tok, tmp_path, "qwen3")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")  # never unpickled, whatever it holds
    with pytest.raises(minitf.MinitfError, match=r"as a pickle \(pytorch_model.bin\), which minitf never loads"):
        load_pretrained(path)
    with pytest.raises(minitf.MinitfError, match="holds a 'bert' model; minitf imports"):
        from_hf(
            tf.BertModel(
                tf.BertConfig(
                    vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
                )
            )
        )


def test_fine_tune_from_a_local_llama(tf, tok, tmp_path, corpus):
    from tests.support.runs import tiny_config

    hf, path = saved_by_transformers(tf, tok, tmp_path, "llama")
    lines = []
    cfg = tiny_config(tmp_path / "ft", corpus, f"run.init_from={path}", "train.max_steps=4", "model.n_head=2")
    run = minitf.train(cfg, log=lines.append)
    assert any(f"init_from {path}" in line for line in lines)
    assert any("exports as Llama" in line for line in lines)  # the start-up line names the format
    tuned, _, tuned_cfg = minitf.load_run(run)
    assert (tuned_cfg.model.n_head, tuned_cfg.model.n_kv_head, tuned_cfg.model.ffn_hidden) == (4, 2, 96)
    out, fmt = to_hf(tuned, tok, tmp_path / "back")
    again = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = tok.encode(STRINGS[0])
    assert fmt == "llama" and (hf_logits(again, ids) - mt_logits(tuned, ids)).abs().max() < 1e-4


def test_import_sharded_files_unprefixed_names_and_extra_vocabulary_rows(tf, tok, tmp_path):
    """What hub directories hold: weights split over several files, a base model's unprefixed
    names, and more embedding rows than the tokenizer has tokens (only the tokenizer's are kept)."""
    hf, _ = saved_by_transformers(tf, tok, tmp_path, "llama", vocab_size=320)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="100KB")
    tok.save(sharded / "tokenizer.json")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").is_file()
    model, _ = load_pretrained(sharded)
    ids = tok.encode(STRINGS[1])
    assert model.config.vocab_size == 300
    assert (mt_logits(model.eval(), ids) - hf_logits(hf, ids)[:, :300]).abs().max() < 1e-4

    from safetensors.torch import save_file

    base = tmp_path / "base"  # a base model's names (no "model." prefix), the head beside them
    base.mkdir()
    (base / "config.json").write_text((sharded / "config.json").read_text())
    state = {k.removeprefix("model."): v.contiguous() for k, v in hf.state_dict().items()}
    save_file(state, str(base / "model.safetensors"))
    torch.testing.assert_close(mt_logits(from_hf(base, vocab_size=300), ids), mt_logits(model, ids), rtol=0, atol=0)
    with pytest.raises(minitf.MinitfError, match="the tokenizer has 400 tokens but the model only 320 rows"):
        from_hf(base, vocab_size=400)
