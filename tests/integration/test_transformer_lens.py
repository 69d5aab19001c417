"""TransformerLens interop (the lens extra): a minitf model exported to Hugging Face loads into
TransformerLens's TransformerBridge with minitf's logits, and TransformerLens's head detector
gives minitf.interpret's head scores. Skipped, with the reason, where transformer_lens is not installed."""

import numpy as np
import pytest
import torch

import minitf
from minitf.export.hf import to_hf
from minitf.interpret import head_scores, memory

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


# minitf.interpret's head scores on hand-built heads whose patterns are known, and against
# TransformerLens's head_detector definitions written out as that file writes them.


def transformer_lens_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three detection patterns as transformer_lens/head_detector.py computes them (numpy, roll, cat)."""
    n = tokens.shape[-1]
    previous = torch.zeros(n, n)
    previous[1:, :-1] = torch.eye(n - 1)
    token_pattern = tokens.repeat(n, 1).numpy()
    eq_mask = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq_mask, 0)
    duplicate = torch.tril(torch.as_tensor(eq_mask).float())
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    induction = torch.tril(torch.cat((torch.zeros(n, 1), shifted[:, 1:]), dim=1))
    return {"previous_token": torch.tril(previous), "duplicate_token": duplicate, "induction": induction}


def test_scores_of_a_random_model_on_text_follow_transformer_lens_head_detector():
    torch.manual_seed(0)
    cfg = minitf.ModelConfig(vocab_size=40, block_size=32, n_layer=2, n_head=3, n_embd=24)
    model = minitf.Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    # a text with repeats at several distances, as a tokenizer would give: one sequence, (T,)
    ids = torch.tensor([3, 7, 7, 9, 3, 7, 12, 9, 3, 3, 21, 7, 12, 5])
    s = head_scores(model, ids)
    ins_weights = []
    with torch.no_grad():
        x = model.wte(ids[None])  # (1, T, C); rope adds no position vector
        for blk in model.blocks:
            ins_weights.append(blk.attn.steps(blk.ln_1(x), model.rope)["weights"][0])  # (H, T, T)
            x = x + blk.attn(blk.ln_1(x), rope=model.rope)
            x = x + blk.mlp(blk.ln_2(x))
    for name, pattern in transformer_lens_patterns(ids).items():
        want = torch.tensor([[float((w[h] * pattern).sum() / w[h].sum()) for h in range(3)] for w in ins_weights])
        torch.testing.assert_close(s[name], want, atol=1e-6, rtol=0, msg=name)
    # a batch is the mean of its sequences' scores
    batch = torch.stack([ids, ids.flip(0)])
    both = head_scores(model, batch)
    torch.testing.assert_close(both["induction"], (s["induction"] + head_scores(model, ids.flip(0))["induction"]) / 2)
    # a batch too big for one pass's weights goes in chunks, with the same scores
    one = memory.pass_bytes(model, ids.numel()) + 15 * ids.numel() ** 2  # a budget of one sequence a pass
    for name, v in head_scores(model, batch, budget=one).items():
        torch.testing.assert_close(v, both[name], atol=1e-6, rtol=0)
