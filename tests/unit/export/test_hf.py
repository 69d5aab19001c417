"""minitf.export.hf without transformers: the GPT-2 export refuses, in one line, what GPT-2 cannot express."""

import pytest

import minitf
from minitf.export.hf import to_hf_gpt2

# Hugging Face GPT-2 interop (the hf extra): the same logits, tokens and greedy text both ways.
#
# The tests that need transformers skip, with the reason, where it is not installed; the refusals
# of settings GPT-2 cannot express run everywhere (they are checked before transformers is imported).


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "positions=rope",
            r"\(model.positions=rope blocks it\); the nearest exportable setting is model.positions=learned",
        ),
        ("norm=rmsnorm", r"\(model.norm=rmsnorm blocks it\)"),
        ("ffn=swiglu", r"\(model.ffn=swiglu blocks it\)"),
        ("gelu=exact", r"\(model.gelu=exact blocks it\); the nearest exportable setting is model.gelu=tanh \(GPT-2\)"),
        ("ffn=relu2", r"\(model.ffn=relu2 blocks it\)"),
        ("qk_norm=true", r"\(model.qk_norm=true blocks it\)"),
        ("logit_softcap=15", r"\(model.logit_softcap=15.0 blocks it\)"),
        ("n_kv_head=1", r"\(model.n_kv_head=1 blocks it\)"),
    ],
)
def test_export_refuses_what_gpt2_cannot_express(tmp_path, setting, message):
    """to_hf_gpt2 accepts exactly what minitf.export.architecture calls GPT-2, and refuses the rest in its words."""
    cfg = minitf.load_config(
        None,
        [
            "model.vocab_size=300",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.block_size=16",
            "model.positions=learned",
            f"model.{setting}",
        ],
    ).model
    tok = minitf.Tokenizer.train(["some text"], vocab_size=300)
    with pytest.raises(minitf.MinitfError, match=message):
        to_hf_gpt2(minitf.Transformer(cfg), tok, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
