"""The Transformer: shapes, padding, init, causality for every variant, and that it learns."""

import itertools
import math

import pytest
import torch

import minitf
import minitf.system.files
from minitf.system.sizes import padded_vocab, swiglu_hidden
from tests.support.models import GQA_IDS as IDS
from tests.support.models import gqa_model as model

VARIANTS = list(
    itertools.product(
        ["learned", "sinusoidal", "rope"], ["sdpa", "reference"], ["layernorm", "rmsnorm"], ["gelu", "swiglu"]
    )
)


def tiny(**kw):
    base = dict(vocab_size=100, block_size=32, n_layer=2, n_head=2, n_embd=32)
    return minitf.ModelConfig(**{**base, **kw})


def test_forward_shapes_loss_and_padding():
    torch.manual_seed(0)
    m = minitf.Transformer(tiny())
    assert m.wte.weight.shape == (128, 32)  # 100 padded to a multiple of 64
    assert torch.all(m.wte.weight[100:] == 0)
    assert m.lm_head.weight is m.wte.weight  # tied
    idx = torch.randint(0, 100, (3, 20))
    logits, loss = m(idx)
    assert logits.shape == (3, 20, 100) and loss is None  # padded ids are never predicted
    targets = idx.clone()
    targets[:, :5] = -100
    _, loss = m(idx, targets)
    ref = torch.nn.functional.cross_entropy(logits[:, 5:].reshape(-1, 100), idx[:, 5:].reshape(-1))
    torch.testing.assert_close(loss, ref)
    assert abs(loss.item() - math.log(100)) < 0.6  # small init: near uniform


@pytest.mark.parametrize("tie", [True, False])
def test_the_fused_head_loss_is_the_plain_one(tie):
    """model(x, y, logits=False) (what training calls) gives the loss and every gradient of the plain
    path, logits then cross_entropy, up to float rounding: ignored targets (-100), a vocabulary that
    is padded (100 of 128 rows), more rows than one chunk (lm_loss.CHUNK_ROWS), a tied or own head."""
    torch.manual_seed(0)
    m = minitf.Transformer(tiny(tie_embeddings=tie))
    if not tie:
        torch.nn.init.normal_(m.lm_head.weight, 0.0, 0.02)  # a zero head would make its gradient trivial
    idx = torch.randint(0, 100, (12, 33))  # 12 x 32 = 384 rows: a chunk and a half
    targets = idx[:, 1:].clone()
    targets[0, :7] = -100
    grads = []
    for fused in (False, True):
        m.zero_grad()
        logits, loss = m(idx[:, :-1], targets, logits=not fused)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
        assert (logits is None) == fused
    (plain, g_plain), (fused, g_fused) = grads
    torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-6)
    assert g_plain.keys() == g_fused.keys()
    for name in g_plain:
        torch.testing.assert_close(g_fused[name], g_plain[name], atol=1e-7, rtol=1e-4, msg=name)
    with torch.no_grad():  # no backward to come: the plain path, and still no logits
        logits, loss = m(idx[:, :-1], targets, logits=False)
    assert logits is None and torch.equal(loss, plain)


def test_under_autocast_a_large_vocabulary_takes_the_fused_head_a_small_one_the_plain():
    """A downloaded model's vocabulary (LARGE_VOCAB and up) under a bfloat16 autocast: training's
    loss is the fused head's, with the plain path's loss and gradients up to bfloat16's rounding; the
    default recipe's 4,096 tokens keep the plain path under autocast, and float32 the fused one."""
    from minitf.fast.lm_loss import LARGE_VOCAB

    torch.manual_seed(0)
    m = minitf.Transformer(tiny(vocab_size=LARGE_VOCAB + 7))
    idx = torch.randint(0, LARGE_VOCAB + 7, (4, 33))
    x = torch.zeros(1, 1, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m.fused_loss_applies(x) and not minitf.Transformer(tiny()).fused_loss_applies(x)
        runs = []
        for fused in (False, True):
            m.zero_grad()
            logits, loss = m(idx[:, :-1], idx[:, 1:], logits=not fused)
            assert (logits is None) == fused
            loss.backward()
            runs.append((loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert minitf.Transformer(tiny()).fused_loss_applies(x)  # float32: fused at any vocabulary
    (plain, g_plain), (fused, g_fused) = runs
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    for name in g_plain:
        assert (g_fused[name] - g_plain[name]).norm() <= 1e-2 * g_plain[name].norm(), name


def test_evaluating_a_large_vocabulary_never_holds_its_logits_whole(monkeypatch):
    """The loss alone with no gradient (evaluation, logits=False) from the head's chunks for a
    large vocabulary: the plain path's loss, and no (B, T, V) tensor of logits made on the way."""
    from minitf.fast import lm_loss

    torch.manual_seed(0)
    m = minitf.Transformer(tiny(vocab_size=lm_loss.LARGE_VOCAB + 7)).eval()
    idx = torch.randint(0, lm_loss.LARGE_VOCAB + 7, (2, 33))  # 2 x 32 rows: under one CPU chunk of 256
    monkeypatch.setattr(lm_loss, "chunk_rows", lambda device, vocab: 16)
    widest = []
    real_ce = lm_loss.F.cross_entropy
    monkeypatch.setattr(
        lm_loss.F, "cross_entropy", lambda lg, *a, **k: widest.append(lg.shape[0]) or real_ce(lg, *a, **k)
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, chunked = m(idx[:, :-1], idx[:, 1:], logits=False)
        monkeypatch.undo()
        _, plain = m(idx[:, :-1], idx[:, 1:])
    assert widest == [16, 16, 16, 16]  # 64 rows in chunks of 16, never all at once
    torch.testing.assert_close(chunked, plain, atol=1e-5, rtol=1e-5)
    assert not minitf.Transformer(tiny()).chunked_loss_applies(idx)  # 100 tokens: the plain path, as ever


def test_num_params_and_sizes():
    m = minitf.Transformer(tiny(positions="learned"))
    total = sum(p.numel() for p in m.parameters())
    assert m.num_params(non_embedding=False) == total
    assert m.num_params() == total - 32 * 32  # learned positions not counted
    rope = minitf.Transformer(tiny())  # the default: rotary positions, which have no parameters
    assert rope.num_params() == rope.num_params(non_embedding=False) == total - 32 * 32
    # hand count: wte 128*32; per block: 2 LN (2*64) + qkv (32*96+96) + proj (32*32+32)
    #   + fc (32*128+128) + proj (128*32+32); final LN 64
    per_block = 2 * 64 + 32 * 96 + 96 + 32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32
    assert total == 128 * 32 + 32 * 32 + 2 * per_block + 64
    assert padded_vocab(64) == 64 and padded_vocab(65) == 128
    assert swiglu_hidden(256) == 704 and swiglu_hidden(768) == 2048


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    m = minitf.Transformer(tiny(n_layer=8, n_embd=256, n_head=4))
    std_proj = m.blocks[0].attn.c_proj.weight.std().item()
    std_fc = m.blocks[0].mlp.c_fc.weight.std().item()
    assert abs(std_fc - 0.02) < 0.001
    assert abs(std_proj - 0.02 / math.sqrt(16)) < 0.0005
    assert torch.all(m.blocks[0].attn.c_attn.bias == 0)


def test_too_long_input_is_a_clear_error():
    m = minitf.Transformer(tiny())
    with pytest.raises(ValueError, match="exceeds block_size 32"):
        m(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(minitf.ConfigError, match="vocab_size is not set"):
        minitf.Transformer(minitf.ModelConfig())


@pytest.mark.parametrize("positions, attention, norm, ffn", VARIANTS)
def test_causality(positions, attention, norm, ffn):
    torch.manual_seed(0)
    m = minitf.Transformer(tiny(positions=positions, attention=attention, norm=norm, ffn=ffn, bias=False)).eval()
    a = torch.randint(0, 100, (2, 24))
    b = a.clone()
    t = 11
    b[:, t + 1 :] = torch.randint(0, 100, (2, 24 - t - 1))
    la, _ = m(a)
    lb, _ = m(b)
    torch.testing.assert_close(la[:, : t + 1], lb[:, : t + 1], atol=1e-5, rtol=1e-5)
    assert (la[:, t + 1 :] - lb[:, t + 1 :]).abs().max() > 1e-3  # the future did change


# the options from modded-nanogpt's speedruns, one at a time and all together
OPTIONS = [
    dict(qk_norm=True),
    dict(ffn="relu2"),
    dict(logit_softcap=15.0),
    dict(tie_embeddings=False),
    dict(qk_norm=True, ffn="relu2", logit_softcap=15.0, tie_embeddings=False, positions="rope", norm="rmsnorm"),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_causality_with_options(options):
    torch.manual_seed(0)
    m = minitf.Transformer(tiny(**options)).eval()
    with torch.no_grad():  # the untied head starts at zero: every logit would be equal
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    a = torch.randint(0, 100, (2, 24))
    b = a.clone()
    b[:, 12:] = torch.randint(0, 100, (2, 12))
    la, lb = m(a)[0], m(b)[0]
    torch.testing.assert_close(la[:, :12], lb[:, :12], atol=1e-5, rtol=1e-5)
    assert (la[:, 12:] - lb[:, 12:]).abs().max() > 1e-3


def test_option_worked_values():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    assert minitf.model.ReLU2()(x).tolist() == [0.0, 0.0, 0.0, 0.25, 9.0]
    m = minitf.Transformer(tiny(logit_softcap=2.0, tie_embeddings=False)).eval()
    assert m.lm_head.weight.abs().max() == 0 and m.wte.weight.abs().max() > 0  # untied head starts at zero
    assert m(torch.tensor([[1, 2, 3]]))[0].abs().max() == 0  # ... so every token starts equally likely
    with torch.no_grad():
        m.lm_head.weight.fill_(0.0)
        m.lm_head.weight[7] = 100.0  # a huge logit for token 7 ...
    logits = m(torch.tensor([[1, 2, 3]]))[0]
    assert logits.max() <= 2.0 and logits.min() >= -2.0  # ... is capped at 2 * tanh(.) < 2
    torch.manual_seed(0)
    with torch.no_grad():  # the formula: cap * tanh(logits / cap) of the logits the same weights give uncapped
        for p in m.parameters():
            p.add_(torch.randn_like(p))
    plain = minitf.Transformer(tiny(tie_embeddings=False)).eval()
    plain.load_state_dict(m.state_dict())
    ids = torch.randint(0, 100, (2, 16))
    raw = plain(ids)[0]
    assert raw.abs().max() > 4  # far enough past the cap that tanh bends them
    torch.testing.assert_close(m(ids)[0], 2.0 * torch.tanh(raw / 2.0))
    q = torch.tensor([[[[3.0, 4.0], [0.0, -2.0]]]])  # (B, H, T, D): rms 3.54 and 1.41
    attn = minitf.model.CausalSelfAttention(minitf.ModelConfig(vocab_size=100, n_embd=2, n_head=1, qk_norm=True))
    with torch.no_grad():
        attn.c_attn.weight.copy_(torch.eye(2).repeat(3, 1))
        attn.c_attn.bias.zero_()
    qn, kn, v = attn.qkv(q[0].transpose(0, 1).reshape(1, 2, 2))
    torch.testing.assert_close(qn[0, 0], torch.tensor([[0.8485, 1.1314], [0.0, -1.4142]]), atol=1e-4, rtol=0)
    torch.testing.assert_close(kn, qn)
    torch.testing.assert_close(v[0, 0], q[0, 0])  # values are not normalised


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_learns_one_batch(positions):
    torch.manual_seed(0)
    m = minitf.Transformer(tiny(positions=positions))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.randint(0, 100, (4, 33))
    for step in range(300):  # noqa: B007  (step is read after the loop)
        _, loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.1:
            break
    assert loss.item() < 0.1, f"loss {loss.item():.3f} after {step + 1} steps"


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_forward_refuses_ids_it_cannot_embed():
    m = minitf.Transformer(minitf.ModelConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=16))
    ok = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"idx must be \(batch, time\) token ids, got shape \(3,\)"):
        m(ok[0])
    with pytest.raises(ValueError, match=r"idx holds ids outside 0..99 \(min -1"):
        m(torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match=r"idx holds ids outside 0..99 .*max 120"):
        m(torch.tensor([[1, 120]]))  # 120 < 128: a padding row, which would embed silently as zeros
    with pytest.raises(ValueError, match=r"targets holds ids outside 0..99 .*max 100"):
        m(ok, torch.tensor([[2, 3, 100]]))
    assert m(ok, torch.tensor([[2, -100, 4]]))[1].isfinite()  # -100: no loss here, as documented


# Grouped-query attention (model.n_kv_head): the same attention as n_head heads whose keys and
# values are shared within each group, a KV cache that shrinks, and n_kv_head = n_head unchanged.


def test_n_kv_head_equal_to_n_head_is_the_model_as_before():
    a, b = model(), model(n_kv_head=4)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    assert a.blocks[0].attn.c_attn.weight.shape == (96, 32)
    with torch.no_grad():
        assert torch.equal(a(IDS)[0], b(IDS)[0])


def test_the_default_block_calls_no_do_nothing_layer_and_gemmas_lists_its_norms_in_compute_order():
    # decoding pays for every module call per token: the default block is its four layers alone;
    # model.sandwich_norm's block (Gemma) lists its parameters in the order it computes, as an
    # optimizer's saved state (a resume) expects
    cfg = minitf.load_config(None, ["model.vocab_size=64", "model.n_layer=1"]).model
    default = minitf.Transformer(cfg).blocks[0]
    assert [name for name, _ in default.named_children()] == ["ln_1", "attn", "ln_2", "mlp"]
    cfg.sandwich_norm = True
    sandwich = minitf.Transformer(cfg).blocks[0]
    assert [name for name, _ in sandwich.named_children()] == ["ln_1", "attn", "after_attn", "ln_2", "mlp", "after_mlp"]
    x = torch.randn(1, 3, cfg.n_embd)
    with torch.no_grad():
        sandwich.after_attn.weight.fill_(2.0)  # a gain away from one: the norm is applied, not skipped
        a = sandwich.attn(sandwich.ln_1(x))
        mid = x + sandwich.after_attn(a)
        assert torch.allclose(sandwich(x), mid + sandwich.after_mlp(sandwich.mlp(sandwich.ln_2(mid))))


def test_gemmas_norm_after_a_bfloat16_sub_layer_computes_as_torch_does_without_its_warning():
    # under a bfloat16 autocast a sub-layer's output is bfloat16 and the norm's gains float32: torch's
    # RMSNorm computes that mix in float32 but warns (a line in every Gemma fine-tune); minitf's norm
    # gives the same bits silently
    import warnings

    m = minitf.Transformer(tiny(norm="rmsnorm", sandwich_norm=True, positions="rope", bias=False))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # gains off one
    norm = m.blocks[0].after_attn
    x = torch.randn(2, 5, 32).to(torch.bfloat16)
    torch_norm = torch.nn.RMSNorm(32, eps=norm.eps)
    torch_norm.load_state_dict(norm.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        ours = norm(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(IDS[:, :8] % 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, torch_norm(x))
