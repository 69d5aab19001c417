"""The training loop: `train(cfg)` fits a Transformer and writes a run directory.

Read it top-down. `train` sets a run up, runs `_loop` and says how it ended. `_loop` is the loop,
one screen: the LR from the schedule, one step, then a snapshot, an evaluation and a checkpoint when due.
`train_step` is one optimizer step, `forward_backward` its gradients: batch -> forward -> loss ->
backward -> clip. `record_eval` evaluates and logs.

What stands around the loop is in minitf/training/: the set-up before it (device, data, model,
optimizer, DDP or FSDP, the time budget's choice of depth: setup.py), the run in progress and its
checkpoints (session.py), the time budget (budget.py), the progress bar and the closing lines
(report.py). Resume is exact: the weights, optimizer, schedule position, every RNG and the batch
sampler's generator are saved, so k steps + resume + (N - k) steps equal N steps bit for bit (on
CPU in float32).
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import Config, ModelConfig, TrainConfig
from .errors import MinitfError
from .evaluate import evaluate
from .export import hf
from .export.architecture import FORMAT_NAMES, format_or_none
from .optim import lr_at, schedule_progress, set_lr
from .system import runtime
from .training import budget, fsdp, setup, snapshots
from .training import checkpoint as ckpt
from .training.report import StepReport, say_how_it_ended
from .training.session import Session, finished, last_good, save_checkpoint


def train(
    cfg: Config | str | Path,
    resume: bool = False,
    log=print,
    on_eval: Callable[[Path], None] | None = None,
    overrides=(),
) -> Path:
    """Train per `cfg` and return the run directory. `resume` continues its last checkpoint.

    cfg may also be a run directory, with resume=True: the run goes on with its own config.yaml,
    and `overrides` (dotted strings) on top. on_eval(run_dir) is called on rank 0 after each
    evaluation has been appended to metrics.jsonl (minitf.train and scripts/train.py draw loss.png
    there). cfg itself is left unchanged.

    One run at a time per process: a run seeds torch's process-wide random generator and draws its
    initial weights and dropout masks from it, so a second train() while one runs (from another
    thread) is refused rather than making both irreproducible. Train one after the other, or in
    separate processes.
    """
    if not _ONE_RUN.acquire(blocking=False):
        raise MinitfError(
            "minitf.train is already running in this process (another thread); a run draws its weights and "
            "dropout from torch's process-wide random generator, so two at once would make neither reproducible: "
            "train one after the other, or in separate processes"
        )
    try:
        return _train(cfg, resume, log, on_eval, overrides)
    finally:
        _ONE_RUN.release()


_ONE_RUN = threading.Lock()  # held while a train() runs in this process


def _train(cfg, resume: bool, log, on_eval, overrides) -> Path:
    """Set the run up, train it, say how it ended."""
    if isinstance(cfg, (str, Path)):
        if not resume:
            raise MinitfError("train() takes a Config, or a run directory together with resume=True")
        cfg = ckpt.resume_config([f"run.out_dir={cfg}", *overrides])
    cfg = copy.deepcopy(cfg)
    with contextlib.ExitStack() as held:  # the run directory's lock, until train() returns or fails
        held.enter_context(runtime.kept_rng_state())  # training seeds the RNGs; the caller's come back
        # set-up may not import this layer's step or the exports: it is handed them
        session = setup.start(
            cfg, resume, log, held, step=train_step, load_pretrained=hf.load_pretrained, export_words=_export_words
        )
        if not finished(session):
            _loop(session, on_eval)
    say_how_it_ended(session)
    if session.procs.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return session.run_dir


def _loop(session: Session, on_eval) -> None:
    """Steps until max_steps, the time budget or a stop signal; evaluations and checkpoints between."""
    tc = session.cfg.train
    report = StepReport(session)  # the progress bar, and steps.jsonl every log_every steps
    # the step a resume starts from was evaluated when it was an evaluation step
    evaluated = session.step if session.step and session.step % tc.eval_every == 0 else None
    snapshots.begin(session)  # train.snapshot_every: what the history costs, refused if too much
    with runtime.tf32_matmuls(session.device), runtime.StopFlag(session.log) as stop:
        while session.step < tc.max_steps:
            lr = lr_at(session.step, schedule_progress(session.step, session.elapsed(), tc), tc)
            loss, norm, elapsed, stop_now = train_step(session, lr, stop.signal is not None)
            session.step += 1
            report.step(loss, lr, norm, elapsed)
            snapshots.keep(session)  # the weights of this step, when it is a multiple of snapshot_every
            end = _stop_reason(session, elapsed, stop_now, stop.signal)  # None: the loop goes on
            # the last step evaluates too, unless the step before it just did (an evaluation that
            # used up the time budget leaves one more step, and the same numbers again)
            due = session.step % tc.eval_every == 0 or (end and evaluated != session.step - 1)
            if due and (session.procs.main or session.sharded):
                if end:
                    report.write(f"final evaluation ({tc.eval_batches} batches of train and val)...")
                record_eval(session, lr, norm, elapsed, report.write, on_eval)
                evaluated = session.step
            if session.step % tc.ckpt_every == 0 or end:
                if end:
                    report.write(f"saving the checkpoint of step {session.step} in {session.run_dir}...")
                save_checkpoint(session)
            if end:
                session.stop_reason = end
                break
    report.close()


def _stop_reason(session: Session, elapsed: float, stop_now: bool, signal: str | None) -> str | None:
    """Why the loop ends after this step (the time budget, a stop signal, max_steps), or None."""
    if budget.spent(session.cfg.train, elapsed):
        return budget.OUT_OF_TIME
    if stop_now:
        return f"interrupted by {signal or 'a signal on another rank'}"
    return "max_steps" if session.step == session.cfg.train.max_steps else None


def train_step(session: Session, lr: float, interrupted: bool) -> tuple[float, float, float, bool]:
    """One optimizer step at learning rate lr; a non-finite loss or gradient skips it.

    Returns (loss, grad norm, elapsed seconds, stop) as all ranks agree on them (`_agreed`).
    """
    set_lr(session.optimizer, lr)
    loss_sum, norm = forward_backward(
        session.model,
        session.raw_model,
        session.next_batch,
        session.optimizer,
        session.scaler,
        session.autocast,
        session.cfg.train,
        distributed=session.procs.world > 1,
    )
    loss, norm, elapsed, stop = _agreed(session, loss_sum, norm, interrupted)
    if math.isfinite(loss) and math.isfinite(norm):
        with phase("optimizer"):
            session.scaler.step(session.optimizer)
            session.scaler.update()
        session.bad_steps = 0
    elif session.scaler.is_enabled() and math.isfinite(loss):
        session.scaler.update()  # float16 gradients overflowed: the scaler halves its scale, the step is skipped
    else:
        session.bad_steps += 1
        session.log(f"warning: step {session.step}: non-finite loss {loss} or grad norm {norm}; step skipped")
    session.optimizer.zero_grad(set_to_none=True)
    if session.bad_steps >= session.cfg.train.max_bad_steps:
        raise MinitfError(
            f"{session.bad_steps} non-finite steps in a row at step {session.step}; training stopped and "
            f"{last_good(session)}. Lower train.lr or use float32"
        )
    return loss, norm, elapsed, stop


def _agreed(
    session: Session, loss_sum: torch.Tensor, norm: torch.Tensor, interrupted: bool
) -> tuple[float, float, float, bool]:
    """(loss, grad norm, elapsed seconds, stop), averaged over the ranks in one small collective.

    Every rank then takes the same decisions (skip, stop), and it is the step's one host sync. The
    grad norm is the same on every rank (DDP all-reduced the gradients; under FSDP it is the norm
    over all shards), so averaging keeps it.
    """
    host = torch.tensor([session.elapsed(), float(interrupted)], dtype=torch.float64, device=session.device)
    stats = torch.cat([torch.stack([loss_sum.double(), norm.double()]), host])  # (4,)
    if session.procs.world > 1:
        dist.all_reduce(stats)
        stats /= session.procs.world
    loss, norm, elapsed, stop_flag = stats.tolist()
    return loss, norm, elapsed, stop_flag > 0


def forward_backward(
    model, raw_model, next_batch, optimizer, scaler, autocast, tc: TrainConfig, distributed: bool = False
):
    """Gradients of one step over grad_accum micro-batches, unscaled and clipped.

    Returns (mean loss, grad norm) as tensors: nothing here waits for the device. Under DDP or
    FSDP the gradients are communicated only on the last micro-batch (fsdp.micro_batch), and
    under FSDP the norm is over all shards: clip_grad_norm_ on DTensor gradients reduces it.
    """
    loss_sum = None
    for micro in range(tc.grad_accum):
        with phase("data"):
            x, y = next_batch()  # (B, T) token ids, and the next token of each: (B, T)
        sync = not distributed or micro == tc.grad_accum - 1
        with fsdp.micro_batch(model, raw_model, sync), autocast, phase("forward"):
            _, loss = model(x, y, logits=False)  # the loss alone: the fused head where it applies (lm_loss)
            loss = loss / tc.grad_accum
        with phase("backward"):
            scaler.scale(loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    with phase("clip"):
        scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
    return loss_sum, fsdp.plain(norm)


def phase(name: str):
    """A named span for torch.profiler, which `minitf bench --only profile` sums time by; a few
    microseconds when no profiler runs."""
    return torch.profiler.record_function(f"phase: {name}")


def record_eval(session: Session, lr: float, norm: float, elapsed: float, write, on_eval) -> None:
    """Evaluate, append the numbers to metrics.jsonl, and keep the best weights in best.safetensors.

    Rank 0 alone evaluates, or under fsdp every rank (each holds a shard of the weights: all
    evaluate the same batches, rank 0 writes).
    """
    result = evaluate(session.raw_model, session.data, session.cfg, session.device, session.autocast)
    if session.procs.main:
        session.logger.log_eval(
            {
                "step": session.step,
                "train_loss": result["train"],
                "val_loss": result["val"],
                "val_bpb": result["val_bpb"],
                "lr": lr,
                "grad_norm": norm,
                "tokens_per_s": round(session.meter.tok_s),
                "elapsed_s": round(elapsed, 2),
                "tokens": session.step * session.meter.tokens_per_step,
            }
        )
        if on_eval is not None:
            on_eval(session.run_dir)
        write(
            f"step {session.step}: train {result['train']:.4f} | val {result['val']:.4f} | "
            f"val bpb {result['val_bpb']:.3f}"
        )
    val = fsdp.rank0_value(result["val"], session.device) if session.sharded else result["val"]
    session.last_val = (session.step, val)
    if val < session.best_val:  # sharded, every rank takes this branch together: the weights are gathered
        session.best_val, session.best_step = val, session.step
        fsdp.save_full_weights(
            session.raw_model,
            session.run_dir / ckpt.BEST,
            session.step,
            session.data.tokenizer.hash,
            session.procs.main,
        )


def _export_words(model: ModelConfig) -> str:
    """Where the trained model can go (minitf export / export-gguf), for the start-up line."""
    fmt = format_or_none(model)
    if fmt is None:
        return "exports to no standard architecture (minitf export names the settings that block it)"
    return f"exports as {FORMAT_NAMES[fmt]}"
