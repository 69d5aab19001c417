"""The training loop: `train(cfg)` fits a Transformer and writes a run directory.

One process, or one per GPU/CPU under torchrun: DistributedDataParallel, or with train.parallel=fsdp
the model sharded over the processes (FSDP2; fsdp.py). Resume is exact: the
weights, optimizer, schedule position, every RNG and the batch sampler's generator are saved, so
k steps + resume + (N - k) steps equal N steps bit for bit (on CPU in float32).

Read `train` first, then `_loop`: the loop. `start` builds a `Session` (the model, optimizer,
data and counters of one run; session.py, with checkpoint saving and restoring), `train_step` is
one optimizer step, and `record_eval` evaluates and logs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import Config, DataConfig, SampleConfig, TrainConfig, recipes
from .data import prepare_data
from .errors import MinitfError
from .evaluate import evaluate
from .export import hf
from .export.architecture import FORMAT_NAMES, format_or_none
from .model import Transformer
from .optim import lr_at, schedule_progress, set_lr
from .system import runtime
from .system.progress import progress_bar
from .tokenizer import Tokenizer
from .training import budget, fsdp
from .training import checkpoint as ckpt
from .training.metrics import Logger, check_log_dir
from .training.session import (
    Session,
    explain_changes,
    finished,
    last_good,
    restore_checkpoint,
    save_checkpoint,
)


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
    if isinstance(cfg, (str, Path)):
        if not resume:
            raise MinitfError("train() takes a Config, or a run directory together with resume=True")
        cfg = ckpt.resume_config([f"run.out_dir={cfg}", *overrides])
    cfg = copy.deepcopy(cfg)
    with contextlib.ExitStack() as held:  # the run directory's lock, until train() returns or fails
        held.enter_context(runtime.kept_rng_state())  # training seeds the RNGs; the caller's come back
        run = start(cfg, resume, log, held)
        if not finished(run):
            _loop(run, on_eval)
    run.log(
        f"stopped at step {run.step} ({run.stop_reason}) after {run.elapsed():.0f}s; best val loss {run.best_val:.4f}"
    )
    note = budget.short_run_note(run.cfg.train, run.step, run.stop_reason, run.run_dir)
    if note is not None:
        run.log(note)
    run.log(f"run directory: {run.run_dir}\nsample from it: minitf generate --run {shlex.quote(str(run.run_dir))}")
    if run.dist.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return run.run_dir


def _loop(run: Session, on_eval) -> None:
    """Steps until max_steps, the time budget, or a stop signal; evaluations and checkpoints between."""
    cfg = run.cfg
    bar = _progress_bar(run)
    # the step a resume starts from was evaluated when it was an evaluation step
    evaluated = run.step if run.step and run.step % cfg.train.eval_every == 0 else None
    with runtime.tf32_matmuls(run.device), runtime.StopFlag(run.log) as stop:
        while run.step < cfg.train.max_steps:
            lr = lr_at(run.step, schedule_progress(run.step, run.elapsed(), cfg.train), cfg.train)
            loss, norm, elapsed, stop_now = train_step(run, lr, stop.signal is not None)
            run.step += 1
            bar.update(min(elapsed, cfg.train.max_seconds) - bar.n if cfg.train.max_seconds else 1)
            if run.step % cfg.train.log_every == 0 or run.step == cfg.train.max_steps:
                bar.set_postfix(run.meter.update(run.step, loss, lr))
                if run.logger is not None:
                    run.logger.log_step(
                        {
                            "step": run.step,
                            "loss": loss,
                            "lr": lr,
                            "grad_norm": norm,
                            "tokens_per_s": round(run.meter.tok_s),
                            "elapsed_s": round(elapsed, 2),
                            **({"mfu": run.meter.mfu} if run.meter.peak else {}),
                        }
                    )

            out_of_time = cfg.train.max_seconds is not None and elapsed >= cfg.train.max_seconds
            last = run.step == cfg.train.max_steps or out_of_time or stop_now
            # the last step evaluates too, unless the step before it just did (an evaluation that
            # used up the time budget leaves one more step, and the same numbers again)
            due = run.step % cfg.train.eval_every == 0 or (last and evaluated != run.step - 1)
            if (run.dist.main or run.sharded) and due:
                if last and run.dist.main:
                    bar.write(f"final evaluation ({cfg.train.eval_batches} batches of train and val)...")
                record_eval(run, lr, norm, elapsed, bar.write, on_eval)
                evaluated = run.step
            if run.step % cfg.train.ckpt_every == 0 or last:
                if last and run.dist.main:
                    bar.write(f"saving the checkpoint of step {run.step} in {run.run_dir}...")
                save_checkpoint(run)
            if last:
                run.stop_reason = (
                    "time budget"
                    if out_of_time
                    else "max_steps"
                    if not stop_now
                    else f"interrupted by {stop.signal or 'a signal on another rank'}"
                )
                break
    bar.close()


def start(cfg: Config, resume: bool, log, held: contextlib.ExitStack) -> Session:
    """Set up device, data, model and optimizer; lock the run directory (in `held`, on rank 0);
    restore the checkpoint when resuming. Mutates cfg (the model's vocab_size comes from the
    tokenizer): train() hands it a copy."""
    gpu = cfg.run.device in ("auto", "cuda") and torch.cuda.is_available()
    procs = runtime.setup_distributed("cuda" if gpu else "cpu")
    log = log if procs.main else (lambda *a, **k: None)
    device = runtime.resolve_device(cfg.run.device, procs.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run_dir = Path(cfg.run.out_dir)
    if procs.main:  # first the lock, so a second trainer hears that the directory is in use
        held.enter_context(ckpt.lock_run_dir(run_dir, create=not resume))
    run_dir, changed = ckpt.check_run_dir(cfg, resume)  # under the lock: no other trainer writes now
    check_log_dir(run_dir, cfg.train.logger)  # before the data is prepared, which can take minutes

    model, data = _model_and_data(cfg, procs, run_dir if resume else None, device, log)
    dtype = runtime.resolve_dtype(cfg.train.dtype, device)
    fit_started = None
    if budget.applies(cfg, resume, procs.world):
        fit_started = time.time()  # the timed steps are paid from the budget
        model = _fit_to_budget(cfg, model, data, device, dtype, log)
    model.checkpoint_blocks = cfg.train.activation_checkpointing
    if cfg.train.parallel == "fsdp" and procs.world > 1:  # before the optimizer: it must hold the shards
        fsdp.shard(model, device, dtype)
    if not resume:  # a new run's config.yaml states what it is: its name and a prompt for its own text
        _name_and_prompt(cfg, data, log)
    run = Session.create(cfg, model, data, device, dtype=dtype, procs=procs, run_dir=run_dir, log=log)
    if resume:
        restore_checkpoint(run, log)
        if changed and procs.main:
            explain_changes(run, changed)
    elif procs.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_run_files(run_dir, cfg, data.tokenizer)
    if procs.main:
        run.logger = Logger(run_dir, cfg.train.logger, resume_step=run.step if resume else None)
        held.callback(run.logger.close)

    if cfg.train.compile:  # in place, so evaluation (through raw_model) runs the compiled blocks too
        model.compile_regions()
    if procs.world > 1 and not run.sharded:
        run.model = nn.parallel.DistributedDataParallel(
            run.model, device_ids=[device.index] if device.type == "cuda" else None
        )
    batch, accum = cfg.train.batch_size, cfg.train.grad_accum
    log(
        f"model: {model.num_params(non_embedding=False):,} parameters ({model.num_params():,} without the "
        f"learned position table) | device {device} | dtype {_dtype_words(cfg.train.dtype, dtype, device)}"
        f"{' | compiled' if cfg.train.compile else ''}"
        f"{f' | sharded over {procs.world} procs (fsdp)' if run.sharded else ''}"
        f" | global batch {batch} x {accum} accum x {procs.world} procs = {batch * accum * procs.world}"
        f" sequences of {cfg.model.block_size} = {run.meter.tokens_per_step:,} tokens"
        f" | {_export_words(cfg.model)}"
    )
    run.model.train()
    run.meter.step_last, run.t0 = run.step, fit_started or time.time()
    return run


def _fit_to_budget(cfg: Config, model: Transformer, data, device, dtype, log) -> Transformer:
    """Time the trainer's own step on a copy of the default model, let budget.fit set cfg for the
    steps the budget buys, and return the model cfg now describes (a new one if the depth changed)."""
    probe = Session.create(cfg, copy.deepcopy(model), data, device, dtype=dtype, log=log)
    log(budget.fit(cfg, budget.seconds_per_step(lambda: train_step(probe, cfg.train.lr, False), device)))
    return model if cfg.model.n_layer == len(model.blocks) else _new_model(cfg, device)


def _name_and_prompt(cfg: Config, data, log) -> None:
    """run.name follows run.out_dir when only that was given (run.out_dir=runs/novel: "novel", not
    the recipe's name), and a run on other text than Shakespeare's does not keep Shakespeare's
    "Romeo." prompt: generate and the explorer start from the start of a validation document
    instead (a line of it, or its first words). A run.name or sample.prompt the user set is kept."""
    name, shakespeare = Path(cfg.run.out_dir).name, _default(SampleConfig, "prompt")
    if name and cfg.run.name in recipes():  # a recipe's own name (each names itself), not the user's
        cfg.run.name = name
    if cfg.sample.prompt != shakespeare or cfg.data.source == _default(DataConfig, "source"):
        return
    prompt = fitting_prompt(data)
    if prompt:
        cfg.sample.prompt = prompt
        log(
            f"sample.prompt: {prompt!r}, the start of a validation document (Shakespeare's "
            f"{shakespeare!r} does not fit {cfg.data.source}); set sample.prompt to choose another"
        )


def _default(section: type, key: str):
    return next(f.default for f in dataclasses.fields(section) if f.name == key)


PROMPT_CHARS = 20  # about how much of a long line a fitting prompt takes: a few words


def fitting_prompt(data) -> str:
    """A prompt in the corpus's own style: the first line of the validation text (past its first
    line break when the split may cut a document mid-line), whole with its line break when short,
    else its first words up to about PROMPT_CHARS characters. "" when val has no text."""
    ids = data.tokens("val")[:512].tolist()
    eot = data.tokenizer.eot_id
    text = data.tokenizer.decode(ids[: ids.index(eot)] if eot in ids else ids)
    splits = data.meta["splits"]
    if splits["train"]["documents"] == 1 == splits["val"]["documents"] and "\n" in text:
        text = text.split("\n", 1)[1]  # one document, cut by characters: begin at a line's start
    text = text.lstrip("\n")
    line, newline, _ = text.partition("\n")
    if len(line) <= 2 * PROMPT_CHARS and line.strip():
        return line + newline
    words = line[: PROMPT_CHARS + 1].rsplit(" ", 1)[0] if " " in line[:PROMPT_CHARS] else line[:PROMPT_CHARS]
    return words.strip() and words


def _export_words(cfg) -> str:
    """Where the trained model can go (minitf export / export-gguf), for the start-up line."""
    fmt = format_or_none(cfg)
    if fmt is None:
        return "exports to no standard architecture (minitf export names the settings that block it)"
    return f"exports as {FORMAT_NAMES[fmt]}"


def _dtype_words(asked: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype for the start-up line; on a CPU, why "auto" chose it."""
    name = str(dtype).split(".")[-1]
    if asked != "auto" or device.type != "cpu":
        return name
    return f"{name} (auto: {'native' if dtype == torch.bfloat16 else 'no native'} bf16 on this CPU)"


def _model_and_data(cfg: Config, procs: runtime.Dist, resume_dir: Path | None, device, log):
    """The model (new, or run.init_from's pretrained Hugging Face model) and the token data for its tokenizer:
    rank 0 builds the token cache, the others then find it ready. Sets cfg.model from what was built."""
    tokenizer = Tokenizer.load(resume_dir / ckpt.TOKENIZER) if resume_dir else None
    pretrained = None
    if cfg.run.init_from and resume_dir is None:  # a resume has its own weights and tokenizer
        pretrained, tokenizer = hf.load_pretrained(cfg.run.init_from)
        cfg.model = dataclasses.replace(
            pretrained.config, dropout=cfg.model.dropout
        )  # the one model key a fine-tune sets
        log(
            f"init_from {cfg.run.init_from}: {cfg.model.n_layer} layers x {cfg.model.n_embd} wide, "
            f"vocabulary {tokenizer.vocab_size}, block {cfg.model.block_size} (model.* comes from it)"
        )
    if procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    if procs.world > 1:
        dist.barrier()
    if not procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    data.check_fits(cfg.model.block_size)  # a split too small for one batch: said now, not at the first evaluation
    cfg.model.vocab_size = data.tokenizer.vocab_size
    model = _new_model(cfg, device)
    if pretrained is not None:
        model.load_state_dict(pretrained.state_dict())
    return model, data


def _new_model(cfg: Config, device) -> Transformer:
    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    return Transformer(cfg.model).to(device)


def train_step(run: Session, lr: float, interrupted: bool) -> tuple[float, float, float, bool]:
    """One optimizer step at learning rate lr; a non-finite loss or gradient skips it.

    Returns (loss, grad norm, elapsed seconds, stop) as agreed by all ranks: one small collective
    keeps every rank's decisions (skip, stop) identical. It is the step's one host sync.
    """
    set_lr(run.optimizer, lr)
    loss_sum, norm = forward_backward(
        run.model,
        run.raw_model,
        run.next_batch,
        run.optimizer,
        run.scaler,
        run.autocast,
        run.cfg.train,
        distributed=run.dist.world > 1,
    )
    host = torch.tensor([run.elapsed(), float(interrupted)], dtype=torch.float64, device=run.device)
    stats = torch.cat([torch.stack([loss_sum.double(), norm.double()]), host])
    # the grad norm is the same on every rank (DDP all-reduced the gradients; under FSDP it is the norm
    # over all shards), so averaging keeps it
    if run.dist.world > 1:
        dist.all_reduce(stats)
        stats /= run.dist.world
    loss, norm, elapsed, stop_flag = stats.tolist()
    if math.isfinite(loss) and math.isfinite(norm):
        with phase("optimizer"):
            run.scaler.step(run.optimizer)
            run.scaler.update()
        run.bad_steps = 0
    elif run.scaler.is_enabled() and math.isfinite(loss):
        run.scaler.update()  # float16 gradients overflowed: the scaler halves its scale, the step is skipped
    else:
        run.bad_steps += 1
        run.log(f"warning: step {run.step}: non-finite loss {loss} or grad norm {norm}; step skipped")
    run.optimizer.zero_grad(set_to_none=True)
    if run.bad_steps >= run.cfg.train.max_bad_steps:
        raise MinitfError(
            f"{run.bad_steps} non-finite steps in a row at step {run.step}; training stopped and "
            f"{last_good(run)}. Lower train.lr or use float32"
        )
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
            x, y = next_batch()
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
    """A named span for torch.profiler (`minitf bench --only profile` sums time by phase); a few
    microseconds when no profiler runs."""
    return torch.profiler.record_function(f"phase: {name}")


def record_eval(run: Session, lr: float, norm: float, elapsed: float, write, on_eval) -> None:
    """Evaluate, append the metrics, keep best.safetensors. Rank 0 alone, or under fsdp every rank
    (each holds a shard of the weights: all evaluate the same batches, rank 0 writes)."""
    result = evaluate(run.raw_model, run.data, run.cfg, run.device, run.autocast)
    if run.dist.main:
        run.logger.log_eval(
            {
                "step": run.step,
                "train_loss": result["train"],
                "val_loss": result["val"],
                "val_bpb": result["val_bpb"],
                "lr": lr,
                "grad_norm": norm,
                "tokens_per_s": round(run.meter.tok_s),
                "elapsed_s": round(elapsed, 2),
                "tokens": run.step * run.meter.tokens_per_step,
            }
        )
        if on_eval is not None:
            on_eval(run.run_dir)
        write(
            f"step {run.step}: train {result['train']:.4f} | val {result['val']:.4f} | val bpb {result['val_bpb']:.3f}"
        )
    val = fsdp.rank0_value(result["val"], run.device) if run.sharded else result["val"]
    if val < run.best_val:  # sharded, every rank takes this branch together: the weights are gathered
        run.best_val = val
        fsdp.save_full_weights(run.raw_model, run.run_dir / ckpt.BEST, run.step, run.data.tokenizer.hash, run.dist.main)


def _progress_bar(run: Session):
    """Steps, or under a time budget seconds, so the ETA is the budget's, not max_steps': a bar on
    a terminal, a line every 10 s in a log file or a pipe."""
    tc = run.cfg.train
    if tc.max_seconds is None:
        return progress_bar(
            tc.max_steps, "training", unit="step", initial=run.step, disable=not run.dist.main, dynamic_ncols=True
        )
    return progress_bar(
        tc.max_seconds,
        "training",
        unit="s",
        initial=run.elapsed_before,
        disable=not run.dist.main,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]",
    )
