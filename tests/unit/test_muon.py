"""Muon for the blocks' matrices beside AdamW for the rest: the split, one LR schedule for both,
a step's update, exact resume, and DDP."""

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

import minitf
from minitf import muon, optim
from minitf.config import TrainConfig
from minitf.trainer import forward_backward
from minitf.training.metrics import METRICS, read_rows

from .helpers import join_gloo, leave_gloo, step_session, tiny_config, train_with_snapshot

CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
MUON = dict(optimizer="muon", lr=2e-3, muon_lr=0.05, weight_decay=0.0)


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


def test_muon_resume_is_bit_identical(tmp_path, corpus, monkeypatch):
    overrides = ("train.optimizer=muon", "train.muon_lr=0.05", "model.dropout=0.1")
    snapshot = tmp_path / "at-step-4"
    straight = train_with_snapshot(tiny_config(tmp_path / "straight", corpus, *overrides), snapshot, 4, monkeypatch)
    state = torch.load(snapshot / "state.pt", weights_only=True)["optimizer"]
    assert set(state) == {"adamw", "muon"} and state["muon"]["state"]  # both states, momentum included
    resumed = minitf.train(snapshot, resume=True, log=lambda *a: None)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = read_rows(resumed / METRICS)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_resume_refuses_another_optimizer(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), log=lambda *a: None)
    with pytest.raises(minitf.MinitfError, match="train.optimizer"):
        minitf.train(run, resume=True, overrides=["train.optimizer=muon", "train.max_steps=8"], log=lambda *a: None)


def _float32_newton_schulz(opt):
    """Newton-Schulz in float32 on any CPU: on one with native bf16 it would run in bfloat16, whose
    rounding turns the ranks' ~1e-7 gradient differences into ~1e-3 differences of the update."""
    for group in opt.named["muon"].param_groups:
        group["ns_dtype"] = "float32"
    return opt


def _muon_ddp_worker(rank, world, init_file, x, out):
    join_gloo(rank, world, init_file)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(minitf.Transformer(CFG))
    tc = TrainConfig(**MUON, grad_accum=2, grad_clip=0.0)
    opt = _float32_newton_schulz(optim.make_optimizer(model.module, tc, torch.device("cpu")))
    mine = x[rank * 4 : (rank + 1) * 4]
    batches = [(mine[:2], mine[:2]), (mine[2:], mine[2:])]
    forward_backward(step_session(model, batches, opt, tc, distributed=True, raw_model=model.module))
    opt.step()
    torch.save(model.module.state_dict(), f"{out}.{rank}")
    leave_gloo()


def test_muon_under_ddp_keeps_ranks_identical_and_matches_one_process(tmp_path):
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))
    out = str(tmp_path / "w")
    mp.spawn(_muon_ddp_worker, args=(2, str(tmp_path / "init"), x, out), nprocs=2)
    r0, r1 = torch.load(f"{out}.0", weights_only=True), torch.load(f"{out}.1", weights_only=True)
    torch.manual_seed(0)
    single = minitf.Transformer(CFG)
    start = {k: v.clone() for k, v in single.state_dict().items()}
    opt = _float32_newton_schulz(optim.make_optimizer(single, TrainConfig(**MUON), torch.device("cpu")))
    single(x, x)[1].backward()
    opt.step()
    for k, v in single.state_dict().items():
        assert torch.equal(r0[k], r1[k]), k  # every rank applied the same update
        # the gradients agree to rounding (sums in another order), and so do the float32 updates
        torch.testing.assert_close(r0[k], v, atol=2e-4, rtol=0)
        if k.endswith("mlp.c_fc.weight"):
            assert (v - start[k]).abs().max() > 1e-2  # the step really moved it
