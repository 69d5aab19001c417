"""DistributedDataParallel on CPU (gloo): a real torchrun run, and minitf's DDP step with gradient
accumulation == plain autograd on the concatenated batch."""

import os
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

import minitf
from minitf import optim
from minitf.config import TrainConfig
from minitf.optim import make_optimizer
from minitf.trainer import forward_backward
from minitf.training import precision
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.models import MUON, step_session
from tests.support.processes import join_gloo, leave_gloo
from tests.support.runs import tiny_train_args

CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _grads(model, micro_batches, distributed):
    """Gradients of one step through minitf's own forward_backward (grad_accum micro-batches, DDP's
    no_sync on all but the last), unclipped: what the optimizer would be handed."""
    tc = TrainConfig(grad_accum=len(micro_batches), grad_clip=0.0)
    raw = model.module if distributed else model
    optimizer = make_optimizer(raw, tc, torch.device("cpu"))
    forward_backward(step_session(model, micro_batches, optimizer, tc, distributed, raw_model=raw))
    return {n: p.grad.clone() for n, p in raw.named_parameters()}


def _ddp_worker(rank, world, init_file, x, y, out):
    join_gloo(rank, world, init_file)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(minitf.Transformer(CFG))
    mine = slice(rank * 4, (rank + 1) * 4)  # 4 of the 8 sequences per rank, as 2 micro-batches of 2
    xs, ys = x[mine], y[mine]
    grads = _grads(model, [(xs[:2], ys[:2]), (xs[2:], ys[2:])], distributed=True)
    if rank == 0:
        torch.save(grads, out)
    leave_gloo()


def test_ddp_with_grad_accum_gives_the_full_batch_gradient(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 64, (8, 16), generator=g)
    y = torch.randint(0, 64, (8, 16), generator=g)
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), x, y, str(tmp_path / "ddp.pt")), nprocs=2)
    torch.manual_seed(0)
    single = minitf.Transformer(CFG)
    single(x, y)[1].backward()  # plain autograd, all 8 sequences at once
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert ddp.keys() == dict(single.named_parameters()).keys()
    for name, p in single.named_parameters():
        # a missing division by world size or by grad_accum would be off by 2x here, not by rounding
        torch.testing.assert_close(ddp[name], p.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path, corpus):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "scripts/train.py",
        *tiny_train_args(run, corpus),
        "train.grad_accum=2",
        "train.max_steps=6",
        "train.eval_every=3",
        "train.ckpt_every=3",
        "train.eval_batches=2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "global batch 4 x 2 accum x 2 procs = 16 sequences" in r.stdout
    assert r.stdout.count("run directory:") == 1  # rank 0 alone reports and writes
    model, tok, cfg = minitf.load_run(run)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 6
    rank_rng = torch.load(run / "state.pt", weights_only=True)["rank_rng"]
    assert len(rank_rng) == 2 and not torch.equal(rank_rng[0], rank_rng[1])  # each rank draws its own batches
    assert [r["step"] for r in read_rows(run / METRICS)] == [3, 6]


# Muon for the blocks' matrices beside AdamW for the rest: the split, one LR schedule for both,
# a step's update, exact resume, and DDP.


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


def _bfloat16_weights_ddp_worker(rank, world, init_file, x, out):
    join_gloo(rank, world, init_file)
    torch.manual_seed(0)
    model = minitf.Transformer(CFG)
    tc = TrainConfig(optimizer="adamw", param_dtype="bfloat16", dtype="bfloat16", lr=1e-3)
    precision.hold(model, tc)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = optim.make_optimizer(model.module, tc, torch.device("cpu"))
    torch.manual_seed(100 + rank)  # each rank's own process generator, as a run's ranks have
    mine = x[rank * 4 : (rank + 1) * 4]
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(mine, mine)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.save(model.module.state_dict(), f"{out}.{rank}")
    leave_gloo()


def test_bfloat16_weights_stay_identical_on_every_rank(tmp_path):
    """train.param_dtype=bfloat16's stochastic rounding draws by the step, not from each process's
    generator: after three steps under DDP both ranks hold the same weights, bit for bit."""
    x = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))
    out = str(tmp_path / "w")
    mp.spawn(_bfloat16_weights_ddp_worker, args=(2, str(tmp_path / "init"), x, out), nprocs=2)
    r0, r1 = torch.load(f"{out}.0", weights_only=True), torch.load(f"{out}.1", weights_only=True)
    torch.manual_seed(0)
    start = minitf.Transformer(CFG).state_dict()
    assert r0["blocks.0.mlp.c_fc.weight"].dtype == torch.bfloat16
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
    assert not torch.equal(r0["blocks.0.mlp.c_fc.weight"].float(), start["blocks.0.mlp.c_fc.weight"])


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
