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
    s = start(cfg, resume, log)
    tc = cfg.train
    bar = _progress_bar(s)
    with runtime.tf32_matmuls(s.device), runtime.StopFlag() as interrupted:
        while s.step < tc.max_steps:
            progress = s.step / tc.max_steps
            if tc.max_seconds:
                progress = max(progress, s.elapsed() / tc.max_seconds)
            lr = lr_at(s.step, progress, tc)
            loss, norm, elapsed, stop_now = train_step(s, lr, interrupted.set)
            s.step += 1
            bar.update(min(elapsed, tc.max_seconds) - bar.n if tc.max_seconds else 1)
            if s.step % tc.log_every == 0 or s.step == tc.max_steps:
                bar.set_postfix(s.meter.update(s.step, loss, lr))

            out_of_time = tc.max_seconds is not None and elapsed >= tc.max_seconds
            last = s.step == tc.max_steps or out_of_time or stop_now
            if s.dist.main and (s.step % tc.eval_every == 0 or last):
                record_eval(s, lr, norm, elapsed, bar.write, on_eval)
            if s.step % tc.ckpt_every == 0 or last:
                save_checkpoint(s)
            if last:
                s.stop_reason = "interrupted" if stop_now else "time budget" if out_of_time else "max_steps"
                break
    bar.close()
    s.log(f"stopped at step {s.step} ({s.stop_reason}) after {s.elapsed():.0f}s; best val loss {s.best_val:.4f}")
    s.log(f"run directory: {s.run_dir}\nsample from it: python scripts/generate.py --run {s.run_dir}")
    if s.dist.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return s.run_dir


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
        tc = self.cfg.train
        return self.data.get_batch("train", tc.batch_size, self.cfg.model.block_size, self.batch_gen, self.device)


def start(cfg: Config, resume: bool, log) -> Session:
    """Set up device, data, model and optimizer; restore the checkpoint when resuming. Mutates cfg
    (the model's vocab_size comes from the tokenizer): train() hands it a copy."""
    d = runtime.setup_distributed("cuda" if cfg.run.device in ("auto", "cuda") and torch.cuda.is_available()
                                  else "cpu")
    log = log if d.main else (lambda *a, **k: None)
    device = runtime.resolve_device(cfg.run.device, d.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_dir = ckpt.check_run_dir(cfg, resume)
    tc = cfg.train

    # data: rank 0 builds the token cache, the others then find it ready
    tokenizer = Tokenizer.load(run_dir / ckpt.TOKENIZER) if resume else None
    if d.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    if d.world > 1:
        dist.barrier()
    if not d.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    cfg.model.vocab_size = data.tokenizer.vocab_size

    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    model = Transformer(cfg.model).to(device)
    dtype = runtime.resolve_dtype(tc.dtype, device)
    tokens_per_step = tc.batch_size * cfg.model.block_size * tc.grad_accum * d.world
    s = Session(cfg, run_dir, d, device, data, model, model, make_optimizer(model, tc, device),
                torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
                runtime.autocast_for(dtype, device), torch.Generator().manual_seed(cfg.run.seed + d.rank),
                Meter(tokens_per_step, model.flops_per_token() * tokens_per_step,
                      (runtime.peak_flops(device) or 0) * d.world, 0), log)
    if resume:
        restore_checkpoint(s, log)
    elif d.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_run_files(run_dir, cfg, data.tokenizer)

    if tc.compile:
        s.model = torch.compile(s.model)
    if d.world > 1:
        s.model = nn.parallel.DistributedDataParallel(s.model, device_ids=[device.index] if device.type == "cuda"
                                                      else None)
    log(f"model: {model.num_params():,} parameters | device {device} | dtype {str(dtype).split('.')[-1]}"
        f" | global batch {tc.batch_size} x {tc.grad_accum} accum x {d.world} procs = "
        f"{tc.batch_size * tc.grad_accum * d.world} sequences of {cfg.model.block_size} = {tokens_per_step:,} tokens")
    s.model.train()
    s.meter.step_last, s.t0 = s.step, time.time()
    return s


def train_step(s: Session, lr: float, interrupted: bool) -> tuple[float, float, float, bool]:
    """One optimizer step at learning rate lr; a non-finite loss or gradient skips it.

    Returns (loss, grad norm, elapsed seconds, stop) as agreed by all ranks: one small collective
    keeps every rank's decisions (skip, stop) identical. It is the step's one host sync.
    """
    for group in s.optimizer.param_groups:
        group["lr"] = lr
    loss_sum, norm = forward_backward(s.model, s.raw_model, s.next_batch, s.optimizer, s.scaler, s.autocast,
                                      s.cfg.train, distributed=s.dist.world > 1)
    host = torch.tensor([s.elapsed(), float(interrupted)], dtype=torch.float64, device=s.device)
    stats = torch.cat([torch.stack([loss_sum.double(), norm.double()]), host])
    if s.dist.world > 1:  # the grad norm is equal on all ranks after DDP's all-reduce: averaging keeps it
        dist.all_reduce(stats)
        stats /= s.dist.world
    loss, norm, elapsed, stop_flag = stats.tolist()
    if math.isfinite(loss) and math.isfinite(norm):
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.bad_steps = 0
    else:
        s.bad_steps += 1
        s.log(f"warning: step {s.step}: non-finite loss {loss} or grad norm {norm}; step skipped")
    s.optimizer.zero_grad(set_to_none=True)
    if s.bad_steps >= s.cfg.train.max_bad_steps:
        raise MinitfError(f"{s.bad_steps} non-finite steps in a row at step {s.step}; training stopped and "
                          f"the last good checkpoint in {s.run_dir} is intact. Lower train.lr or use float32")
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


def record_eval(s: Session, lr: float, norm: float, elapsed: float, write, on_eval) -> None:
    """Evaluate, append the metrics, keep best.safetensors (rank 0 only)."""
    result = evaluate(s.raw_model, s.data, s.cfg, s.device, s.autocast)
    ckpt.append_metrics(s.run_dir, {
        "step": s.step, "train_loss": result["train"], "val_loss": result["val"], "val_bpb": result["val_bpb"],
        "lr": lr, "grad_norm": norm, "tokens_per_s": round(s.meter.tok_s), "elapsed_s": round(elapsed, 2),
        "tokens": s.step * s.meter.tokens_per_step})
    if on_eval is not None:
        on_eval(s.run_dir)
    write(f"step {s.step}: train {result['train']:.4f} | val {result['val']:.4f} | val bpb {result['val_bpb']:.3f}")
    if result["val"] < s.best_val:
        s.best_val = result["val"]
        ckpt.save_weights(s.raw_model, s.run_dir / ckpt.BEST, s.step)


def save_checkpoint(s: Session) -> None:
    """Weights and training state at s.step. Every rank's torch RNG and batch generator are
    gathered, so each resumes its own stream; rank 0 writes."""
    per_rank = [torch.cat([torch.get_rng_state(), s.batch_gen.get_state()]).to(s.device)]  # uint8
    if s.dist.world > 1:
        mine, per_rank = per_rank[0], [torch.empty_like(per_rank[0]) for _ in range(s.dist.world)]
        dist.all_gather(per_rank, mine)
    if not s.dist.main:
        return
    state = {"step": s.step, "optimizer": s.optimizer.state_dict(), "scaler": s.scaler.state_dict(),
             "rng": runtime.host_rng_state(), "rank_rng": [t.cpu() for t in per_rank],
             "elapsed": s.elapsed(), "best_val": s.best_val}
    ckpt.save_weights(s.raw_model, s.run_dir / ckpt.WEIGHTS, s.step)
    ckpt.save_state(state, s.run_dir / ckpt.STATE)


def restore_checkpoint(s: Session, log) -> None:
    """Weights, optimizer, counters and RNG streams from the run directory's last checkpoint."""
    state = ckpt.load_state(s.run_dir / ckpt.STATE)
    ckpt.load_weights(s.raw_model, s.run_dir / ckpt.WEIGHTS)
    s.optimizer.load_state_dict(state["optimizer"])
    s.scaler.load_state_dict(state["scaler"])
    s.step, s.elapsed_before, s.best_val = state["step"], state["elapsed"], state["best_val"]
    runtime.set_host_rng_state(state["rng"])
    if len(state["rank_rng"]) == s.dist.world:
        torch_rng, data_rng = state["rank_rng"][s.dist.rank].split(len(torch.get_rng_state()))
        torch.set_rng_state(torch_rng.clone())  # clone: set_state wants its own storage
        s.batch_gen.set_state(data_rng.clone())
    else:  # another world size: fresh, distinct streams per rank
        log(f"warning: checkpoint from {len(state['rank_rng'])} processes resumed on {s.dist.world}; "
            f"batches are reseeded")
        s.batch_gen.manual_seed(s.cfg.run.seed + s.dist.rank + 1000 * s.step)
    if s.dist.main:
        ckpt.truncate_metrics(s.run_dir, s.step)
    log(f"resuming {s.run_dir} at step {s.step}")


def _progress_bar(s: Session) -> tqdm:
    """Steps, or under a time budget seconds, so the ETA is the budget's, not max_steps'."""
    tc = s.cfg.train
    if tc.max_seconds is None:
        return tqdm(total=tc.max_steps, initial=s.step, disable=not s.dist.main, dynamic_ncols=True, unit="step")
    return tqdm(total=tc.max_seconds, initial=s.elapsed_before, disable=not s.dist.main, dynamic_ncols=True,
                unit="s", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]")
