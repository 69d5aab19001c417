"""Memory per process under train.parallel=ddp and fsdp: minitf bench --only memory.

Each setting starts `procs` CPU processes (gloo), builds the model as train() does (seeded, the
same on every rank; fsdp: fsdp.shard, then the optimizer; ddp: the optimizer, then
DistributedDataParallel), and runs `steps` of minitf's own training step (forward_backward:
micro-batches, clipping; then AdamW) on random tokens. Per rank it reports

- the bytes of weights, gradients and AdamW state that the rank itself holds (its shards under
  fsdp), counted from the tensors after the last backward, before zero_grad;
- the peak resident memory of the process (VmHWM, the OS's figure), and that peak less the
  resident memory before the model was built (torch itself, the interpreter): what training adds,
  activations, communication buffers and the blocks gathered for compute included.

What the OS reports also depends on the C allocator, and fsdp frees and re-allocates each block's
gathered weights and gradients (20 MB each at the default size) at every step, so each setting is
measured under three glibc settings, chosen per process before the model is built:

- "mmap": every block of 64 KB or more comes from mmap and goes back to the OS when freed
  (mallopt M_MMAP_THRESHOLD; the env variable MALLOC_MMAP_THRESHOLD_=65536 does the same), so the
  peak is of memory in use: the figure to compare;
- "glibc": glibc as it starts: its mmap threshold rises to the largest block freed (up to 32 MB),
  so later blocks of that size come from heap arenas that fragment and are rarely trimmed;
- "kept": keep_freed_memory(), which `minitf train` calls: nothing is returned, ever.

The model is built whole on every rank before it is sharded, as train() does; that transient is
below the training peak at these sizes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

# (parallel, grad_accum, activation checkpointing, allocator)
SETTINGS = [
    ("ddp", 1, False, "mmap"),
    ("fsdp", 1, False, "mmap"),
    ("fsdp", 1, True, "mmap"),
    ("fsdp", 2, False, "mmap"),
    ("ddp", 1, False, "glibc"),
    ("fsdp", 1, False, "glibc"),
    ("ddp", 1, False, "kept"),
    ("fsdp", 1, False, "kept"),
]


def _set_allocator(kind: str) -> None:
    from minitf.system.runtime import keep_freed_memory, libc

    if kind == "mmap":
        libc().mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD, fixed from now on
    elif kind == "kept":
        keep_freed_memory()


def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _worker(rank: int, procs: int, init_file: str, out: str, setting: tuple, shape: dict, steps: int) -> None:
    import torch.distributed as dist
    import torch.nn as nn

    from minitf.config import Config, ModelConfig, TrainConfig
    from minitf.model import Transformer
    from minitf.optim import make_optimizer
    from minitf.system.runtime import Dist
    from minitf.trainer import forward_backward
    from minitf.training import fsdp
    from minitf.training.session import Session

    parallel_kind, accum, ac, allocator = setting
    _set_allocator(allocator)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=procs)
    before = _vm("VmRSS")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**shape["model"]))
    model.checkpoint_blocks = ac
    tc = TrainConfig(grad_accum=accum, parallel=parallel_kind, optimizer="adamw")  # fsdp shards: AdamW
    if parallel_kind == "fsdp":
        fsdp.shard(model, torch.device("cpu"), torch.float32)
    cpu = torch.device("cpu")
    optimizer = make_optimizer(model, tc, cpu)
    cfg = Config(model=model.config, train=tc)
    session = Session.create(
        cfg, model, optimizer, RandomTokens(shape), cpu, run_dir=Path(out), procs=Dist(rank, procs)
    )
    session.model = model if parallel_kind == "fsdp" else nn.parallel.DistributedDataParallel(model)
    session.batch_gen.manual_seed(rank)
    for _ in range(steps):
        forward_backward(session)
        optimizer.step()
        held = _held_bytes(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
    peak = _vm("VmHWM")
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "held_bytes": held, "peak_rss": peak, "rss_before_model": before})
    )
    dist.barrier()  # a rank that destroyed the group while a peer still wrote its numbers could leave it hanging
    dist.destroy_process_group()


class RandomTokens:
    """Stands in for the token data: random (B, T) ids and their next tokens from the rank's generator."""

    def __init__(self, shape: dict):
        self.B, self.T, self.V = shape["batch"], shape["model"]["block_size"], shape["model"]["vocab_size"]

    def get_batch(self, split, batch_size, block_size, generator, device, policy=None):
        xy = torch.randint(0, self.V, (self.B, self.T + 1), generator=generator)  # (B, T + 1)
        return xy[:, :-1], xy[:, 1:]


def _held_bytes(model, optimizer) -> dict:
    from minitf.training.fsdp import local

    size = lambda ts: sum(local(t).numel() * local(t).element_size() for t in ts if t is not None)
    params = list(dict.fromkeys(model.parameters()))  # the tied weight once
    return {
        "weights": size(params),
        "grads": size(p.grad for p in params),
        "adamw": size(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)),
    }


def memory_per_rank(
    procs: int = 2,
    n_layer: int = 10,
    n_embd: int = 640,
    n_head: int = 10,
    vocab: int = 4096,
    block: int = 256,
    batch: int = 2,
    steps: int = 5,
    log=print,
) -> list[dict]:
    """Each of SETTINGS on `procs` processes: the model (10 x 640 with vocab 4096 is about 52M
    parameters), batch sequences of `block` tokens per micro-batch and rank."""
    import torch.multiprocessing as mp

    from minitf.config import ModelConfig
    from minitf.model import Transformer

    model = {"vocab_size": vocab, "block_size": block, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head}
    with torch.device("meta"):
        params = Transformer(ModelConfig(**model)).num_params(non_embedding=False)
    results = []
    for setting in SETTINGS:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(
                _worker,
                args=(procs, str(Path(tmp) / "init"), tmp, setting, {"model": model, "batch": batch}, steps),
                nprocs=procs,
            )
            ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(procs)]
        r = {
            "parallel": setting[0],
            "grad_accum": setting[1],
            "activation_checkpointing": setting[2],
            "allocator": setting[3],
            "procs": procs,
            "params": params,
            "batch_per_rank": batch,
            "block": block,
            "ranks": ranks,
        }
        results.append(r)
        log(describe(r))
    return results


def describe(r: dict) -> str:
    mb = lambda b: f"{b / 2**20:,.0f}"
    per_rank = lambda f: " / ".join(mb(f(x)) for x in r["ranks"])
    what = (
        r["parallel"]
        + (" + activation checkpointing" if r["activation_checkpointing"] else "")
        + (f" + grad_accum {r['grad_accum']}" if r["grad_accum"] > 1 else "")
    )
    parts = ", ".join(f"{k} {mb(v)}" for k, v in r["ranks"][0]["held_bytes"].items())
    return (
        f"memory    {what}, allocator {r['allocator']}, {r['procs']} procs, {r['params'] / 1e6:.1f}M params: held "
        f"{per_rank(lambda x: sum(x['held_bytes'].values()))} MB per rank (rank 0: {parts}); peak RSS "
        f"{per_rank(lambda x: x['peak_rss'])} MB, of which training added "
        f"{per_rank(lambda x: x['peak_rss'] - x['rss_before_model'])} MB"
    )
