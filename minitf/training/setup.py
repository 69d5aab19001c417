"""A training run's set-up, everything before its first step: `start` returns the `Session`.

In order: processes and device, the run directory (locked, checked), the data and the model (new,
pretrained, or fitted to a short time budget), a new run's files or a resume's checkpoint, FSDP or
DDP, and the start-up line. What set-up needs from the layers above it (the trainer's step, which
the budget times; run.init_from's loader; the export words) is passed in: it may not import them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config import Config, ModelConfig
from ..data import TokenData, prepare_data
from ..model import Transformer
from ..optim import finetune_rates
from ..system import runtime
from ..tokenizer import Tokenizer
from . import budget, fsdp
from . import checkpoint as ckpt
from .metrics import Logger, check_log_dir
from .naming import name_and_prompt
from .session import Session, charge_resumed_time, explain_changes, restore_checkpoint

Step = Callable[[Session, float, bool], object]  # the trainer's train_step(session, lr, interrupted)
Pretrained = Callable[[str], tuple[Transformer, Tokenizer]]  # run.init_from -> (model, its tokenizer)


def start(
    cfg: Config,
    resume: bool,
    log: Callable,
    held: contextlib.ExitStack,
    *,
    step: Step,
    load_pretrained: Pretrained,
    export_words: Callable[[ModelConfig], str],
) -> Session:
    """A Session ready for its first step. The run directory's lock (rank 0's) and the logger are
    left in `held`. Mutates cfg (model.vocab_size comes from the tokenizer): train() hands it a copy."""
    procs, device = _processes_and_device(cfg)
    log = log if procs.main else _silent
    run_dir, changed = _claim_run_dir(cfg, resume, procs, held)
    model, data = _model_and_data(cfg, procs, run_dir if resume else None, device, log, load_pretrained)
    dtype = runtime.resolve_dtype(cfg.train.dtype, device)
    fit_started = None
    if budget.applies(cfg, resume, procs.world):
        fit_started = time.time()  # the timed steps are paid from the budget
        model = _fit_to_budget(cfg, model, data, device, dtype, log, step)
    model.checkpoint_blocks = cfg.train.activation_checkpointing
    if cfg.train.parallel == "fsdp" and procs.world > 1:  # before the optimizer: it must hold the shards
        fsdp.shard(model, device, dtype)
    if not resume:  # a new run's config.yaml states what it is: its name and a prompt for its own text
        name_and_prompt(cfg, data, log)
    session = Session.create(cfg, model, data, device, dtype=dtype, procs=procs, run_dir=run_dir, log=log)
    _restore_or_begin(session, resume, changed, held)
    _compile_and_wrap(session)
    log(_startup_line(session, export_words(cfg.model)))
    session.model.train()
    session.meter.step_last, session.t0 = session.step, fit_started or time.time()
    return session


def _silent(*args, **kwargs) -> None:
    """The log of every rank but 0: one process speaks for the run."""


def _processes_and_device(cfg: Config) -> tuple[runtime.Dist, torch.device]:
    """This process among torchrun's (or alone), and the device it trains on."""
    gpu = cfg.run.device in ("auto", "cuda") and torch.cuda.is_available()
    procs = runtime.setup_distributed("cuda" if gpu else "cpu")
    device = runtime.resolve_device(cfg.run.device, procs.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return procs, device


def _claim_run_dir(
    cfg: Config, resume: bool, procs: runtime.Dist, held: contextlib.ExitStack
) -> tuple[Path, dict[str, tuple]]:
    """The run directory, locked by rank 0 and checked, and on resume the keys cfg changes."""
    run_dir = Path(cfg.run.out_dir)
    if procs.main:  # first the lock, so a second trainer hears that the directory is in use
        held.enter_context(ckpt.lock_run_dir(run_dir, create=not resume))
    run_dir, changed = ckpt.check_run_dir(cfg, resume)  # under the lock: no other trainer writes now
    check_log_dir(run_dir, cfg.train.logger)  # before the data is prepared, which can take minutes
    return run_dir, changed


def _model_and_data(
    cfg: Config,
    procs: runtime.Dist,
    resume_dir: Path | None,
    device: torch.device,
    log: Callable,
    load_pretrained: Pretrained,
) -> tuple[Transformer, TokenData]:
    """The model (new, or run.init_from's pretrained one) and the token data for its tokenizer.
    Sets cfg.model from what was built."""
    tokenizer = Tokenizer.load(resume_dir / ckpt.TOKENIZER) if resume_dir else None
    pretrained = None
    if cfg.run.init_from and resume_dir is None:  # a resume has its own weights and tokenizer
        pretrained, tokenizer = load_pretrained(cfg.run.init_from)
        # model.* comes from the pretrained model; dropout is the one model key a fine-tune sets
        cfg.model = dataclasses.replace(pretrained.config, dropout=cfg.model.dropout)
        log(
            f"init_from {cfg.run.init_from}: {cfg.model.n_layer} layers x {cfg.model.n_embd} wide, "
            f"vocabulary {tokenizer.vocab_size}, block {cfg.model.block_size} (model.* comes from it)"
        )
        log(finetune_rates(cfg.train, cfg.given))  # trained weights want lower rates than a new model
    data = _prepare_data(cfg, procs, tokenizer, log)
    data.check_fits(cfg.model.block_size)  # a split too small for one batch: said now, not at the first evaluation
    cfg.model.vocab_size = data.tokenizer.vocab_size
    model = _new_model(cfg, device)
    if pretrained is not None:
        model.load_state_dict(pretrained.state_dict())
    return model, data


def _prepare_data(cfg: Config, procs: runtime.Dist, tokenizer: Tokenizer | None, log: Callable) -> TokenData:
    """The token data, on every rank: rank 0 builds the token cache, the others then find it ready."""
    if procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    if procs.world > 1:
        dist.barrier()
    if not procs.main:
        data = prepare_data(cfg.data, tokenizer, log=log)
    return data


def _new_model(cfg: Config, device: torch.device) -> Transformer:
    torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank
    return Transformer(cfg.model).to(device)


def _fit_to_budget(
    cfg: Config,
    model: Transformer,
    data: TokenData,
    device: torch.device,
    dtype: torch.dtype,
    log: Callable,
    step: Step,
) -> Transformer:
    """The model for the steps the time budget buys on this machine (budget.fit): model itself, or
    a new one if the depth changed. The trainer's own step is timed on a copy of it."""
    probe = Session.create(cfg, copy.deepcopy(model), data, device, dtype=dtype, log=log)
    seconds, timed = budget.seconds_per_step(lambda: step(probe, cfg.train.lr, False), device, cfg.train)
    log(budget.fit(cfg, seconds, timed))
    return model if cfg.model.n_layer == len(model.blocks) else _new_model(cfg, device)


def _restore_or_begin(session: Session, resume: bool, changed: dict[str, tuple], held: contextlib.ExitStack) -> None:
    """A resume's checkpoint, or a new run's config.yaml and tokenizer.json; then rank 0's logger."""
    main, run_dir = session.procs.main, session.run_dir
    if resume:
        restore_checkpoint(session, session.log)
        charge_resumed_time(session, changed)  # on every rank: the schedule follows the time charged
        if changed and main:
            explain_changes(session, changed)
    elif main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_run_files(run_dir, session.cfg, session.data.tokenizer)
    if main:
        session.logger = Logger(run_dir, session.cfg.train.logger, resume_step=session.step if resume else None)
        held.callback(session.logger.close)


def _compile_and_wrap(session: Session) -> None:
    """train.compile's compiled blocks, and under torchrun DDP around the model (FSDP sharded it already)."""
    if session.cfg.train.compile:  # in place, so evaluation (through raw_model) runs the compiled blocks too
        session.raw_model.compile_regions()
    if session.procs.world > 1 and not session.sharded:
        device = session.device
        session.model = nn.parallel.DistributedDataParallel(
            session.model, device_ids=[device.index] if device.type == "cuda" else None
        )


def _startup_line(session: Session, export_words: str) -> str:
    """The model's size, the device, dtype and parallelism, the global batch, and where the model can go."""
    cfg, model, procs = session.cfg, session.raw_model, session.procs
    batch, accum = cfg.train.batch_size, cfg.train.grad_accum
    return (
        f"model: {model.num_params(non_embedding=False):,} parameters ({model.num_params():,} without the "
        f"learned position table) | device {session.device} | dtype "
        f"{_dtype_words(cfg.train.dtype, session.dtype, session.device)}"
        f"{' | compiled' if cfg.train.compile else ''}"
        f"{f' | sharded over {procs.world} procs (fsdp)' if session.sharded else ''}"
        f" | global batch {batch} x {accum} accum x {procs.world} procs = {batch * accum * procs.world}"
        f" sequences of {cfg.model.block_size} = {session.meter.tokens_per_step:,} tokens"
        f" | {export_words}"
    )


def _dtype_words(asked: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype for the start-up line; on a CPU, why "auto" chose it."""
    name = str(dtype).split(".")[-1]
    if asked != "auto" or device.type != "cpu":
        return name
    return f"{name} (auto: {'native' if dtype == torch.bfloat16 else 'no native'} bf16 on this CPU)"
