"""minitf.export.weights: one table per export format, which the Hugging Face export, the Hugging Face
import and the GGUF export all read, so that adding a format means adding one table.

Runs without transformers, gguf or llama.cpp: the tensors are built and read in memory. That the
files compute the model is tests/integration/test_hf_llama.py's and
tests/integration/test_gguf_llamacpp.py's to check.
"""

import dataclasses
import re

import pytest
import torch

from minitf.config import ModelConfig
from minitf.export import gguf, hf_config, hf_tensors, weights
from minitf.export.architecture import FORMATS, export_format
from minitf.export.hf import HF_CLASSES
from minitf.export.layouts import rope_pairs_to_interleaved
from minitf.model import Transformer
from tests.support import ROOT

V = 100  # the tokenizer's vocabulary: the model pads its embedding and head to 128 rows


LLAMA = dict(positions="rope", norm="rmsnorm", ffn="swiglu")


# a model of each format, with and without the parts that only some models have
MODELS = [
    ("gpt2", dict(positions="learned")),
    ("gpt2", dict(positions="learned", bias=False, tie_embeddings=False)),
    ("gptneox", dict()),  # minitf's defaults
    ("gptneox", dict(bias=False, tie_embeddings=False)),
    ("llama", dict(LLAMA, bias=False)),
    ("llama", dict(LLAMA, bias=True, tie_embeddings=False, n_kv_head=2)),
    ("qwen3", dict(LLAMA, qk_norm=True, bias=False, n_kv_head=1)),
    ("qwen3", dict(LLAMA, qk_norm=True, bias=False, tie_embeddings=False)),
    ("qwen3", dict(LLAMA, qk_norm=True, bias=False, head_dim=16, n_kv_head=2)),  # Qwen3-0.6B's wider heads
    ("llama", dict(LLAMA, bias=False, rope_scaling="llama3", rope_factor=32.0, rope_original_context=8)),
    ("qwen2", dict(LLAMA, bias=False, qkv_bias=True, n_kv_head=2)),
    ("mistral", dict(LLAMA, bias=False, sliding_window=4, head_dim=16, family="mistral", tie_embeddings=False)),
    ("phi3", dict(LLAMA, bias=False, sliding_window=4, family="phi3")),
    (
        "gemma3",
        dict(
            positions="rope",
            norm="rmsnorm",
            ffn="geglu",
            qk_norm=True,
            bias=False,
            embed_scale=True,
            sandwich_norm=True,
            sliding_window=4,
            global_every=2,
            rope_local_base=10000.0,
            head_dim=16,
            n_kv_head=1,
        ),
    ),
]


IDS = [f"{fmt}-{i}" for i, (fmt, _) in enumerate(MODELS)]


def random_model(**options) -> Transformer:
    """A small model with every weight moved off its initial value, so that any mix-up shows."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=V, block_size=16, n_layer=2, n_embd=32, n_head=4, **options))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model.eval()


def round_trip(model: Transformer, fmt: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """minitf -> fmt's config and HF state dict -> (the config imported, minitf parameter name ->
    tensor), as export and import do it."""
    config = {**hf_config.hf_config(model.config, fmt, eot_id=0), "model_type": weights.TABLES[fmt].model_type}
    read_fmt, cfg = hf_config.model_config(config, V, where="test")
    assert read_fmt == fmt
    state = hf_tensors.hf_state(model, fmt)
    return cfg, hf_tensors.minitf_weights(state, cfg, fmt, config, where="test")


def uncovered(model: Transformer, back: dict[str, torch.Tensor]) -> list[str]:
    """The model's parameters that came back from the round trip absent or changed."""
    bad = []
    for name, p in model.named_parameters():
        rows = V if name in ("wte.weight", "lm_head.weight") else None  # the padding rows stay in minitf
        if name not in back or not torch.equal(p.detach()[:rows], back[name][:rows]):
            bad.append(name)
    return bad


def test_every_format_has_exactly_one_table():
    assert list(weights.TABLES) == list(FORMATS)
    tables = list(weights.TABLES.values())
    assert len({t.model_type for t in tables}) == len({t.hf_classes for t in tables}) == len(FORMATS)
    # llama.cpp runs Mistral as llama: the one architecture two formats share
    assert len({t.gguf_arch for t in tables}) == len(FORMATS) - 1 and weights.MISTRAL.gguf_arch == "LLAMA"
    # the names the commands print and import by come from the tables too
    assert HF_CLASSES == {
        "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
        **{f: t.hf_classes for f, t in weights.TABLES.items()},
    }
    assert hf_config.MODEL_TYPES == {
        "gpt2": "gpt2",
        "llama": "llama",
        "qwen3": "qwen3",
        "gpt_neox": "gptneox",
        "qwen2": "qwen2",
        "mistral": "mistral",
        "phi3": "phi3",
        "gemma3_text": "gemma3",
    }


@pytest.mark.parametrize("fmt, options", MODELS, ids=IDS)
def test_hf_export_and_import_round_trip_every_parameter(fmt, options):
    model = random_model(**options)
    assert export_format(model.config) == fmt
    cfg, back = round_trip(model, fmt)
    with torch.device("meta"):
        assert set(back) == {n for n, _ in Transformer(cfg).named_parameters()}
    assert uncovered(model, back) == []
    # a model without biases comes back with the zero biases its format always has
    added = set(back) - {n for n, _ in model.named_parameters()}
    assert bool(added) == (not model.config.bias and weights.TABLES[fmt].zero_biases)
    assert all(n.endswith(".bias") and not back[n].any() for n in added)


@pytest.mark.parametrize("fmt, options", MODELS, ids=IDS)
def test_hf_names_are_the_tables(fmt, options):
    model = random_model(**options)
    table = weights.TABLES[fmt]
    state = hf_tensors.hf_state(model, fmt)
    listed = [n for _, names, _ in weights.hf_weights(table, n_layer=2) for n in names]
    assert len(listed) == len(set(listed))  # no HF name is given twice
    # every name written is the table's; a model without biases leaves out those of formats that may lack them
    written = set(state)
    assert written <= set(listed)
    never_written = set(listed) - written
    assert all(n.endswith(".bias") for n in never_written)
    has = dict(model.named_parameters())
    lacking = [w for w in table.layer if w.minitf.endswith(".bias") and f"blocks.0.{w.minitf}" not in has]
    assert bool(never_written) == (bool(lacking) and not table.zero_biases)
    assert state["lm_head.weight"].shape == (V, 32)  # beside the base model, without padding rows


@pytest.mark.parametrize("fmt, options", MODELS, ids=IDS)
def test_gguf_names_are_the_tables_in_its_order(fmt, options):
    model = random_model(**options)
    table = weights.TABLES[fmt]
    tensors = gguf._tensors(model, fmt)
    layer = [n.removeprefix("blk.1.") for n in tensors if n.startswith("blk.1.")]
    has = dict(model.named_parameters())
    minitf_of = {n: w.minitf for w in table.layer for n in w.gguf}
    # a bias is written where the model has it, or where the architecture always has one (zeros)
    expected = [n for n in table.gguf_layer_order if f"blocks.1.{minitf_of[n]}" in has or table.zero_biases]
    assert layer == expected  # a layer's tensors, all of them, in the table's order
    assert set(table.gguf_layer_order) == {n for w in table.layer for n in w.gguf}
    model_level = [n for n in tensors if not n.startswith("blk.")]
    listed = [n for w in table.embeddings + table.final for n in w.gguf]
    head_written = not model.config.tie_embeddings or table.gguf_tied_head
    assert model_level == [n for n in listed if n != "output.weight" or head_written]
    assert list(tensors)[: len(table.embeddings)] == [w.gguf[0] for w in table.embeddings]  # the embeddings first
    assert torch.equal(tensors["token_embd.weight"], model.wte.weight.detach()[:V])


def test_gguf_names_are_llama_cpp_names():
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
    import gguf as package

    for table in weights.TABLES.values():
        known = {package.TENSOR_NAMES[t] for t in package.MODEL_TENSORS[package.MODEL_ARCH[table.gguf_arch]]}
        names = [n for w in table.embeddings + table.final for n in w.gguf]
        names += ["blk.{bid}." + n for w in table.layer for n in w.gguf]
        assert {n.removesuffix(".weight").removesuffix(".bias") for n in names} <= known, table.gguf_arch


def test_the_layouts_between_hf_and_gguf():
    """The same minitf tensor, laid out for each file as the table says."""
    gpt2 = random_model(positions="learned")
    hf, gg = hf_tensors.hf_state(gpt2, "gpt2"), gguf._tensors(gpt2, "gpt2")
    c_attn = gpt2.blocks[0].attn.c_attn.weight.detach()
    assert torch.equal(hf["transformer.h.0.attn.c_attn.weight"], c_attn.t())  # Conv1D: (in, out)
    assert torch.equal(gg["blk.0.attn_qkv.weight"], c_attn)  # llama.cpp: as nn.Linear keeps it

    llama = random_model(**LLAMA, bias=True, n_kv_head=2)
    hf, gg = hf_tensors.hf_state(llama, "llama"), gguf._tensors(llama, "llama")
    k = hf["model.layers.1.self_attn.k_proj.bias"]
    assert torch.equal(k, llama.blocks[1].attn.c_attn.bias.detach()[32:48])  # q's 32 rows, then k's 2 heads of 8
    assert torch.equal(gg["blk.1.attn_k.bias"], rope_pairs_to_interleaved(k, 2))
    assert torch.equal(gg["blk.1.attn_k.bias"][:4], k[[0, 4, 1, 5]])  # llama.cpp's consecutive rotary pairs
    qwen3 = random_model(**LLAMA, qk_norm=True, bias=False)
    hf, gg = hf_tensors.hf_state(qwen3, "qwen3"), gguf._tensors(qwen3, "qwen3")
    assert torch.equal(hf["model.layers.0.self_attn.k_proj.weight"], gg["blk.0.attn_k.weight"])  # halves, as minitf
    gains = qwen3.blocks[0].attn.q_norm.weight.detach()  # learned, as a trained Qwen3's
    assert torch.equal(gg["blk.0.attn_q_norm.weight"], gains) and torch.equal(
        hf["model.layers.0.self_attn.q_norm.weight"], gains
    )
    phi3 = random_model(**LLAMA, bias=False, family="phi3")
    hf = hf_tensors.hf_state(phi3, "phi3")
    assert torch.equal(hf["model.layers.0.self_attn.qkv_proj.weight"], phi3.blocks[0].attn.c_attn.weight.detach())
    assert torch.equal(hf["model.layers.0.mlp.gate_up_proj.weight"], phi3.blocks[0].mlp.c_fc.weight.detach())
    qwen2 = random_model(**LLAMA, bias=False, qkv_bias=True)
    hf = hf_tensors.hf_state(qwen2, "qwen2")
    assert torch.equal(hf["model.layers.0.self_attn.v_proj.bias"], qwen2.blocks[0].attn.c_attn.bias.detach()[64:])
    assert not any(n.endswith(("o_proj.bias", "mlp.down_proj.bias")) for n in hf)

    neox = random_model(bias=False)
    hf = hf_tensors.hf_state(neox, "gptneox")
    qkv = hf["gpt_neox.layers.0.attention.query_key_value.weight"]
    minitf_rows = neox.blocks[0].attn.c_attn.weight.detach()
    assert torch.equal(qkv[8:16], minitf_rows[32:40])  # head 0's k follows head 0's q
    assert torch.equal(hf["gpt_neox.layers.0.attention.query_key_value.bias"], torch.zeros(96))  # zero biases


@pytest.mark.parametrize("rows", [128, 160], ids=["a-multiple-of-64", "more-rows-in-the-file"])
def test_an_embedding_already_in_minitfs_rows_is_used_as_read(rows):
    """An imported embedding whose rows are minitf's already (a Llama 3's 128,256 are 64 x 2,004) is
    the tensor as read, in its dtype: no second copy of 0.5 GB while loading. Otherwise one padded
    copy of the tokenizer's rows, the padding zero."""
    from minitf.export.layouts import VOCAB_ROWS

    read = torch.randn(rows, 16).to(torch.bfloat16)
    cfg = ModelConfig(vocab_size=128, block_size=8, n_layer=1, n_head=2, n_embd=16)
    joined = VOCAB_ROWS.join([read], ("embed",), cfg, torch.bfloat16)
    assert (joined is read) == (rows == 128) and torch.equal(joined, read[:128])
    small = dataclasses.replace(cfg, vocab_size=V)  # 100 rows padded to 128
    padded = VOCAB_ROWS.join([read], ("embed",), small, torch.bfloat16)
    assert padded.shape == (128, 16) and torch.equal(padded[:V], read[:V]) and not padded[V:].any()
    as_float = VOCAB_ROWS.join([read], ("embed",), cfg)  # float32 unless the frozen dtype is the file's
    assert as_float is not read and as_float.dtype == torch.float32 and torch.equal(as_float, read[:128].float())


def toy_table() -> weights.Table:
    """A format no one has: Llama's tensors under other names, and without rotary pairs in GGUF."""

    def renamed(w: weights.Weight) -> weights.Weight:
        return dataclasses.replace(
            w,
            hf=tuple(n.replace("self_attn.", "attention.").replace("_proj", "") for n in w.hf),
            gguf=tuple("toy_" + n for n in w.gguf),
            gguf_layout=w.hf_layout,
        )

    llama = weights.TABLES["llama"]
    return dataclasses.replace(
        llama,
        model_type="toy",
        hf_prefix="toy.",
        hf_layer="block{i}.",
        layer=tuple(renamed(w) for w in llama.layer),
        gguf_layer_order=tuple("toy_" + n for n in reversed(llama.gguf_layer_order)),
    )


def test_an_extra_table_is_read_by_every_reader(monkeypatch):
    monkeypatch.setitem(weights.TABLES, "toy", toy_table())
    model = random_model(**LLAMA, bias=True, n_kv_head=2)
    state = hf_tensors.hf_state(model, "toy")
    assert "toy.block1.attention.k.bias" in state and "toy.block1.mlp.gate.weight" in state
    assert torch.equal(state["toy.block1.attention.k.bias"], model.blocks[1].attn.c_attn.bias.detach()[32:48])
    back = hf_tensors.minitf_weights(state, model.config, "toy", {"attention_bias": True, "mlp_bias": True}, "test")
    assert uncovered(model, back) == []
    tensors = gguf._tensors(model, "toy")
    layer = [n.removeprefix("blk.0.") for n in tensors if n.startswith("blk.0.")]
    assert layer[:3] == ["toy_ffn_down.bias", "toy_ffn_up.bias", "toy_ffn_gate.bias"]  # the toy's order
    k = tensors["blk.0.toy_attn_k.weight"]
    assert torch.equal(k, model.blocks[0].attn.c_attn.weight.detach()[32:48])  # not permuted: the toy's layout


def test_a_table_that_forgets_a_weight_fails_the_round_trip(monkeypatch):
    """What the round-trip test would report for a table that leaves out one of minitf's weights."""
    llama = weights.TABLES["llama"]
    forgetful = dataclasses.replace(llama, layer=tuple(w for w in llama.layer if w.minitf != "ln_2.weight"))
    monkeypatch.setitem(weights.TABLES, "llama", forgetful)
    model = random_model(**LLAMA, bias=False)
    assert uncovered(model, round_trip(model, "llama")[1]) == ["blocks.0.ln_2.weight", "blocks.1.ln_2.weight"]


def test_the_readers_name_no_format():
    """Tensor names and layouts are the tables' only: the readers hold no branch on the format."""
    for name in ("hf.py", "hf_tensors.py", "gguf.py"):
        text = (ROOT / "minitf" / "export" / name).read_text(encoding="utf-8")
        assert not re.findall(r"\bfmt\s*(==|!=|in\b)", text), name
        assert "_proj" not in text and "attn_q" not in text and "c_attn" not in text, name
