"""The training loop: `train(cfg)` fits a Transformer and writes a run directory.

One process, or one per GPU/CPU under torchrun (DistributedDataParallel). Resume is exact: the
weights, optimizer, schedule position, every RNG and the batch sampler's generator are saved, so
k steps + resume + (N - k) steps equal N steps bit for bit (on CPU in float32).
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from tqdm import tqdm

from . import checkpoint as ckpt
from .config import Config, ConfigError, MinitfError, TrainConfig, load_config
from .data import TokenData, bits_per_byte, prepare_data
from .model import Transformer
from .plotting import plot_runs
from .tokenizer import Tokenizer

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12}


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_kind: str) -> Dist:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is a single process."""
    if "RANK" not in os.environ:
        return Dist()
    d = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return d


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA GPU is visible; use run.device=auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("run.device=mps but MPS is not available; use run.device=auto or cpu")
    return torch.device(f"cuda:{local_rank}") if name == "cuda" else torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def keep_freed_memory() -> None:
    """Have the C library keep freed memory for reuse instead of handing it back to the OS.

    glibc serves blocks of 32 MB and more (the default recipe's logits, 8 x 256 x 4096 floats,
    and their gradients) from fresh mmap pages and unmaps them when freed, so every training
    step faulted in and zero-filled ~50,000 pages again: measured 2.1 million page faults in 45
    steps, and 25-35 % of the step time on 2 CPU cores. Without mmap and trimming those pages
    stay with the process for the next step; peak memory is unchanged. Process-wide, so it is
    called by train(), not on import. No-op where the C library has no mallopt (macOS).
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def make_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on the matrices of linear layers.

    Decay pulls weights toward zero. That regularises the matrices that mix features, but on a
    norm's gain or a bias it only fights the scale the layer needs, and on embeddings it would
    shrink the rows of rare tokens, which get few gradient updates to push back.
    """
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay -= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}  # tied head
    params = list(dict.fromkeys(model.parameters()))  # tied weights once
    groups = [{"params": [p for p in params if id(p) in decay], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}]
    # the fused kernel updates all tensors in one pass: ~15% faster steps on a small CPU model
    return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2),
                             fused=device.type in ("cuda", "cpu"))


def lr_at(step: int, progress: float, tc: TrainConfig) -> float:
    """Linear warmup over warmup_steps, times a cosine from lr to min_lr over progress 0 -> 1.

    progress is the fraction of max_steps done, or of max_seconds when that is the nearer limit,
    so a time-budgeted run still anneals to min_lr.
    """
    warm = min(1.0, (step + 1) / tc.warmup_steps) if tc.warmup_steps else 1.0
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return warm * (tc.min_lr + (tc.lr - tc.min_lr) * cosine)


def flops_per_token(model: Transformer) -> float:
    """6N for the matmuls forward and backward, plus 12·L·C·T for attention's scores and sum."""
    c = model.config
    return 6 * model.num_params() + 12 * c.n_layer * c.n_embd * c.block_size


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in PEAK_BF16_FLOPS.items() if key in name), None)


@torch.no_grad()
def evaluate(model, data: TokenData, cfg: Config, device, autocast) -> dict:
    """Mean loss over eval_batches fixed batches per split (the same batches at every eval)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        g = torch.Generator().manual_seed(cfg.run.seed + 999)
        losses = []
        for _ in range(cfg.train.eval_batches):
            x, y = data.get_batch(split, cfg.train.batch_size, cfg.model.block_size, g, device)
            with autocast:
                losses.append(model(x, y)[1].item())
        out[split] = sum(losses) / len(losses)
    model.train()
    out["val_bpb"] = bits_per_byte(out["val"], data.bytes_per_token("val"))
    return out


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


def host_rng_state() -> dict:
    """The RNGs shared by all ranks (python, numpy, CUDA); per-rank ones are saved beside them."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()),
                                                    *np_state[2:]),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_host_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state((s["numpy"][0], s["numpy"][1].numpy(), *s["numpy"][2:]))
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def check_run_dir(cfg: Config, resume: bool) -> Path:
    run_dir = Path(cfg.run.out_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.out_dir {str(run_dir)!r} is a file; choose a directory path")
    has_ckpt = (run_dir / ckpt.STATE).is_file()
    if resume and not has_ckpt:
        raise MinitfError(f"{run_dir} has no checkpoint to resume; drop --resume to start a new run")
    if not resume and has_ckpt:
        raise MinitfError(f"{run_dir} already holds a run; pass --resume to continue it, or set "
                          f"run.out_dir to a new directory")
    if resume:
        saved = load_config(run_dir / ckpt.CONFIG).model
        saved.vocab_size = cfg.model.vocab_size = None
        if saved != cfg.model:
            diff = [k for k in vars(saved) if getattr(saved, k) != getattr(cfg.model, k)]
            raise ConfigError(f"--resume with a different model config ({', '.join('model.' + k for k in diff)}"
                              f"); resume with the run's own settings or start a new run.out_dir")
    return run_dir


class _StopFlag:
    """Ctrl-C sets a flag; the loop finishes its step, saves and exits. A second Ctrl-C aborts."""

    def __init__(self):
        self.set = False

    def __enter__(self):
        self.old = signal.getsignal(signal.SIGINT)
        if self.old is not None:
            signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_):
        if self.set:
            raise KeyboardInterrupt
        self.set = True

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def train(cfg: Config, resume: bool = False, log=print) -> Path:
    """Train per `cfg` and return the run directory. `resume` continues its last checkpoint."""
    d = setup_distributed("cuda" if cfg.run.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    log = log if d.main else (lambda *a, **k: None)
    device = resolve_device(cfg.run.device, d.local_rank)
    keep_freed_memory()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls: ~free speed, bf16 does the rest
        torch.backends.cudnn.allow_tf32 = True
    run_dir = check_run_dir(cfg, resume)
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
    optimizer = make_optimizer(model, tc, device)
    dtype = resolve_dtype(tc.dtype, device)
    autocast = (torch.autocast(device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    gen = torch.Generator().manual_seed(cfg.run.seed + d.rank)  # each rank its own batches
    step, elapsed_before, best_val, bad_steps = 0, 0.0, float("inf"), 0

    if resume:
        state = ckpt.load_state(run_dir / ckpt.STATE)
        ckpt.load_weights(model, run_dir / ckpt.WEIGHTS)
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        step, elapsed_before, best_val = state["step"], state["elapsed"], state["best_val"]
        set_host_rng_state(state["rng"])
        if len(state["rank_rng"]) == d.world:
            torch_rng, data_rng = state["rank_rng"][d.rank].split(len(torch.get_rng_state()))
            torch.set_rng_state(torch_rng.clone())  # clone: set_state wants its own storage
            gen.set_state(data_rng.clone())
        else:  # another world size: fresh, distinct streams per rank
            log(f"warning: checkpoint from {len(state['rank_rng'])} processes resumed on {d.world}; "
                f"batches are reseeded")
            gen.manual_seed(cfg.run.seed + d.rank + 1000 * step)
        if d.main:
            ckpt.truncate_metrics(run_dir, step)
        log(f"resuming {run_dir} at step {step}")
    elif d.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_run_files(run_dir, cfg, data.tokenizer)

    raw_model = model
    if tc.compile:
        model = torch.compile(model)
    if d.world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    B, T = tc.batch_size, cfg.model.block_size
    tokens_per_step = B * T * tc.grad_accum * d.world
    log(f"model: {raw_model.num_params():,} parameters | device {device} | dtype {str(dtype).split('.')[-1]}"
        f" | global batch {B} x {tc.grad_accum} accum x {d.world} procs = {B * tc.grad_accum * d.world}"
        f" sequences of {T} = {tokens_per_step:,} tokens")
    peak = peak_flops(device)
    flops_step = flops_per_token(raw_model) * tokens_per_step

    def save(final_step: int) -> None:
        # every rank's torch RNG and batch generator, so each resumes its own stream
        per_rank = [torch.cat([torch.get_rng_state(), gen.get_state()]).to(device)]  # uint8
        if d.world > 1:
            mine, per_rank = per_rank[0], [torch.empty_like(per_rank[0]) for _ in range(d.world)]
            dist.all_gather(per_rank, mine)
        if not d.main:
            return
        state = {"step": final_step, "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                 "rng": host_rng_state(), "rank_rng": [t.cpu() for t in per_rank],
                 "elapsed": elapsed_before + time.time() - t0, "best_val": best_val}
        ckpt.save_weights(raw_model, run_dir / ckpt.WEIGHTS, final_step)
        ckpt.save_state(state, run_dir / ckpt.STATE)

    t0 = time.time()
    t_last, step_last, tok_s, elapsed = t0, step, 0.0, elapsed_before
    # under a time budget the bar counts seconds, so its ETA is the budget's, not max_steps'
    budget = tc.max_seconds is not None
    bar = tqdm(total=tc.max_seconds if budget else tc.max_steps, initial=elapsed_before if budget else step,
               disable=not d.main, dynamic_ncols=True, unit="s" if budget else "step",
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]" if budget else None)
    model.train()
    stop_reason = "max_steps"
    with _StopFlag() as interrupted:
        while step < tc.max_steps:
            elapsed = elapsed_before + time.time() - t0
            progress = step / tc.max_steps
            if tc.max_seconds:
                progress = max(progress, elapsed / tc.max_seconds)
            lr = lr_at(step, progress, tc)
            for group in optimizer.param_groups:
                group["lr"] = lr

            loss_sum, norm = forward_backward(model, raw_model, lambda: data.get_batch("train", B, T, gen, device),
                                              optimizer, scaler, autocast, tc, distributed=d.world > 1)

            # one small collective keeps every rank's decisions (skip, stop) identical; the grad
            # norm is already equal on all ranks after DDP's all-reduce, so averaging keeps it
            elapsed = elapsed_before + time.time() - t0
            host = torch.tensor([elapsed, float(interrupted.set)], dtype=torch.float64, device=device)
            stats = torch.cat([torch.stack([loss_sum.double(), norm.double()]), host])
            if d.world > 1:
                dist.all_reduce(stats)
                stats /= d.world
            loss_val, norm_val, elapsed, stop_flag = stats.tolist()  # the step's one host sync
            stop_now = stop_flag > 0
            if math.isfinite(loss_val) and math.isfinite(norm_val):
                scaler.step(optimizer)
                scaler.update()
                bad_steps = 0
            else:
                bad_steps += 1
                log(f"warning: step {step}: non-finite loss {loss_val} or grad norm {norm_val}; step skipped")
            optimizer.zero_grad(set_to_none=True)
            if bad_steps >= tc.max_bad_steps:
                raise MinitfError(f"{bad_steps} non-finite steps in a row at step {step}; training stopped and "
                                  f"the last good checkpoint in {run_dir} is intact. Lower train.lr or use float32")
            step += 1
            bar.update(min(elapsed, tc.max_seconds) - bar.n if budget else 1)

            if step % tc.log_every == 0 or step == tc.max_steps:
                now = time.time()
                tok_s = tokens_per_step * (step - step_last) / max(now - t_last, 1e-9)
                t_last, step_last = now, step
                post = {"step": step, "loss": f"{loss_val:.3f}", "lr": f"{lr:.2e}", "tok/s": f"{tok_s:,.0f}"}
                if peak:
                    post["mfu"] = f"{100 * flops_step * tok_s / tokens_per_step / (peak * d.world):.1f}%"
                bar.set_postfix(post)
            out_of_time = tc.max_seconds is not None and elapsed >= tc.max_seconds
            last = step == tc.max_steps or out_of_time or stop_now
            if d.main and (step % tc.eval_every == 0 or last):
                ev = evaluate(raw_model, data, cfg, device, autocast)
                ckpt.append_metrics(run_dir, {
                    "step": step, "train_loss": ev["train"], "val_loss": ev["val"], "val_bpb": ev["val_bpb"],
                    "lr": lr, "grad_norm": norm_val, "tokens_per_s": round(tok_s),
                    "elapsed_s": round(elapsed, 2), "tokens": step * tokens_per_step})
                plot_runs([run_dir], run_dir / "loss.png")
                bar.write(f"step {step}: train {ev['train']:.4f} | val {ev['val']:.4f} | val bpb {ev['val_bpb']:.3f}")
                if ev["val"] < best_val:
                    best_val = ev["val"]
                    ckpt.save_weights(raw_model, run_dir / ckpt.BEST, step)
            if step % tc.ckpt_every == 0 or last:
                save(step)
            if last:
                stop_reason = "interrupted" if stop_now else "time budget" if out_of_time else "max_steps"
                break
    bar.close()
    log(f"stopped at step {step} ({stop_reason}) after {elapsed:.0f}s; best val loss {best_val:.4f}")
    log(f"run directory: {run_dir}\nsample from it: python scripts/generate.py --run {run_dir}")
    if d.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return run_dir
