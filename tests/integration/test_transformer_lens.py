"""TransformerLens interop (the lens extra): a minitf model exported to Hugging Face loads into
TransformerLens's TransformerBridge with minitf's logits, and TransformerLens's head detector
gives minitf.interpret's head scores. Skipped, with the reason, where transformer_lens is not installed."""

import pytest
import torch

import minitf
from minitf.export.hf import to_hf
from minitf.interpret import head_scores

lens = pytest.importorskip("transformer_lens", reason="transformer_lens is not installed (pip install -e '.[lens]')")

TEXT = "the cat sat on the mat. the cat sat on the mat."
# each standard architecture minitf exports, and the minitf settings that export as it
FORMATS = {
    "gpt2": dict(positions="learned"),
    "gptneox": dict(),  # the default: rope, LayerNorm, tanh GELU, sequential sub-layers
    "llama": dict(norm="rmsnorm", ffn="swiglu", n_kv_head=2),
    "qwen3": dict(norm="rmsnorm", ffn="swiglu", qk_norm=True, bias=False),
}


@pytest.fixture(scope="module")
def tok():
    return minitf.Tokenizer.train(["ROMEO: O love, sweet night! The cat sat on the mat."] * 20, vocab_size=300)


def exported(tok, tmp_path, monkeypatch, **kw):
    """A small minitf model with every parameter moved off its init, its Hugging Face export, and
    TransformerLens's bridge over that directory (no download: everything is local)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=4, n_embd=32, **kw)
    model = minitf.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    out, fmt = to_hf(model, tok, tmp_path / "hf")
    bridge = TransformerBridge.boot_transformers(str(out), tokenizer=AutoTokenizer.from_pretrained(out), device="cpu")
    return model, fmt, bridge


@pytest.mark.parametrize("fmt", FORMATS)
def test_transformer_lens_computes_minitfs_logits(tok, tmp_path, monkeypatch, fmt):
    model, written, bridge = exported(tok, tmp_path, monkeypatch, **FORMATS[fmt])
    assert written == fmt
    ids = torch.tensor([tok.encode(TEXT)])  # (1, T)
    with torch.no_grad():
        ours, _ = model(ids)  # (1, T, V)
        theirs = bridge(ids)  # (1, T, V)
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max() < 1e-4 and ours.std() > 0.5
    # HookedTransformer's numerics (folded norms, centred weights): the unembedding is centred, so
    # every logit of a position moves by the same amount; the distribution stays minitf's
    bridge.enable_compatibility_mode()
    with torch.no_grad():
        folded = bridge(ids)
    assert (ours.log_softmax(-1) - folded.log_softmax(-1)).abs().max() < 1e-4


def test_transformer_lens_head_detector_gives_minitfs_head_scores(tok, tmp_path, monkeypatch):
    from transformer_lens.head_detector import detect_head

    model, _, bridge = exported(tok, tmp_path, monkeypatch)
    assert bridge.to_tokens(TEXT)[0].tolist() == tok.encode(TEXT)  # no BOS prepended: the same ids
    ours = head_scores(model, tok.encode(TEXT))
    for name in ("previous_token", "duplicate_token", "induction"):
        theirs = detect_head(bridge, TEXT, f"{name}_head")
        torch.testing.assert_close(ours[name], theirs.float(), atol=1e-5, rtol=0, msg=name)
