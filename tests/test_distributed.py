"""DistributedDataParallel on CPU (gloo): a real torchrun run, and one DDP step == one big-batch step."""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import minitf
from minitf.config import TrainConfig
from minitf.optim import make_optimizer

from .helpers import ROOT

CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


def _one_step(model, x, y):
    opt = make_optimizer(model, TrainConfig(lr=1e-2), torch.device("cpu"))
    _, loss = model(x, y)
    loss.backward()
    opt.step()


def _ddp_worker(rank, world, init_file, x, y, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(minitf.Transformer(CFG))
    half = x.size(0) // world
    _one_step(model, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    dist.destroy_process_group()


def test_ddp_step_equals_single_process_on_concatenated_batch(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 64, (8, 16), generator=g)
    y = torch.randint(0, 64, (8, 16), generator=g)
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), x, y, str(tmp_path / "ddp.pt")), nprocs=2)
    torch.manual_seed(0)
    single = minitf.Transformer(CFG)
    _one_step(single, x, y)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    moved = 0
    for k, v in single.state_dict().items():
        # Adam moves every weight by about lr=1e-2 on its first step; agree to 0.1% of that
        torch.testing.assert_close(ddp[k], v, atol=1e-5, rtol=1e-5)
        moved += 1
    assert moved > 10


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path, corpus):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "scripts/train.py", "--config", "configs/tiny.yaml", f"run.out_dir={run}", f"data.source=file:{corpus}",
           "data.vocab_size=300", "model.n_embd=32", "model.block_size=32", "train.batch_size=4",
           "train.grad_accum=2", "train.max_steps=6", "train.eval_every=3", "train.ckpt_every=3", "train.eval_batches=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "global batch 4 x 2 accum x 2 procs = 16 sequences" in r.stdout
    assert r.stdout.count("run directory:") == 1  # rank 0 alone reports and writes
    model, tok, cfg = minitf.load_run(run)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 6
    assert len(torch.load(run / "state.pt", weights_only=True)["rank_rng"]) == 2  # each rank's sampler saved
    assert [r["step"] for r in minitf.checkpoint.read_metrics(run)] == [3, 6]
