"""Where a training step's time goes: `minitf bench --only profile` runs the trainer's own step
(trainer.train_step on the recipe's real data) under torch.profiler and reports the time by phase
(data, forward, backward, clip, optimizer, and the rest of the step: the host sync and Python)
and by operator (self time, so each microsecond is counted once).

Phases are the trainer's `phase(...)` spans; on a CPU the operators run on the calling thread
(intra-op threads work inside them), so phase and operator times add up to the step's wall time.
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from minitf.config import Config
from minitf.data import prepare_data
from minitf.model import Transformer
from minitf.trainer import train_step
from minitf.training.session import Session

PHASES = ("data", "forward", "backward", "clip", "optimizer")


def profile_step(cfg: Config, device: torch.device, steps: int = 20, warmup: int = 5, top: int = 12) -> dict:
    """Profile `steps` training steps after `warmup` (compilation, if any, happens there)."""
    data = prepare_data(cfg.data, log=lambda *a: None)
    cfg.model.vocab_size = data.tokenizer.vocab_size
    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model).to(device)
    session = Session.create(cfg, model, data, device)
    if cfg.train.compile:
        model.compile_regions()
    for _ in range(warmup):
        train_step(session, cfg.train.lr, interrupted=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            train_step(session, cfg.train.lr, interrupted=False)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    ms = lambda us: us / 1000 / steps  # noqa: E731 (total microseconds -> ms per step)
    phases = {p: 0.0 for p in PHASES}
    for e in events:
        name = e.key.removeprefix("phase: ")
        if e.key.startswith("phase: ") and name in phases:
            phases[name] += ms(e.cpu_time_total)
    step_ms = wall * 1000 / steps
    phases["rest of the step"] = max(0.0, step_ms - sum(phases.values()))
    ops = sorted(
        (e for e in events if not e.key.startswith(("phase: ", "Optimizer.", "autograd::", "## "))),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    return {
        "dtype": str(session.dtype).split(".")[-1],
        "compile": cfg.train.compile,
        "ms_per_step": round(step_ms, 2),
        "tokens_per_s": round(cfg.train.batch_size * cfg.model.block_size * cfg.train.grad_accum / wall * steps),
        "phases_ms": {k: round(v, 2) for k, v in phases.items()},
        "operators_ms": {e.key: round(ms(e.self_cpu_time_total), 2) for e in ops[:top]},
    }


def describe(r: dict) -> list[str]:
    """The profile as lines: each phase and operator with its share of the step."""
    step = r["ms_per_step"]
    lines = [f"profile   {step} ms/step, {r['tokens_per_s']:,} tokens/s ({r['dtype']}, compile {r['compile']})"]
    lines += [f"  phase     {k:<40} {v:8.2f} ms {100 * v / step:5.1f} %" for k, v in r["phases_ms"].items()]
    lines += [f"  operator  {k[:40]:<40} {v:8.2f} ms {100 * v / step:5.1f} %" for k, v in r["operators_ms"].items()]
    return lines
