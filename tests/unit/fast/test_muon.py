"""Muon for the blocks' matrices beside AdamW for the rest: the split, one LR schedule for both,
a step's update, exact resume, and DDP."""

import pytest
import torch

import minitf
from minitf import optim
from minitf.config import TrainConfig
from minitf.fast import muon
from tests.support.models import CFG, MUON


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    m = minitf.Transformer(minitf.ModelConfig(**{**CFG.__dict__, "tie_embeddings": False, "positions": "learned"}))
    opt = optim.make_optimizer(m, TrainConfig(**MUON), torch.device("cpu"))
    names = {id(p): n for n, p in m.named_parameters()}
    muon = sorted(names[id(p)] for g in opt.named["muon"].param_groups for p in g["params"])
    adamw = sorted(names[id(p)] for g in opt.named["adamw"].param_groups for p in g["params"])
    assert opt.named["muon"].param_groups[0]["ns_dtype"] in ("float32", "bfloat16")
    assert muon == sorted(
        f"blocks.{i}.{w}.weight" for i in range(2) for w in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    )
    assert "wte.weight" in adamw and "lm_head.weight" in adamw and "wpe.wpe.weight" in adamw
    assert len(muon) + len(adamw) == len(names)
    optim.set_lr(opt, 1e-3)  # the schedule's value at some step: half the peak
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 1e-3, 0.025])


def test_a_muon_step_is_an_orthogonalised_update():
    """With momentum 0 and no decay, the step moves a matrix by -lr * sqrt(rows/cols) * NS(grad):
    its singular values lie near 1 (Newton-Schulz's five quintic steps put nearly all in about
    0.5 .. 1.5; a direction the gradient barely has may stay lower), where the gradient's spread."""
    torch.manual_seed(0)
    m = minitf.Transformer(CFG)
    tc = TrainConfig(**{**MUON, "muon_momentum": 0.0})
    opt = optim.make_optimizer(m, tc, torch.device("cpu"))
    w = m.blocks[0].mlp.c_fc.weight  # (128, 32): Muon scales its step by sqrt(128 / 32) = 2
    before = w.detach().clone()
    x = torch.randint(0, 64, (4, 16))
    m(x, x)[1].backward()
    grad = w.grad.clone()
    opt.step()
    update = (before - w.detach()) / (tc.muon_lr * 2)  # (128, 32)
    s = torch.linalg.svdvals(update)
    assert (s > 0.5).float().mean() > 0.9 and s.max() < 1.6
    assert torch.linalg.svdvals(grad).max() / torch.linalg.svdvals(grad).min() > 5  # the raw gradient is not
    assert (update * grad).sum() > 0  # a descent direction


def test_muon_steps_equal_torch_muon():
    """minitf's Muon with bfloat16 Newton-Schulz is torch.optim.Muon's rule: the same weights
    after three steps with momentum and weight decay, on a tall and a wide matrix."""
    torch.manual_seed(0)
    mine = [torch.randn(48, 16), torch.randn(16, 40)]
    theirs = [w.clone() for w in mine]
    opt_a = muon.Muon(mine, lr=0.02, weight_decay=0.1, momentum=0.9, ns_dtype="bfloat16")
    opt_b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, momentum=0.9)
    for _ in range(3):
        grads = [torch.randn_like(w) for w in mine]
        for ws, opt in ((mine, opt_a), (theirs, opt_b)):
            for w, g in zip(ws, grads):
                w.grad = g.clone()
            opt.step()
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # float32 Newton-Schulz (on CPUs without native bfloat16) gives about the same matrix
    diff = muon.orthogonalise(grads[0], torch.float32) - muon.orthogonalise(grads[0], torch.bfloat16).float()
    assert 0 < diff.abs().max() < 0.05
