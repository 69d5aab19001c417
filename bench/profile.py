"""Where a training step's time goes: `minitf bench --only profile` runs the trainer's own step
(trainer.train_step on the recipe's real data) under torch.profiler and reports the time by phase
(data, forward, backward, clip, optimizer, and the rest of the step: the host sync and Python)
and by operator (self time, so each microsecond is counted once).

The phases are spans this benchmark opens and closes from its own hooks around the trainer's
unchanged step (`PhaseSpans`): the batch the data hands out, the model's forward (module hooks),
backward (from the loss's scaling to the unscaling of the gradients), clipping (from there to
the optimizer) and the optimizer step (the gradient scaler's step). On a CPU the operators run on
the calling thread (intra-op threads work inside them), so phase and operator times add up to the
step's wall time.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from minitf.config import Config
from minitf.corpus.prepare import prepare_data
from minitf.model import Transformer
from minitf.optim import make_optimizer
from minitf.trainer import train_step
from minitf.training.session import Session

PHASES = ("data", "forward", "backward", "clip", "optimizer")


def profile_step(cfg: Config, device: torch.device, steps: int = 20, warmup: int = 5, top: int = 12) -> dict:
    """Profile `steps` training steps after `warmup` (compilation, if any, happens there)."""
    data = prepare_data(cfg.data, log=lambda *a: None)
    cfg.model.vocab_size = data.tokenizer.vocab_size
    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model).to(device)
    optimizer = make_optimizer(model, cfg.train, device)
    session = Session.create(cfg, model, optimizer, data, device, run_dir=Path(tempfile.gettempdir()))  # writes nothing
    PhaseSpans(session)
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


class PhaseSpans:
    """Named torch.profiler spans ("phase: forward", ...) around the parts of the trainer's step,
    opened and closed by hooks on the session's data, model and gradient scaler: the trainer's
    loop is measured as it is, with nothing added to it for the benchmark."""

    def __init__(self, session: Session):
        self.open: tuple[str, record_function] | None = None
        data, scaler = session.data, session.scaler
        get_batch, scale, unscale, step = data.get_batch, scaler.scale, scaler.unscale_, scaler.step
        elapsed = session.elapsed
        data.get_batch = lambda *a, **k: self.around("data", get_batch, *a, **k)
        session.raw_model.register_forward_pre_hook(lambda *a: self.begin("forward"))
        session.raw_model.register_forward_hook(lambda *a: self.end())
        scaler.scale = lambda loss: self.then("backward", scale, loss)  # backward() follows at once
        scaler.unscale_ = lambda opt: self.begin("clip") or unscale(opt)  # then clip_grad_norm_
        session.elapsed = lambda: self.end() or elapsed()  # the step's statistics, after clipping
        scaler.step = lambda opt: self.around("optimizer", step, opt)

    def begin(self, name: str) -> None:
        self.end()  # the span before it (the backward of the last micro-batch) ends here
        span = record_function(f"phase: {name}")
        span.__enter__()
        self.open = (name, span)

    def end(self) -> None:
        if self.open is not None:
            self.open[1].__exit__(None, None, None)
            self.open = None

    def then(self, name: str, fn, *args):
        """Call fn, then open the span of what the trainer does next."""
        out = fn(*args)
        self.begin(name)
        return out

    def around(self, name: str, fn, *args, **kwargs):
        self.begin(name)
        try:
            return fn(*args, **kwargs)
        finally:
            self.end()
