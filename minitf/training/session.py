"""One training run in progress: its objects and counters (`Session`), and how its state goes
to and comes back from the run directory (checkpoints, resume, what a resume changed)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config import Config, load_config
from ..data import TokenData
from ..errors import MinitfError, first_line
from ..model import Transformer
from ..optim import lr_at, make_optimizer, schedule_progress
from ..system import runtime
from . import checkpoint as ckpt
from . import fsdp, metrics
from .budget import train_longer


@dataclass(kw_only=True)
class Session:
    """One training run in progress: what it trains, how, where it writes, and how far it is.
    Built by `Session.create` (or with keywords)."""

    cfg: Config
    run_dir: Path | None  # None: a run that writes nothing (the training benchmark)
    dist: runtime.Dist
    device: torch.device
    dtype: torch.dtype  # train.dtype resolved: float32 or the autocast dtype
    data: TokenData
    model: nn.Module  # what the step calls: compiled and/or wrapped in DDP
    raw_model: Transformer  # the module itself (sharded in place under fsdp): evaluated and saved
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    batch_gen: torch.Generator  # this rank's batch sampler
    meter: metrics.Meter
    log: Callable = print  # rank 0's log; a no-op on the other ranks
    step: int = 0
    elapsed_before: float = 0.0  # seconds trained before this process (resume)
    best_val: float = float("inf")
    bad_steps: int = 0  # non-finite steps in a row (skipped: never applied to the weights)
    saved_step: int | None = None  # the step of the last checkpoint committed (or resumed from)
    stop_reason: str = "max_steps"
    logger: metrics.Logger | None = None  # rank 0's metrics (metrics.jsonl, steps.jsonl, TensorBoard)
    t0: float = 0.0

    @classmethod
    def create(
        cls,
        cfg: Config,
        model: Transformer,
        data: TokenData,
        device: torch.device,
        *,
        dtype: torch.dtype | None = None,
        procs: runtime.Dist | None = None,
        run_dir: Path | None = None,
        log: Callable = print,
    ) -> Session:
        """A run over `model` (on device; under fsdp already sharded, since the optimizer must hold
        the shards) and `data`, at step 0: the optimizer, the gradient scaler and autocast for
        dtype (default: train.dtype resolved), this rank's batch generator and the speed meter."""
        procs = procs or runtime.Dist()
        dtype = dtype or runtime.resolve_dtype(cfg.train.dtype, device)
        tokens_per_step = cfg.train.batch_size * cfg.model.block_size * cfg.train.grad_accum * procs.world
        return cls(
            cfg=cfg,
            run_dir=run_dir,
            dist=procs,
            device=device,
            dtype=dtype,
            data=data,
            model=model,
            raw_model=model,
            optimizer=make_optimizer(model, cfg.train, device),
            scaler=torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
            autocast=runtime.autocast_for(dtype, device),
            batch_gen=torch.Generator().manual_seed(cfg.run.seed + procs.rank),
            meter=metrics.Meter(
                tokens_per_step,
                model.flops_per_token() * tokens_per_step,
                (runtime.peak_flops(device) or 0) * procs.world,
                0,
            ),
            log=log,
        )

    @property
    def sharded(self) -> bool:
        """fsdp under torchrun: the weights are spread over the ranks, so all of them evaluate and save."""
        return fsdp.is_sharded(self.raw_model)

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.t0

    def next_batch(self):
        return self.data.get_batch(
            "train", self.cfg.train.batch_size, self.cfg.model.block_size, self.batch_gen, self.device
        )


def finished(run: Session) -> bool:
    """A resumed run whose budget is already spent: say so instead of training one more step."""
    tc = run.cfg.train
    if run.step < tc.max_steps and (tc.max_seconds is None or run.elapsed_before < tc.max_seconds):
        return False
    run.stop_reason = "already finished"
    run.log(
        f"{run.run_dir} already finished (step {run.step} of train.max_steps={tc.max_steps}, "
        f"{run.elapsed_before:.0f}s of train.max_seconds={tc.max_seconds}); to train longer: "
        f"{train_longer(run.run_dir, tc, out_of_time=run.step < tc.max_steps)}"
    )
    return True


def save_checkpoint(run: Session) -> None:
    """Commit the weights and training state at run.step, unless they are not trusted: the latest
    step was non-finite (training has not recovered), or a weight is not finite. Then the last
    good checkpoint stays. Every rank's torch RNG and batch generator are gathered, so each resumes
    its own stream; rank 0 writes (under fsdp every rank writes its shards: fsdp.py)."""
    finite = all(torch.isfinite(fsdp.local(p)).all() for p in run.raw_model.parameters())  # this rank's shard
    per_rank = [
        torch.cat([torch.get_rng_state(), run.batch_gen.get_state(), torch.tensor([finite], dtype=torch.uint8)]).to(
            run.device
        )
    ]  # uint8
    if run.dist.world > 1:
        mine, per_rank = per_rank[0], [torch.empty_like(per_rank[0]) for _ in range(run.dist.world)]
        dist.all_gather(per_rank, mine)
    sharded = run.cfg.train.parallel == "fsdp"
    if not (run.dist.main or sharded):
        return
    if run.bad_steps or not all(t[-1] for t in per_rank):  # every rank sees the same: under fsdp they all skip
        run.log(
            f"warning: no checkpoint at step {run.step}: training has not recovered from non-finite steps "
            f"({run.bad_steps} in a row); {last_good(run)}"
        )
        return
    state = {
        "scaler": run.scaler.state_dict(),
        "rng": runtime.host_rng_state(),
        "rank_rng": [t[:-1].cpu() for t in per_rank],
        "elapsed": run.elapsed(),
        "best_val": run.best_val,
        "tokenizer": run.data.tokenizer.hash,
        "data": run.data.meta["fingerprint"],  # what the corpus was, for the resume check (check_run_dir)
    }
    if sharded:
        fsdp.save_sharded(run.run_dir, run.raw_model, run.optimizer, state, run.step, run.dist.main)
    else:
        ckpt.write_checkpoint(run.run_dir, run.raw_model, {**state, "optimizer": run.optimizer.state_dict()}, run.step)
    run.saved_step = run.step


def last_good(run: Session) -> str:
    if run.saved_step is None:
        return f"no checkpoint was written in {run.run_dir}"
    return f"the last good checkpoint (step {run.saved_step}) in {run.run_dir} is intact"


def restore_checkpoint(run: Session, log) -> None:
    """Weights, optimizer, counters and RNG streams from the run directory's last checkpoint."""
    sharded = run.cfg.train.parallel == "fsdp"
    if sharded:  # the model and AdamW come from the sharded folder, resharded to this many ranks
        state = fsdp.load_sharded(run.run_dir, run.raw_model, run.optimizer, log, run.dist.main)
    else:
        state = ckpt.load_checkpoint(run.run_dir, run.raw_model, log, repair=run.dist.main)
    try:
        if not sharded:
            run.optimizer.load_state_dict(state["optimizer"])
        run.scaler.load_state_dict(state["scaler"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise MinitfError(
            f"{run.run_dir / ckpt.STATE}: the optimizer state does not fit this model "
            f"({first_line(e, 100)}); start a new run.out_dir"
        ) from None
    run.step, run.elapsed_before, run.best_val = state["step"], state["elapsed"], state["best_val"]
    run.saved_step = run.step
    runtime.set_host_rng_state(state["rng"])
    if len(state["rank_rng"]) == run.dist.world:
        torch_rng, data_rng = state["rank_rng"][run.dist.rank].split(len(torch.get_rng_state()))
        torch.set_rng_state(torch_rng.clone())  # clone: set_state wants its own storage
        run.batch_gen.set_state(data_rng.clone())
    else:  # another world size: fresh, distinct streams per rank
        log(
            f"warning: checkpoint from {len(state['rank_rng'])} processes resumed on {run.dist.world}; "
            f"batches are reseeded"
        )
        run.batch_gen.manual_seed(run.cfg.run.seed + run.dist.rank + 1000 * run.step)
    if run.dist.main:
        metrics.truncate(run.run_dir, run.step)
    log(f"resuming {run.run_dir} at step {run.step}")


def explain_changes(run: Session, changed: dict[str, tuple]) -> None:
    """A resume that changes permitted keys: say what changed and how the LR schedule goes on,
    and make config.yaml state the config that now drives the run."""
    for key, (old, new) in changed.items():
        run.log(f"resume: {key} {old!r} -> {new!r}")
    if any(key in ckpt.BUDGET for key in changed):
        # the schedule is a function of the budget, so a longer budget stretches the cosine: the
        # LR goes back up to where the longer run would be now. That is what a run planned this
        # long from the start would do; keeping min_lr instead would leave the added steps with
        # little to learn from.
        before = load_config(run.run_dir / ckpt.CONFIG).train
        then = lr_at(run.step - 1, schedule_progress(run.step - 1, run.elapsed_before, before), before)
        now = lr_at(run.step, schedule_progress(run.step, run.elapsed_before, run.cfg.train), run.cfg.train)
        run.log(
            f"resume: the budget changed, so the LR follows the schedule of the new budget: "
            f"{then:.2e} at the last step, {now:.2e} now, annealing to train.min_lr={run.cfg.train.min_lr:.2e} "
            f"at the new end"
        )
    ckpt.write_config(run.run_dir, run.cfg)
