"""minitf.inspect: the textbook steps of every head, which added back up give the model's own logits."""

import itertools
import math

import matplotlib.image as mpimg
import pytest
import torch

import minitf
from minitf.attention import attention
from minitf.inspection import check_layer_head, format_weights, logit_lens, token_label
from minitf.plots.figures import plot_attention
from tests.support.models import gqa_model as model

TEXT = "ROMEO: O love, sweet night! The cat sat on the mat."


@pytest.fixture(scope="module")
def tok():
    return minitf.Tokenizer.train([TEXT * 3, "JULIET: O gentle day, fair heaven."] * 10, vocab_size=290)


def random_model(tok, **kw) -> minitf.Transformer:
    """A tiny model whose every parameter (biases and norm weights too) is far from its init value,
    so a piece left out or mixed up in the recombination shows in the logits."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=16)
    model = minitf.Transformer(minitf.ModelConfig(**{**cfg, **kw}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.mark.parametrize(
    "positions, norm, ffn",
    list(itertools.product(["learned", "sinusoidal", "rope"], ["layernorm", "rmsnorm"], ["gelu", "swiglu"])),
)
def test_pieces_recombine_into_the_models_logits(tok, positions, norm, ffn):
    model = random_model(tok, positions=positions, norm=norm, ffn=ffn)
    ins = minitf.inspect(model, tok, TEXT)
    ids = torch.tensor([tok.encode(TEXT)])
    T, H, D = ids.size(1), 2, 8
    assert ins.ids == ids[0].tolist() and "".join(ins.tokens) == TEXT and ins.n_layer == 2 and ins.n_head == H

    with torch.no_grad():
        x = model.wte(ids)[0]  # (T, C)
        if positions != "rope":
            x = x + model.wpe(T)
        torch.testing.assert_close(ins.embeddings, x)
        for block, s in zip(model.blocks, ins.layers):
            # Q, K, V from this block's input, split into heads; rope rotates Q and K
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(16, dim=-1)  # 3 x (T, C)
            q, k, v = (t.view(T, H, D).transpose(0, 1) for t in (q, k, v))  # (H, T, D)
            if positions == "rope":
                assert not torch.allclose(q, s.q)  # really rotated, not the raw projection
                q, k = model.rope(q), model.rope(k)
            for mine, theirs in ((q, s.q), (k, s.k), (v, s.v)):
                torch.testing.assert_close(theirs, mine, atol=1e-5, rtol=1e-5)
            # the textbook steps, each from the previous one
            torch.testing.assert_close(s.scores, s.q @ s.k.transpose(-2, -1))
            torch.testing.assert_close(s.scaled, s.scores / math.sqrt(D))
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            assert torch.isneginf(s.masked[:, future]).all()
            torch.testing.assert_close(s.masked[:, ~future], s.scaled[:, ~future])
            torch.testing.assert_close(s.weights, torch.softmax(s.masked, dim=-1))
            torch.testing.assert_close(s.weights.sum(-1), torch.ones(H, T))
            torch.testing.assert_close(s.heads, s.weights @ s.v)
            out, w = attention(s.q, s.k, s.v, causal=True)  # the reference path agrees
            torch.testing.assert_close(w, s.weights)
            torch.testing.assert_close(out, s.heads)
            # heads side by side through c_proj, then the FFN: the residual stream
            torch.testing.assert_close(s.attn_out, block.attn.c_proj(s.heads.transpose(0, 1).reshape(T, 16)))
            x = x + s.attn_out
            torch.testing.assert_close(s.ffn_out, block.mlp(block.ln_2(x)), atol=1e-5, rtol=1e-5)
            x = x + s.ffn_out
        logits = model.lm_head(model.ln_f(x))[:, : tok.vocab_size]  # (T, V)
        expected = model(ids)[0][0]  # the model's own forward (fused SDPA attention)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ins.logits, expected, atol=1e-4, rtol=1e-4)
    assert (logits - expected).abs().max() < 1e-4 and expected.std() > 0.1  # not trivially equal


@pytest.mark.parametrize(
    "options", [dict(qk_norm=True, positions="rope"), dict(ffn="relu2"), dict(logit_softcap=3.0, tie_embeddings=False)]
)
def test_pieces_recombine_with_options(tok, options):
    model = random_model(tok, **options)
    if options.get("qk_norm"):  # the gains at their initial one, so the norm's own work shows below
        for block in model.blocks:
            torch.nn.init.ones_(block.attn.q_norm.weight), torch.nn.init.ones_(block.attn.k_norm.weight)
    ins = minitf.inspect(model, tok, TEXT)
    ids = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        x = model.wte(ids)[0] + (model.wpe(ids.size(1)) if model.wpe is not None else 0)  # (T, C)
        for block, s in zip(model.blocks, ins.layers):
            if options.get("qk_norm"):  # each head's q and k rows have unit RMS (before rope, which keeps norms)
                torch.testing.assert_close(s.q.pow(2).mean(-1), torch.ones(2, ids.size(1)), atol=1e-4, rtol=0)
                torch.testing.assert_close(s.k.pow(2).mean(-1), torch.ones(2, ids.size(1)), atol=1e-4, rtol=0)
            torch.testing.assert_close(s.weights, torch.softmax(s.masked, dim=-1))
            torch.testing.assert_close(s.attn_out, block.attn.c_proj(s.heads.transpose(0, 1).reshape(-1, 16)))
            x = x + s.attn_out
            x = x + s.ffn_out
        logits = model.lm_head(model.ln_f(x))[:, : tok.vocab_size]  # (T, V)
        if options.get("logit_softcap"):
            logits = 3.0 * torch.tanh(logits / 3.0)
        expected = model(ids)[0][0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ins.logits, expected, atol=1e-4, rtol=1e-4)
    assert expected.std() > 0.1


def test_trained_run_and_training_mode_is_restored(tiny_run):
    model, tok, cfg = minitf.load_run(tiny_run)
    model.train()
    ins = minitf.inspect(model, tok, "ROMEO: O love")
    assert model.training  # put back as it was
    s = ins.layers[-1]
    T = len(ins.ids)
    assert s.weights.shape == (cfg.model.n_head, T, T) and s.q.shape == (cfg.model.n_head, T, cfg.model.head_size)
    assert s.weights.triu(1).abs().max() == 0 and s.weights[:, 0, 0].tolist() == [1.0] * cfg.model.n_head
    torch.testing.assert_close(ins.logits, model.eval()(torch.tensor([ins.ids]))[0][0], atol=1e-4, rtol=1e-4)


def test_bad_text_and_indices(tok):
    model = random_model(tok, block_size=8)
    with pytest.raises(minitf.MinitfError, match="text to inspect is empty"):
        minitf.inspect(model, tok, "")
    with pytest.raises(minitf.MinitfError, match="at most block_size=8; shorten"):
        minitf.inspect(model, tok, TEXT)
    ins = minitf.inspect(model, tok, "ROMEO")
    bad = rf"inspect's input holds ids outside 0..{tok.vocab_size - 1} \(min 1, max {tok.vocab_size}\)"
    with pytest.raises(minitf.MinitfError, match=bad):
        minitf.inspect(model, tok, [1, tok.vocab_size])
    assert check_layer_head(ins, -1, -2) == (1, 0) and check_layer_head(ins, 0, None) == (0, None)
    with pytest.raises(
        minitf.MinitfError,
        match=r"layer 2 is out of range: the model has 2 layers, "
        r"pass --layer 0..1",
    ):
        check_layer_head(ins, 2, 0)
    with pytest.raises(minitf.MinitfError, match=r"head -3 is out of range: .* pass --head 0..1"):
        check_layer_head(ins, 0, -3)


def test_print_table_holds_the_weights(tok):
    ins = minitf.inspect(random_model(tok), tok, "The cat sat on the mat")
    table = format_weights(ins, 1, 1).splitlines()
    assert table[0].startswith("layer 1, head 1: attention weights")
    assert table[1].split() == [token_label(t) for t in ins.tokens]
    assert table[1].split() == ["The", "␣cat", "␣sat", "␣on", "␣the", "␣mat"]
    w = ins.layers[1].weights[1]
    for i, line in enumerate(table[2:]):
        label, *cells = line.split()
        assert label == token_label(ins.tokens[i]) and len(cells) == i + 1  # blank above the diagonal
        assert [float(c) for c in cells] == pytest.approx(w[i, : i + 1].tolist(), abs=0.005)
    assert token_label("\n \t") == "↵␣→" and token_label("abcdefghij", 8) == "abcdefg…"


@pytest.mark.parametrize("text_tokens, head", [(1, 0), (6, None), (200, 1)])
def test_heatmap_png(tok, tmp_path, text_tokens, head):
    model = random_model(tok, block_size=256)
    ids = (tok.encode(TEXT) * 50)[:text_tokens]
    ins = minitf.inspect(model, tok, tok.decode(ids))
    assert len(ins.ids) == text_tokens
    out = plot_attention(ins, tmp_path / "attn.png", layer=-1, head=head)
    img = mpimg.imread(out)  # (height, width, 4) floats
    assert img.shape[0] > 300 and img.shape[1] > 300
    grey = (abs(img[..., :3] - 230 / 255) < 0.01).all(-1).mean()  # the masked (future) triangle
    assert (grey > 0.05) == (text_tokens > 1)  # one token has no future to mask
    assert img[..., :3].std() > 0.1  # a picture, not a blank canvas


def test_ids_inspect_exactly_those_tokens(tok):
    model = random_model(tok)
    ids = tok.encode("ROMEO: O") + [tok.encode(" love")[0], tok.eot_id]  # as a sampler could produce them
    ins = minitf.inspect(model, tok, ids)
    assert ins.ids == ids and ins.tokens == [tok.decode([i]) for i in ids]
    torch.testing.assert_close(ins.logits, model(torch.tensor([ids]))[0][0], atol=1e-4, rtol=1e-4)
    text = minitf.inspect(model, tok, "ROMEO: O")
    torch.testing.assert_close(
        text.layers[1].weights, minitf.inspect(model, tok, tok.encode("ROMEO: O")).layers[1].weights
    )


@pytest.mark.parametrize("options", [{}, {"positions": "rope", "norm": "rmsnorm"}, {"logit_softcap": 5.0}])
def test_logit_lens_reads_the_residual_stream_and_ends_on_the_logits(tok, options):
    model = random_model(tok, **options)
    ins = minitf.inspect(model, tok, TEXT)
    lens = logit_lens(model, ins)
    assert lens.shape == (ins.n_layer + 1, len(ins.ids), tok.vocab_size) and ins.residuals.shape[0] == ins.n_layer + 1
    with torch.no_grad():
        logits = model(torch.tensor([ins.ids]))[0][0]  # (T, V)
        x = ins.embeddings
        torch.testing.assert_close(ins.residuals[0], x, atol=0, rtol=0)
        for i, s in enumerate(ins.layers):  # each point of the stream is the pieces summed so far
            x = x + s.attn_out + s.ffn_out
            torch.testing.assert_close(ins.residuals[i + 1], x, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(lens[i + 1], model.logits(x[None])[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lens[0], model.logits(ins.embeddings[None])[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lens[-1], ins.logits, atol=1e-5, rtol=1e-5)  # the last layer's lens: the logits
    torch.testing.assert_close(lens[-1], logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(lens[0], lens[-1], atol=1e-2)  # the layers do change the prediction


def test_inspect_and_interprets_trace_run_the_same_blocks(tok):
    """run_blocks is the one loop with every step kept: inspect's one sequence is trace's batch of one."""
    from minitf.interpret.trace import trace

    model = random_model(tok, positions="rope", n_kv_head=1).eval()
    ids = tok.encode(TEXT)[:20]
    ins = minitf.inspect(model, tok, ids)
    t = trace(model, torch.tensor([ids]))
    for i, layer in enumerate(ins.layers):
        assert torch.equal(layer.weights, t.weights[i][0]) and torch.equal(layer.heads, t.heads[i][0])
        assert torch.equal(layer.attn_out, t.attn_out[i][0]) and torch.equal(layer.ffn_out, t.ffn_out[i][0])
    assert torch.equal(ins.residuals, torch.stack(t.residuals)[:, 0]) and torch.equal(ins.logits, t.logits[0])


# Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
# values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged.


def test_inspect_gives_each_query_head_its_groups_keys_and_values():
    tok = minitf.Tokenizer.train(["the cat sat on the mat " * 20], vocab_size=300)
    m = model(vocab_size=tok.vocab_size, n_kv_head=2)
    ins = minitf.inspect(m, tok, "the cat sat")
    s = ins.layers[0]
    assert ins.n_head == 4 and s.k.shape == s.v.shape == s.q.shape
    assert torch.equal(s.k[0], s.k[1]) and torch.equal(s.v[2], s.v[3]) and not torch.equal(s.k[1], s.k[2])
    with torch.no_grad():
        torch.testing.assert_close(ins.logits, m(torch.tensor([tok.encode("the cat sat")]))[0][0], atol=1e-5, rtol=0)
