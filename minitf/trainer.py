"""The training loop: `train(cfg)` fits a Transformer and writes a run directory.

One process, or one per GPU/CPU under torchrun (DistributedDataParallel). Resume is exact: the
weights, optimizer, schedule position, every RNG and the batch sampler's generator are saved, so
k steps + resume + (N - k) steps equal N steps bit for bit (on CPU in float32).

Read `train` first: it is the loop. `start` builds a `Session` (the model, optimizer, data and
counters of one run), `train_step` is one optimizer step, `record_eval` evaluates and logs, and
`save_checkpoint` writes the run directory.
"""
from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from . import checkpoint as ckpt
from . import runtime
from .config import Config, MinitfError, TrainConfig
from .data import TokenData, prepare_data
from .evaluate import evaluate
from .model import Transformer
from .optim import lr_at, make_optimizer
from .tokenizer import Tokenizer


def train(cfg: Config, resume: bool = False, log=print, on_eval: Callable[[Path], None] | None = None) -> Path:
    """Train per `cfg` and return the run directory. `resume` continues its last checkpoint.

    on_eval(run_dir) is called on rank 0 after each evaluation has been appended to metrics.jsonl
    (minitf.train and scripts/train.py draw loss.png there). cfg itself is left unchanged.
    """
    cfg = copy.deepcopy(cfg)
    run = start(cfg, resume, log)
    bar = _progress_bar(run)
    with runtime.tf32_matmuls(run.device), runtime.StopFlag() as interrupted:
        while run.step < cfg.train.max_steps:
            progress = run.step / cfg.train.max_steps
            if cfg.train.max_seconds:
                progress = max(progress, run.elapsed() / cfg.train.max_seconds)
            lr = lr_at(run.step, progress, cfg.train)
            loss, norm, elapsed, stop_now = train_step(run, lr, interrupted.set)
            run.step += 1
            bar.update(min(elapsed, cfg.train.max_seconds) - bar.n if cfg.train.max_seconds else 1)
            if run.step % cfg.train.log_every == 0 or run.step == cfg.train.max_steps:
                bar.set_postfix(run.meter.update(run.step, loss, lr))

            out_of_time = cfg.train.max_seconds is not None and elapsed >= cfg.train.max_seconds
            last = run.step == cfg.train.max_steps or out_of_time or stop_now
            if run.dist.main and (run.step % cfg.train.eval_every == 0 or last):
                record_eval(run, lr, norm, elapsed, bar.write, on_eval)
            if run.step % cfg.train.ckpt_every == 0 or last:
                save_checkpoint(run)
            if last:
                run.stop_reason = "interrupted" if stop_now else "time budget" if out_of_time else "max_steps"
                break
    bar.close()
    run.log(f"stopped at step {run.step} ({run.stop_reason}) after {run.elapsed():.0f}s; "
            f"best val loss {run.best_val:.4f}")
    run.log(f"run directory: {run.run_dir}\nsample from it: python scripts/generate.py --run {run.run_dir}")
    if run.dist.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return run.run_dir


class Meter:
    """Tokens per second (and MFU on a known GPU) between two log points, for the progress bar."""

    def __init__(self, tokens_per_step: int, flops_per_step: float, peak: float | None, step: int):
        self.tokens_per_step, self.flops_per_step, self.peak = tokens_per_step, flops_per_step, peak
        self.t_last, self.step_last, self.tok_s = time.time(), step, 0.0

    def update(self, step: int, loss: float, lr: float) -> dict:
        now = time.time()
        self.tok_s = self.tokens_per_step * (step - self.step_last) / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, step
        post = {"step": step, "loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok/s": f"{self.tok_s:,.0f}"}
        if self.peak:
            post["mfu"] = f"{100 * self.flops_per_step * self.tok_s / self.tokens_per_step / self.peak:.1f}%"
        return post


@dataclass
class Session:
    """One training run in progress: what it trains, how, where it writes, and how far it is."""

    cfg: Config
    run_dir: Path
    dist: runtime.Dist
    device: torch.device
    data: TokenData
    model: nn.Module            # what the step calls: compiled and/or wrapped in DDP
    raw_model: Transformer      # the plain module: evaluated and saved
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    batch_gen: torch.Generator  # this rank's batch sampler
    meter: Meter
    log: Callable = print       # rank 0's log; a no-op on the other ranks
    step: int = 0
    elapsed_before: float = 0.0  # seconds trained before this process (resume)
    best_val: float = float("inf")
    bad_steps: int = 0
    stop_reason: str = "max_steps"
    t0: float = 0.0

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.t0

    def next_batch(self):
        return self.data.get_batch("train", self.cfg.train.batch_size, self.cfg.model.block_size, self.batch_gen,
                                   self.device)


def start(cfg: Config, resume: bool, log) -> Session:
    """Set up device, data, model and optimizer; restore the checkpoint when resuming. Mutates cfg
    (the model's vocab_size comes from the tokenizer): train() hands it a copy."""
    gpu = cfg.run.device in ("auto", "cuda") and torch.cuda.is_available()
    procs = runtime.setup_distributed("cuda" if gpu else "cpu")
    log = log if procs.main else (lambda *a, **k: None)
    device = runtime.resolve_device(cfg.run.device, procs.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_dir = ckpt.check_run_dir(cfg, resume)

    # data: rank 0 builds the token cache, the others then find it ready
    tokenizer = Tokenizer.load(run_dir / ckpt.TOKENIZER) if resume else None
    if procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    if procs.world > 1:
        dist.barrier()
    if not procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    cfg.model.vocab_size = data.tokenizer.vocab_size

    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    model = Transformer(cfg.model).to(device)
    dtype = runtime.resolve_dtype(cfg.train.dtype, device)
    tokens_per_step = cfg.train.batch_size * cfg.model.block_size * cfg.train.grad_accum * procs.world
    run = Session(cfg, run_dir, procs, device, data, model, model, make_optimizer(model, cfg.train, device),
                  torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
                  runtime.autocast_for(dtype, device), torch.Generator().manual_seed(cfg.run.seed + procs.rank),
                  Meter(tokens_per_step, model.flops_per_token() * tokens_per_step,
                        (runtime.peak_flops(device) or 0) * procs.world, 0), log)
    if resume:
        restore_checkpoint(run, log)
    elif procs.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_run_files(run_dir, cfg, data.tokenizer)

    if cfg.train.compile:
        run.model = torch.compile(run.model)
    if procs.world > 1:
        run.model = nn.parallel.DistributedDataParallel(
            run.model, device_ids=[device.index] if device.type == "cuda" else None)
    batch, accum = cfg.train.batch_size, cfg.train.grad_accum
    log(f"model: {model.num_params():,} parameters | device {device} | dtype {str(dtype).split('.')[-1]}"
        f" | global batch {batch} x {accum} accum x {procs.world} procs = {batch * accum * procs.world}"
        f" sequences of {cfg.model.block_size} = {tokens_per_step:,} tokens")
    run.model.train()
    run.meter.step_last, run.t0 = run.step, time.time()
    return run


def train_step(run: Session, lr: float, interrupted: bool) -> tuple[float, float, float, bool]:
    """One optimizer step at learning rate lr; a non-finite loss or gradient skips it.

    Returns (loss, grad norm, elapsed seconds, stop) as agreed by all ranks: one small collective
    keeps every rank's decisions (skip, stop) identical. It is the step's one host sync.
    """
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum, norm = forward_backward(run.model, run.raw_model, run.next_batch, run.optimizer, run.scaler, run.autocast,
                                      run.cfg.train, distributed=run.dist.world > 1)
    host = torch.tensor([run.elapsed(), float(interrupted)], dtype=torch.float64, device=run.device)
    stats = torch.cat([torch.stack([loss_sum.double(), norm.double()]), host])
    if run.dist.world > 1:  # the grad norm is equal on all ranks after DDP's all-reduce: averaging keeps it
        dist.all_reduce(stats)
        stats /= run.dist.world
    loss, norm, elapsed, stop_flag = stats.tolist()
    if math.isfinite(loss) and math.isfinite(norm):
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.bad_steps = 0
    else:
        run.bad_steps += 1
        run.log(f"warning: step {run.step}: non-finite loss {loss} or grad norm {norm}; step skipped")
    run.optimizer.zero_grad(set_to_none=True)
    if run.bad_steps >= run.cfg.train.max_bad_steps:
        raise MinitfError(f"{run.bad_steps} non-finite steps in a row at step {run.step}; training stopped and "
                          f"the last good checkpoint in {run.run_dir} is intact. Lower train.lr or use float32")
    return loss, norm, elapsed, stop_flag > 0


def forward_backward(model, raw_model, next_batch, optimizer, scaler, autocast, tc: TrainConfig,
                     distributed: bool = False):
    """Gradients of one step over grad_accum micro-batches, unscaled and clipped.

    Returns (mean loss, grad norm) as tensors: nothing here waits for the device. Under DDP the
    gradients are all-reduced only on the last micro-batch.
    """
    loss_sum = None
    for micro in range(tc.grad_accum):
        x, y = next_batch()
        sync = not distributed or micro == tc.grad_accum - 1
        with (contextlib.nullcontext() if sync else model.no_sync()), autocast:
            _, loss = model(x, y)
            loss = loss / tc.grad_accum
        scaler.scale(loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    scaler.unscale_(optimizer)
    norm = nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
    return loss_sum, norm


def record_eval(run: Session, lr: float, norm: float, elapsed: float, write, on_eval) -> None:
    """Evaluate, append the metrics, keep best.safetensors (rank 0 only)."""
    result = evaluate(run.raw_model, run.data, run.cfg, run.device, run.autocast)
    ckpt.append_metrics(run.run_dir, {
        "step": run.step, "train_loss": result["train"], "val_loss": result["val"], "val_bpb": result["val_bpb"],
        "lr": lr, "grad_norm": norm, "tokens_per_s": round(run.meter.tok_s), "elapsed_s": round(elapsed, 2),
        "tokens": run.step * run.meter.tokens_per_step})
    if on_eval is not None:
        on_eval(run.run_dir)
    write(f"step {run.step}: train {result['train']:.4f} | val {result['val']:.4f} | val bpb {result['val_bpb']:.3f}")
    if result["val"] < run.best_val:
        run.best_val = result["val"]
        ckpt.save_weights(run.raw_model, run.run_dir / ckpt.BEST, run.step)


def save_checkpoint(run: Session) -> None:
    """Weights and training state at run.step. Every rank's torch RNG and batch generator are
    gathered, so each resumes its own stream; rank 0 writes."""
    per_rank = [torch.cat([torch.get_rng_state(), run.batch_gen.get_state()]).to(run.device)]  # uint8
    if run.dist.world > 1:
        mine, per_rank = per_rank[0], [torch.empty_like(per_rank[0]) for _ in range(run.dist.world)]
        dist.all_gather(per_rank, mine)
    if not run.dist.main:
        return
    state = {"step": run.step, "optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict(),
             "rng": runtime.host_rng_state(), "rank_rng": [t.cpu() for t in per_rank],
             "elapsed": run.elapsed(), "best_val": run.best_val}
    ckpt.save_weights(run.raw_model, run.run_dir / ckpt.WEIGHTS, run.step)
    ckpt.save_state(state, run.run_dir / ckpt.STATE)


def restore_checkpoint(run: Session, log) -> None:
    """Weights, optimizer, counters and RNG streams from the run directory's last checkpoint."""
    state = ckpt.load_state(run.run_dir / ckpt.STATE)
    ckpt.load_weights(run.raw_model, run.run_dir / ckpt.WEIGHTS)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scaler.load_state_dict(state["scaler"])
    run.step, run.elapsed_before, run.best_val = state["step"], state["elapsed"], state["best_val"]
    runtime.set_host_rng_state(state["rng"])
    if len(state["rank_rng"]) == run.dist.world:
        torch_rng, data_rng = state["rank_rng"][run.dist.rank].split(len(torch.get_rng_state()))
        torch.set_rng_state(torch_rng.clone())  # clone: set_state wants its own storage
        run.batch_gen.set_state(data_rng.clone())
    else:  # another world size: fresh, distinct streams per rank
        log(f"warning: checkpoint from {len(state['rank_rng'])} processes resumed on {run.dist.world}; "
            f"batches are reseeded")
        run.batch_gen.manual_seed(run.cfg.run.seed + run.dist.rank + 1000 * run.step)
    if run.dist.main:
        ckpt.truncate_metrics(run.run_dir, run.step)
    log(f"resuming {run.run_dir} at step {run.step}")


def _progress_bar(run: Session) -> tqdm:
    """Steps, or under a time budget seconds, so the ETA is the budget's, not max_steps'."""
    tc = run.cfg.train
    if tc.max_seconds is None:
        return tqdm(total=tc.max_steps, initial=run.step, disable=not run.dist.main, dynamic_ncols=True, unit="step")
    return tqdm(total=tc.max_seconds, initial=run.elapsed_before, disable=not run.dist.main, dynamic_ncols=True,
                unit="s", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]")
