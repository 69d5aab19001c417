"""The training loop: `train(cfg)` fits a Transformer and writes a run directory.

Read it top-down, as nanoGPT's train.py: `_train` is the whole run in view, in order: the device
and the run directory, the tokenizer and the data, the model (`Transformer(...)`), the optimizer,
then `_loop`, one screen: the LR from the schedule, one step, then a snapshot, an evaluation and a
checkpoint when due. `train_step` is one optimizer step, `forward_backward` its gradients: batch ->
forward -> loss -> backward -> clip. `record_eval` evaluates and logs.

The trainer calls the helpers in minitf/training/ downward and hands them nothing of its own: the
run directory and its lock, the data on every rank, resume and FSDP/DDP (setup.py), the run in
progress and its checkpoints (session.py), the progress bar and the closing lines (report.py).
The time budget's arithmetic is minitf/budget.py: the trainer times a few of its own steps and
gives it the seconds. Resume is exact: the weights, optimizer, schedule position, every RNG and
the batch sampler's generator are saved, so k steps + resume + (N - k) steps equal N steps bit
for bit (on CPU in float32).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from . import budget
from .config import Config
from .conversations.metrics import Metric, eval_metric
from .conversations.sft import template_tokens
from .data import TokenData
from .errors import MinitfError
from .evaluate import evaluate
from .export import hf
from .export.architecture import export_words
from .fast.lm_loss import IGNORE
from .model import Transformer
from .optim import lr_at, make_optimizer, schedule_progress, set_lr
from .rl.grpo import policy_loss
from .run_dir import TOKENIZER, is_run_dir, load_run
from .system import runtime
from .tokenizer import Tokenizer
from .training import checkpoint as ckpt
from .training import fsdp, lora, precision, setup, snapshots
from .training.naming import name_and_prompt
from .training.report import StepReport, say_how_it_ended
from .training.session import Session, finished, keep_best, last_good, save_checkpoint


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
    with setup.the_only_run_in_this_process():
        return _train(_own_config(cfg, resume, overrides), resume, log, on_eval)


def _train(cfg: Config, resume: bool, log, on_eval) -> Path:
    """The run in order: device, run directory, tokenizer and data, model, optimizer, the loop."""
    with contextlib.ExitStack() as held:  # the run directory's lock and the logger, until the run ends
        held.enter_context(runtime.kept_rng_state())  # training seeds the RNGs; the caller's come back
        procs, device = setup.processes_and_device(cfg)
        log = log if procs.main else setup.silent  # one process speaks for the run
        run_dir, changed = setup.claim_run_dir(cfg, resume, procs, held)  # locked, and checked

        # the tokenizer and the data: a resume's own tokenizer, or a pretrained model's, or trained here
        tokenizer = Tokenizer.load(run_dir / TOKENIZER) if resume else None
        pretrained = None
        dtype = runtime.resolve_dtype(cfg.train.dtype, device, sharded=cfg.train.parallel == "fsdp")
        held_in = precision.held_dtype(cfg.train, dtype)  # 16-bit matrices (LoRA, param_dtype), or None
        if cfg.run.init_from and not resume:  # a resume has its own weights and tokenizer
            pretrained, tokenizer = _load_pretrained(cfg.run.init_from, held_in)
            downloaded = not is_run_dir(Path(cfg.run.init_from))
            setup.take_pretrained_config(cfg, pretrained, tokenizer, downloaded, log)  # model.*, optimizer, rates
        if cfg.run.weights_dtype == "auto":  # init_from's own (a download's bfloat16 stays so), else float32
            cfg.run.weights_dtype = getattr(pretrained, "stored_dtype", "float32")
        # what the data's format asks of them: conversations, a chat template and its tokens (data_format.py)
        pretrained, tokenizer = setup.fit_to_format(cfg, pretrained, tokenizer, run_dir if resume else None, log)
        data = setup.token_data(cfg, procs, tokenizer, log)  # tokenized once into the token cache
        cfg.model.vocab_size = data.tokenizer.vocab_size

        # the model, fitted to a short time budget (fewer layers) before anything trains
        model = _new_model(cfg, device, pretrained)
        del pretrained  # the model holds its tensors now; LoRA's 16-bit copies must let the float32 ones go
        fit_started = time.time() if budget.applies(cfg, resume, procs.world) else None
        if fit_started is not None:  # the timed steps are paid from the budget
            model = _fit_to_budget(cfg, model, data, dtype, run_dir, log)
        # train.lora_rank: peft's adapters train (and a chat template's new tokens' rows), the rest is frozen
        model = lora.adapt(model, cfg.train, log, dtype, template_tokens(data.tokenizer))
        precision.hold(model, cfg.train)  # train.param_dtype=bfloat16: weights, gradients, moments in 2 bytes
        model.checkpoint_blocks = cfg.train.checkpoints_blocks(model.num_params(non_embedding=False))
        model.weights_dtype = getattr(torch, cfg.run.weights_dtype)  # what its weights files are written in
        if cfg.train.parallel == "fsdp" and procs.world > 1:  # before the optimizer: it must hold the shards
            fsdp.shard(model, device, dtype)
        if not resume:  # a new run's config.yaml states what it is: its name and a prompt for its own text
            name_and_prompt(cfg, data, log)

        # the optimizer, and the session that holds them all for the loop
        optimizer = make_optimizer(model, cfg.train, device)
        session = Session.create(
            cfg, model, optimizer, data, device, dtype=dtype, procs=procs, run_dir=run_dir, log=log
        )
        setup.restore_or_begin(session, resume, changed, held)  # a resume's checkpoint, or a new run's files
        setup.compile_and_wrap(session)  # train.compile, and DDP under torchrun
        log(setup.startup_line(session, export_words(cfg.model)))
        session.meter.step_last, session.t0 = session.step, fit_started or time.time()

        if not finished(session):
            _loop(session, on_eval, eval_metric(cfg, session.data, log))
    say_how_it_ended(session)
    if session.procs.world > 1:
        dist.barrier()
        # DDP's reducer holds the process group: let it go first, while every rank is still here. Left
        # to go at return, after the group, its gloo threads could wait forever for a rank already gone
        session.model = session.raw_model
        dist.destroy_process_group()
    return session.run_dir


def _loop(session: Session, on_eval, metric: Metric | None) -> None:
    """Steps until max_steps, the time budget or a stop signal; evaluations and checkpoints between."""
    tc = session.cfg.train
    expected = budget.budget_steps(tc)  # what the time budget buys on a typical machine: the warmup's share
    report = StepReport(session)  # the progress bar, and steps.jsonl every log_every steps
    # the step a resume starts from was evaluated when it was an evaluation step
    evaluated = session.step if session.step and session.step % tc.eval_every == 0 else None
    snapshots.begin(session)  # train.snapshot_every: what the history costs, refused if too much
    with runtime.tf32_matmuls(session.device), runtime.StopFlag(session.log) as stop:
        while session.step < tc.max_steps:
            lr = lr_at(session.step, schedule_progress(session.step, session.elapsed(), tc), tc, expected)
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
                record_eval(session, lr, norm, elapsed, report.write, on_eval, metric)
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
    loss_sum, norm = forward_backward(session)
    session.prefetch(session.cfg.train.grad_accum)  # on a GPU: the next batches, before the host waits
    loss, norm, elapsed, stop = _agreed(session, loss_sum, norm, interrupted)
    if math.isfinite(loss) and math.isfinite(norm):
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


def forward_backward(session: Session) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of one step over grad_accum micro-batches, unscaled and clipped.

    Returns (mean loss, grad norm) as tensors: nothing here waits for the device. Under DDP or
    FSDP the gradients are communicated only on the last micro-batch (fsdp.micro_batch), and
    under FSDP the norm is over all shards: clip_grad_norm_ on DTensor gradients reduces it.
    """
    tc, model, raw_model = session.cfg.train, session.model, session.raw_model
    loss_sum = None
    batches = [session.next_batch() for _ in range(tc.grad_accum)]  # (B, T) ids, and the next token of each
    shares = token_weights([b[1] for b in batches], session.procs.world)  # each micro-batch's share of the loss
    session.meter.count(sum(b[0].numel() for b in batches) * session.procs.world)  # the positions this step ran
    for micro, ((x, y, *advantages), share) in enumerate(zip(batches, shares)):
        sync = session.procs.world == 1 or micro == tc.grad_accum - 1
        with fsdp.micro_batch(model, raw_model, sync), session.autocast:
            if advantages:  # answers the model sampled (data.format=rl): each one's tokens weighed by its advantage
                loss = policy_loss(model, x, y, *advantages)
            else:
                _, loss = model(x, y, logits=False)  # the loss alone: the fused head where it applies (lm_loss)
            loss = loss * share
        session.scaler.scale(loss).backward()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    if tc.optimizer_in_backward:  # the weights were updated as their gradients came: the norm is the optimizer's
        return loss_sum, session.optimizer.gradient_norm()
    session.scaler.unscale_(session.optimizer)
    norm = nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip or float("inf"))
    return loss_sum, fsdp.full_tensor(norm)


@torch.no_grad()
def token_weights(ys: list[torch.Tensor], world: int) -> list[torch.Tensor]:
    """Each micro-batch's share of the step's loss: its learned targets (not IGNORE) over all the
    step's, across ranks. A micro-batch's loss is the mean over its own learned targets, so the
    shares make the step's loss the mean over all of them: a micro-batch of conversations with 5
    answer tokens counts 5/200 of one with 200, and text, where every target is learned, gets
    1 / grad_accum each. DDP averages gradients over ranks, so the shares are scaled by their
    number. Tensors, so that nothing here waits for a GPU."""
    counts = [(y != IGNORE).sum() for y in ys]  # learned targets per micro-batch
    total = torch.stack(counts).sum()
    if world > 1:
        dist.all_reduce(total)
    return [c * world / total.clamp(min=1) for c in counts]


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


def record_eval(session: Session, lr: float, norm: float, elapsed: float, write, on_eval, metric=None) -> None:
    """Evaluate, append the numbers to metrics.jsonl, and keep the best weights in best.safetensors.

    Rank 0 alone evaluates, or under fsdp every rank (each holds a shard of the weights: all
    evaluate the same batches, rank 0 writes).
    """
    result = evaluate(session.raw_model, session.data, session.cfg, session.device, session.autocast, metric)
    if session.procs.main:
        session.logger.log_eval(
            {
                "step": session.step,
                "train_loss": result["train"],
                "val_loss": result["val"],
                "val_bpb": result["val_bpb"],
                **result.get("metric", {}),  # the recipe's own (train.eval_metric)
                "lr": lr,
                "grad_norm": norm,
                "tokens_per_s": round(session.meter.tok_s),
                "elapsed_s": round(elapsed, 2),
                "tokens": session.meter.total,  # the positions the batches held
            }
        )
        if on_eval is not None:
            on_eval(session.run_dir)
        write(
            f"step {session.step}: train {result['train']:.4f} | val {result['val']:.4f} | "
            f"val bpb {result['val_bpb']:.3f}" + (f" | {metric.words(result['metric'])}" if "metric" in result else "")
        )
    keep_best(session, result["val"])  # best.safetensors, when this val loss is the lowest yet


# ---------------------------------------------------------------- what the set-up above calls


def _own_config(cfg: Config | str | Path, resume: bool, overrides) -> Config:
    """A copy of cfg to train by (set-up fills model.vocab_size in): a run directory with
    resume=True goes on with its own config.yaml, overrides on top."""
    if isinstance(cfg, (str, Path)):
        if not resume:
            raise MinitfError("train() takes a Config, or a run directory together with resume=True")
        return ckpt.resume_config([f"run.out_dir={cfg}", *overrides])
    return copy.deepcopy(cfg)


def _load_pretrained(path: str, frozen: torch.dtype | None) -> tuple[Transformer, Tokenizer]:
    """run.init_from: (model in train mode, tokenizer) from a minitf run directory or a local Hugging
    Face directory; the tokenizer carries the directory's chat template, if it has one. frozen: the
    16-bit dtype a download's matrices are loaded in (precision.held_dtype), or None."""
    if is_run_dir(Path(path)):
        model, tokenizer, cfg = load_run(path)
        model.stored_dtype = "float32" if cfg.run.weights_dtype == "auto" else cfg.run.weights_dtype
        return model.train(), tokenizer
    return hf.load_pretrained(path, frozen=frozen)


def _new_model(cfg: Config, device: torch.device, pretrained: Transformer | None = None) -> Transformer:
    """A new Transformer for cfg.model, the same on every rank, with the pretrained weights if any."""
    torch.manual_seed(cfg.run.seed)  # the same weights on every rank; a pretrained one's LoRA and dropout draws too
    if pretrained is not None:  # its own tensors: a downloaded model is never held twice
        return Transformer.holding(cfg.model, pretrained.state_dict()).to(device)
    return Transformer(cfg.model).to(device)


def _fit_to_budget(
    cfg: Config, model: Transformer, data: TokenData, dtype: torch.dtype, run_dir: Path, log
) -> Transformer:
    """The model for the steps the time budget buys on this machine (budget.fit): model itself, or
    a new one if the depth changed. This trainer's own step is timed on a copy of it."""
    device = next(model.parameters()).device
    probe_model = copy.deepcopy(model)
    optimizer = make_optimizer(probe_model, cfg.train, device)
    probe = Session.create(cfg, probe_model, optimizer, data, device, dtype=dtype, run_dir=run_dir, log=log)
    log(budget.fit(cfg, *time_steps(probe)))
    return model if cfg.model.n_layer == len(model.blocks) else _new_model(cfg, device)


def time_steps(probe: Session) -> tuple[float, bool]:
    """(seconds per step, timed in full) of train_step on probe, for as many steps as
    budget.keep_timing asks. The RNGs are left as they were: the run's own draws are not spent."""
    seconds: list[float] = []
    with torch.random.fork_rng(devices=[probe.device] if probe.device.type == "cuda" else []):
        while budget.keep_timing(probe.cfg.train, seconds):
            t0 = time.perf_counter()
            train_step(probe, probe.cfg.train.lr, False)  # ends in a host sync: the time is the device's too
            seconds.append(time.perf_counter() - t0)
    return budget.step_seconds(seconds)
