"""minitf.export.architecture: which standard architecture each option set exports as, and one-line refusals
that name every blocking key at once with the nearest exportable setting."""

import pytest

import minitf
from minitf import MinitfError, load_config
from minitf.config import ModelConfig
from minitf.export.architecture import blocking_keys, export_format, format_or_none
from tests.support import ROOT

LLAMA = dict(positions="rope", norm="rmsnorm", ffn="swiglu")


GPT2 = dict(positions="learned")


def cfg(**kw) -> ModelConfig:
    return ModelConfig(vocab_size=300, n_embd=32, n_head=4, **kw)


@pytest.mark.parametrize(
    "options, fmt",
    [
        ({}, "gptneox"),  # minitf's defaults: rotary positions, LayerNorm, tanh GELU
        ({"bias": False}, "gptneox"),  # zero biases
        (GPT2, "gpt2"),  # the default with a learned position table
        ({"positions": "sinusoidal"}, "gpt2"),  # the fixed table becomes the learned one
        ({**GPT2, "bias": False}, "gpt2"),  # zero biases
        ({**GPT2, "tie_embeddings": False}, "gpt2"),
        ({**GPT2, "dropout": 0.1, "attention": "reference"}, "gpt2"),  # change nothing at inference
        (LLAMA, "llama"),
        ({**LLAMA, "bias": True}, "llama"),
        ({**LLAMA, "bias": False, "tie_embeddings": False, "rope_base": 500000.0}, "llama"),
        ({**LLAMA, "gelu": "exact"}, "llama"),  # gelu is unused by swiglu
        ({**LLAMA, "qk_norm": True, "bias": False}, "qwen3"),
        ({**LLAMA, "qk_norm": True, "bias": False, "tie_embeddings": False}, "qwen3"),
    ],
)
def test_exportable_option_sets(options, fmt):
    c = cfg(**options)
    assert export_format(c) == fmt and format_or_none(c) == fmt
    assert blocking_keys(c, fmt) == {}


def refusal(**options) -> str:
    with pytest.raises(MinitfError) as e:
        export_format(cfg(**options))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_refusal_names_every_blocking_key_and_the_nearest_setting():
    # an exporter that writes only some formats asks among those: rope + LayerNorm + GELU is one
    # key from GPT-2 and two from Llama
    with pytest.raises(MinitfError) as e:
        export_format(cfg(positions="rope"), formats=("gpt2", "llama", "qwen3"))
    assert "(model.positions=rope blocks it)" in str(e.value)
    assert "nearest exportable setting is model.positions=learned (GPT-2);" in str(e.value)
    assert "GPT-NeoX" not in str(e.value)
    # several keys at once, all named, and all the changes the nearest format needs
    msg = refusal(positions="rope", norm="rmsnorm", ffn="relu2", logit_softcap=30.0)
    assert "(model.ffn=relu2, model.logit_softcap=30.0 block it)" in msg
    assert "nearest exportable setting is model.ffn=swiglu model.logit_softcap=null (Llama)" in msg
    msg = refusal(**GPT2, gelu="exact", logit_softcap=15.0, qk_norm=True)
    assert "(model.gelu=exact, model.qk_norm=true, model.logit_softcap=15.0 block it)" in msg
    assert "model.gelu=tanh model.qk_norm=false model.logit_softcap=null (GPT-2)" in msg
    # qk_norm with biases (Qwen3 has no MLP biases): two formats one change away, both offered
    msg = refusal(**LLAMA, qk_norm=True, bias=True)
    assert "(model.qk_norm=true, model.bias=true block it)" in msg
    assert "nearest exportable setting is model.qk_norm=false (Llama) or model.bias=false (Qwen3);" in msg
    # RMSNorm with learned positions: GPT-2 needs LayerNorm
    assert "model.norm=layernorm (GPT-2)" in refusal(**GPT2, norm="rmsnorm")
    assert format_or_none(cfg(**GPT2, norm="rmsnorm")) is None


def test_grouped_kv_heads_block_only_gpt2():
    c = cfg(**GPT2)
    c.n_kv_head = 2  # the key grouped-query attention adds; GPT-2 has one kv head per query head
    assert blocking_keys(c, "gpt2") == {"n_kv_head": (2, 4)}
    c = cfg(**LLAMA)
    c.n_kv_head = 2
    assert export_format(c) == "llama"


def test_repository_recipes():
    """What each shipped recipe exports as (the table the README gives)."""
    found = {}
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        m = load_config(path).model
        m.vocab_size = 300
        found[path.stem] = format_or_none(m)
    assert found["shakespeare"] == "gptneox" and found["tinystories"] == "llama"  # rope with LayerNorm and GELU
    assert found["shakespeare-learned"] == found["gpt2-small"] == "gpt2"


def test_unknown_format_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown export format 'gemma'"):
        blocking_keys(cfg(), "gemma")


# Hugging Face export and import for every architecture minitf.export.architecture names: GPT-2, GPT-NeoX,
# Llama (with and without biases, grouped KV heads) and Qwen3, checked against transformers itself:
# the same logits, the same 50 greedy tokens, the same token ids, pipeline("text-generation") with
# no extra argument, and export -> import -> export giving the same weights bit for bit.


def test_start_up_words_name_the_export_format():
    from minitf.export.architecture import export_words

    assert export_words(minitf.ModelConfig(vocab_size=300, **LLAMA, qk_norm=True, bias=False)) == "exports as Qwen3"
    assert export_words(minitf.ModelConfig(vocab_size=300, positions="rope")) == "exports as GPT-NeoX"
    assert export_words(minitf.ModelConfig(vocab_size=300, ffn="relu2")).startswith(
        "exports to no standard architecture (minitf export names"
    )
