"""A training run's set-up, the steps before its first that the trainer calls in order (trainer._train).

One run at a time in a process; processes and device; the run directory (locked, checked); a
pretrained model's config and a fine-tune's rates; the token data on every rank; a new run's files
or a resume's checkpoint; the compiled blocks and DDP; the start-up line. Each is called by the
trainer and returns to it: none calls back into the trainer or the layers above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config import CHECKPOINT_ABOVE, Config, TrainConfig
from ..data import TokenData
from ..errors import ConfigError, MinitfError
from ..model import Transformer
from ..system import runtime
from ..tokenizer import Tokenizer
from . import checkpoint as ckpt
from .data_format import data_format
from .metrics import Logger, check_log_dir
from .session import Session, charge_resumed_time, explain_changes, restore_checkpoint

_ONE_RUN = threading.Lock()  # held while a train() runs in this process


@contextlib.contextmanager
def the_only_run_in_this_process():
    """Held while a run trains. A run seeds torch's process-wide random generator and draws its
    weights and dropout from it, so a second train() from another thread is refused rather than
    making both irreproducible."""
    if not _ONE_RUN.acquire(blocking=False):
        raise MinitfError(
            "minitf.train is already running in this process (another thread); a run draws its weights and "
            "dropout from torch's process-wide random generator, so two at once would make neither reproducible: "
            "train one after the other, or in separate processes"
        )
    try:
        yield
    finally:
        _ONE_RUN.release()


def silent(*args, **kwargs) -> None:
    """The log of every rank but 0: one process speaks for the run."""


def processes_and_device(cfg: Config) -> tuple[runtime.Dist, torch.device]:
    """This process among torchrun's (or alone), and the device it trains on: under torchrun on
    GPUs setup_distributed makes cuda:LOCAL_RANK current before the process group starts; alone,
    the device (cuda:N too) is made current here."""
    gpu = cfg.run.device in ("auto", "cuda") and torch.cuda.is_available()
    procs = runtime.setup_distributed("cuda" if gpu else "cpu")
    device = runtime.resolve_device(cfg.run.device, procs.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return procs, device


def claim_run_dir(
    cfg: Config, resume: bool, procs: runtime.Dist, held: contextlib.ExitStack
) -> tuple[Path, dict[str, tuple]]:
    """The run directory, locked by rank 0 (the lock is left in `held`) and checked, and on resume
    the keys cfg changes."""
    run_dir = Path(cfg.run.out_dir)
    if procs.main:  # first the lock, so a second trainer hears that the directory is in use
        held.enter_context(ckpt.lock_run_dir(run_dir, create=not resume))
    run_dir, changed = ckpt.check_run_dir(cfg, resume)  # under the lock: no other trainer writes now
    check_log_dir(run_dir, cfg.train.logger)  # before the data is prepared, which can take minutes
    return run_dir, changed


def take_pretrained_config(
    cfg: Config, pretrained: Transformer, tokenizer: Tokenizer, downloaded: bool, log: Callable
) -> None:
    """run.init_from: model.* comes from the pretrained model (dropout is the one model key a
    fine-tune sets), a downloaded one trains with AdamW (adamw_for_a_download), and the learning
    rates become a fine-tune's (finetune_rates)."""
    cfg.model = dataclasses.replace(pretrained.config, dropout=cfg.model.dropout)
    log(
        f"init_from {cfg.run.init_from}: {cfg.model.n_layer} layers x {cfg.model.n_embd} wide, "
        f"vocabulary {tokenizer.vocab_size}, block {cfg.model.block_size} (model.* comes from it)"
    )
    if downloaded and (line := adamw_for_a_download(cfg.train, cfg.given)):
        log(line)
    log(finetune_rates(cfg.train, cfg.given))  # trained weights want lower rates than a new model


def adamw_for_a_download(tc: TrainConfig, given: frozenset[str]) -> str | None:
    """A downloaded model's fine-tune trains with AdamW where train.optimizer is not set, and the
    line that says so (None where nothing changed). Every family minitf imports was trained with
    AdamW, and at a fine-tune's few rows per step Muon's Newton-Schulz iterations cost more than
    the step itself: a full fine-tune of Qwen3-0.6B's shape, 2 rows of 257 tokens on 2 cores, took
    37 s a step with Muon and 8.8 s with AdamW (docs/performance.md)."""
    if tc.optimizer == "adamw" or "train.optimizer" in given:
        return None
    tc.optimizer = "adamw"
    if "train.typical_steps" not in given:  # auto: the budget's step counts were measured with Muon
        tc.typical_steps = None
    return (
        "optimizer: AdamW, as a downloaded model was trained (Muon's orthogonalisation costs more than "
        "a fine-tune's small steps); train.optimizer=muon to choose Muon"
    )


def fit_to_format(
    cfg: Config, pretrained: Transformer | None, tokenizer: Tokenizer | None, run_dir: Path | None, log: Callable
) -> tuple[Transformer | None, Tokenizer | None]:
    """(pretrained, tokenizer) as data.format asks (data_format.py): conversations bring a chat
    template and its tokens; run_dir is a resume's, whose template is its own."""
    return data_format(cfg).fit(cfg, pretrained, tokenizer, run_dir, log)


def token_data(cfg: Config, procs: runtime.Dist, tokenizer: Tokenizer | None, log: Callable) -> TokenData:
    """The token data, on every rank: rank 0 builds the token cache, the others then find it ready.
    A split too small for one batch is said now, not at the first evaluation."""

    def prepare():
        return data_format(cfg).prepare(cfg, tokenizer, log)

    if procs.main:
        data = prepare()
    if procs.world > 1:
        dist.barrier()
    if not procs.main:
        data = prepare()
    data.check_fits(cfg.model.block_size)
    return data


def restore_or_begin(session: Session, resume: bool, changed: dict[str, tuple], held: contextlib.ExitStack) -> None:
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


def compile_and_wrap(session: Session) -> None:
    """train.compile's compiled blocks, and under torchrun DDP around the model (FSDP sharded it already)."""
    if session.cfg.train.compile:  # in place, so evaluation (through raw_model) runs the compiled blocks too
        session.raw_model.compile_regions()
    if session.procs.world > 1 and not session.sharded:
        device = session.device
        session.model = nn.parallel.DistributedDataParallel(
            session.model, device_ids=[device.index] if device.type == "cuda" else None
        )


BF16_WEIGHTS_WORDS = " | weights in bfloat16, updates stochastically rounded (train.param_dtype)"
IN_BACKWARD_WORDS = " | each weight updated during backward, no clipping (train.optimizer_in_backward)"


def startup_line(session: Session, exports: str) -> str:
    """The model's size, the device, dtype and parallelism, the global batch, and where the model can go (exports)."""
    cfg, model, procs = session.cfg, session.raw_model, session.procs
    batch, accum = cfg.train.batch_size, cfg.train.grad_accum
    return (
        f"model: {model.num_params(non_embedding=False):,} parameters ({model.num_params():,} without the "
        f"learned position table) | device {session.device} | dtype "
        f"{_dtype_words(cfg.train.dtype, session.dtype, session.device)}"
        f"{BF16_WEIGHTS_WORDS if cfg.train.param_dtype == 'bfloat16' else ''}"
        f"{IN_BACKWARD_WORDS if cfg.train.optimizer_in_backward else ''}"
        f"{' | compiled' if cfg.train.compile else ''}"
        f"{_checkpointing_words(cfg.train.activation_checkpointing, model.checkpoint_blocks)}"
        f"{_fsdp_words(cfg.train.parallel, session.sharded, procs.world)}"
        f" | global batch {batch} x {accum} accum x {procs.world} procs = "
        f"{session.data.batch_words(batch * accum * procs.world, cfg.model.block_size)} | {exports}"
    )


def _fsdp_words(parallel: str, sharded: bool, world: int) -> str:
    """fsdp for the start-up line: over how many processes, and its optimizer (AdamW: chosen by itself
    where none was given, as Muon's Newton-Schulz needs whole matrices)."""
    if parallel != "fsdp":
        return ""
    return f" | sharded over {world} procs (fsdp, AdamW)" if sharded else " | fsdp in one process, unsharded (AdamW)"


def _checkpointing_words(asked, on: bool) -> str:
    """Activation checkpointing for the start-up line, where it is on (and why, when auto chose it)."""
    why = f" (auto: {CHECKPOINT_ABOVE // 10**6}M parameters or more)" if asked == "auto" else ""
    return f" | activation checkpointing{why}" if on else ""


def _dtype_words(asked: str, dtype: torch.dtype, device: torch.device) -> str:
    """The dtype for the start-up line; on a CPU or a GPU, why "auto" chose it, and where bfloat16
    asked for by name is emulated on a CPU (each operation converts to float32 and back: training
    runs slower than in float32 itself)."""
    name = str(dtype).split(".")[-1]
    if asked == "bfloat16" and device.type == "cpu" and not runtime.native_bf16(device):
        return f"{name} (emulated on this CPU, which has no native bf16: float32, train.dtype=auto, is faster)"
    if asked != "auto" or device.type not in ("cpu", "cuda"):
        return name
    where = "this CPU" if device.type == "cpu" else "this GPU"
    return f"{name} (auto: {'native' if dtype == torch.bfloat16 else 'no native'} bf16 on {where})"


# ---------------------------------------------------------------- a fine-tune's rates

# A fine-tune's peak AdamW rate: the from-scratch default (4e-3) moves trained weights far from
# where pretraining left them; 1e-4 is the usual order for tuning a small pretrained transformer
# and the rate the docs' fine-tune command always used.
FINETUNE_LR = 1e-4
_DEFAULT = TrainConfig.__dataclass_fields__


def finetune_rates(tc: TrainConfig, given: frozenset[str]) -> str:
    """Set a fine-tune's rates (run.init_from), each one the user did not set, and return the line
    that says them. lr: FINETUNE_LR. muon_lr: lr times the default muon_lr / lr (5), the
    from-scratch recipe's measured balance of the two optimizers, so both groups are lowered alike
    (a Muon left at its from-scratch 0.02 tuned most weights at the from-scratch rate). min_lr:
    lr / 10, the config's own rule."""
    ratio = _DEFAULT["muon_lr"].default / _DEFAULT["lr"].default
    if "train.lr" not in given:
        tc.lr = FINETUNE_LR
    if "train.muon_lr" not in given:
        tc.muon_lr = float(f"{tc.lr * ratio:.12g}")
    if "train.min_lr" not in given:
        tc.min_lr = tc.lr / 10
    if tc.min_lr > tc.lr:  # a recipe's from-scratch floor above the fine-tune's peak
        raise ConfigError(
            f"train.min_lr={tc.min_lr:g} is above a fine-tune's train.lr={tc.lr:g}; set train.lr too, or a "
            f"lower train.min_lr"
        )
    muon = tc.optimizer == "muon"  # muon_lr is said only where Muon trains: AdamW never reads it
    keys = ("train.lr", "train.min_lr", "train.muon_lr") if muon else ("train.lr", "train.min_lr")
    kept = [k for k in keys if k in given]
    return (
        f"fine-tune rates: lr {tc.lr:.3g}, min_lr {tc.min_lr:.3g}{f', muon_lr {tc.muon_lr:.3g}' if muon else ''} "
        f"({', '.join(kept) + ' as set; ' if kept else ''}a fine-tune's lr defaults to {FINETUNE_LR:g}, "
        f"{f'muon_lr to {ratio:g}x lr, ' if muon else ''}min_lr to lr / 10; set {', '.join(keys[:-1])} or "
        f"{keys[-1]} to choose)"
    )
