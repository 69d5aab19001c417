"""One training run in progress: its objects and counters (`Session`), and how its state goes
to and comes back from the run directory (checkpoints, resume, what a resume changed)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from ..budget import budget_steps, charged_time, train_longer
from ..config import Config, load_config
from ..data import TokenData
from ..errors import MinitfError, first_line
from ..model import Transformer
from ..optim import lr_at, schedule_progress
from ..system import runtime
from . import checkpoint as ckpt
from . import fsdp, metrics

# where the next step's batches are read while the device computes: a GPU runs ahead of the host,
# a CPU computes in the same threads that would read them (nothing to overlap)
PREFETCH_ON = {"cuda"}


@dataclass(kw_only=True)
class Session:
    """One training run in progress: what it trains, how, where it writes, and how far it is.
    Built by `Session.create` (or with keywords)."""

    cfg: Config
    run_dir: Path  # where the run writes (a probe or a benchmark writes nothing there)
    procs: runtime.Dist  # this process's rank among the run's processes (torchrun), and how many
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
    best_step: int | None = None  # the step whose weights best.safetensors holds
    last_val: tuple[int, float] | None = None  # (step, val loss) of this process's latest evaluation
    bad_steps: int = 0  # non-finite steps in a row (skipped: never applied to the weights)
    saved_step: int | None = None  # the step of the last checkpoint committed (or resumed from)
    stop_reason: str = "max_steps"
    logger: metrics.Logger | None = None  # rank 0's metrics (metrics.jsonl, steps.jsonl, TensorBoard)
    t0: float = 0.0
    prefetched: list = field(default_factory=list)  # the next step's micro-batches, read ahead (prefetch)
    gen_before_prefetch: torch.Tensor | None = None  # the batch generator's state before them

    @classmethod
    def create(
        cls,
        cfg: Config,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        data: TokenData,
        device: torch.device,
        *,
        run_dir: Path,
        dtype: torch.dtype | None = None,
        procs: runtime.Dist | None = None,
        log: Callable = print,
    ) -> Session:
        """A run of `optimizer` over `model` (on device) and `data` at step 0, with what a step
        needs around them: the gradient scaler and autocast for dtype (default: train.dtype
        resolved), this rank's batch generator and the speed meter."""
        procs = procs or runtime.Dist()
        dtype = dtype or runtime.resolve_dtype(cfg.train.dtype, device)
        return cls(
            cfg=cfg,
            run_dir=run_dir,
            procs=procs,
            device=device,
            dtype=dtype,
            data=data,
            model=model,
            raw_model=model,
            optimizer=optimizer,
            scaler=torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
            autocast=runtime.autocast_for(dtype, device),
            batch_gen=torch.Generator().manual_seed(cfg.run.seed + procs.rank),
            meter=metrics.Meter(model.flops_per_token(), (runtime.peak_flops(device) or 0) * procs.world, 0),
            log=log,
        )

    @property
    def sharded(self) -> bool:
        """fsdp under torchrun: the weights are spread over the ranks, so all of them evaluate and save."""
        return fsdp.is_sharded(self.raw_model)

    def elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.t0

    def next_batch(self):
        """The next micro-batch: one read ahead (`prefetch`) if there is one, else read now."""
        if self.prefetched:
            batch = self.prefetched.pop(0)
            if not self.prefetched:
                self.gen_before_prefetch = None
            return batch
        return self.data.get_batch(  # policy: the model, which data.format=rl samples its answers from
            "train", self.cfg.train.batch_size, self.cfg.model.block_size, self.batch_gen, self.device, self.raw_model
        )

    def prefetch(self, micro_batches: int) -> None:
        """On a GPU, read the next step's micro-batches and start their copies (pinned, non-blocking)
        while the device still computes this step, before the host waits for its statistics. A
        checkpoint keeps the batch generator as it was before them (`batch_state`), so a resume
        draws them again: the batches, and so the run, are the same with or without this."""
        if self.device.type not in PREFETCH_ON or self.prefetched or getattr(self.data, "SAMPLED", False):
            return  # answers sampled ahead would be the weights' before this step's update: not on-policy
        self.gen_before_prefetch = self.batch_gen.get_state()
        self.prefetched = [self.next_batch() for _ in range(micro_batches)]

    def batch_state(self) -> torch.Tensor:
        """The batch generator's state as of the batches trained on (not those read ahead)."""
        return self.batch_gen.get_state() if self.gen_before_prefetch is None else self.gen_before_prefetch


def finished(session: Session) -> bool:
    """A resumed run whose budget is already spent: say so instead of training one more step."""
    tc = session.cfg.train
    out_of_time = tc.max_seconds is not None and session.elapsed_before >= tc.max_seconds
    if session.step < tc.max_steps and not out_of_time:
        return False
    session.stop_reason = "already finished"
    used = f"it has used {session.elapsed_before:.1f}s"
    time_words = f"{used}, and train.max_seconds={tc.max_seconds:g} adds none" if out_of_time else used
    session.log(
        f"{session.run_dir} already finished (step {session.step} of train.max_steps={tc.max_steps}; "
        f"{time_words}); to train longer: {train_longer(session.run_dir, tc, out_of_time=session.step < tc.max_steps)}"
    )
    return True


def charge_resumed_time(session: Session, changed: dict[str, tuple]) -> None:
    """A resume that changes train.max_seconds: the seconds the run is charged with (budget.charged_time),
    and the line that says how much time it has used and how much the new budget adds."""
    if "train.max_seconds" not in changed or session.cfg.train.max_seconds is None:
        return
    old, new = changed["train.max_seconds"][0], session.cfg.train.max_seconds
    session.elapsed_before, line = charged_time(session.elapsed_before, old, new)
    session.log(line)


def save_checkpoint(session: Session) -> None:
    """Commit the weights and training state at session.step, unless they are not trusted.

    They are not when the latest step was non-finite (training has not recovered) or a weight is
    not finite: then the last good checkpoint stays. Rank 0 writes; under fsdp every rank writes
    its shards (fsdp.py).
    """
    per_rank = _rank_states(session)
    sharded = session.cfg.train.parallel == "fsdp"
    if not (session.procs.main or sharded):
        return
    if session.bad_steps or not all(t[-1] for t in per_rank):  # every rank sees the same: under fsdp they all skip
        session.log(
            f"warning: no checkpoint at step {session.step}: training has not recovered from non-finite steps "
            f"({session.bad_steps} in a row); {last_good(session)}"
        )
        return
    state = {
        "scaler": session.scaler.state_dict(),
        "rng": runtime.host_rng_state(session.device),
        "rank_rng": [t[:-1].cpu() for t in per_rank],
        "elapsed": session.elapsed(),
        "best_val": session.best_val,
        "best_step": session.best_step,
        "tokens": session.meter.total,  # the positions trained on: a batch of conversations is not block_size long
        "tokenizer": session.data.tokenizer.hash,
        "data": session.data.meta["fingerprint"],  # what the corpus was, for the resume check (check_run_dir)
    }
    if sharded:
        fsdp.save_sharded(
            session.run_dir, session.raw_model, session.optimizer, state, session.step, session.procs.main
        )
    else:
        ckpt.write_checkpoint(
            session.run_dir, session.raw_model, {**state, "optimizer": session.optimizer.state_dict()}, session.step
        )
    session.saved_step = session.step


def keep_best(session: Session, val: float) -> None:
    """Note this evaluation's val loss, and when it is the best yet keep its weights in
    best.safetensors. Under fsdp rank 0's loss decides for every rank (all of them gather the
    weights together)."""
    val = fsdp.rank0_value(val, session.device) if session.sharded else val
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


def _rank_states(session: Session) -> list[torch.Tensor]:
    """Every rank's torch RNG and batch-generator states, so each resumes its own streams, with a
    last byte that says whether its weights are all finite: uint8 tensors, gathered on every rank."""
    finite = all(torch.isfinite(fsdp.local(p)).all() for p in session.raw_model.parameters())  # this rank's shard
    rng = [torch.get_rng_state(), session.batch_state(), torch.tensor([finite], dtype=torch.uint8)]
    mine = torch.cat(rng).to(session.device)
    if session.procs.world == 1:
        return [mine]
    per_rank = [torch.empty_like(mine) for _ in range(session.procs.world)]
    dist.all_gather(per_rank, mine)
    return per_rank


def last_good(session: Session) -> str:
    if session.saved_step is None:
        return f"no checkpoint was written in {session.run_dir}"
    return f"the last good checkpoint (step {session.saved_step}) in {session.run_dir} is intact"


def restore_checkpoint(session: Session, log) -> None:
    """Weights, optimizer, counters and RNG streams from the run directory's last checkpoint."""
    sharded = session.cfg.train.parallel == "fsdp"
    if sharded:  # the model and AdamW come from the sharded folder, resharded to this many ranks
        state = fsdp.load_sharded(session.run_dir, session.raw_model, session.optimizer, log, session.procs.main)
    else:
        state = ckpt.load_checkpoint(session.run_dir, session.raw_model, log, repair=session.procs.main)
    try:
        if not sharded:
            session.optimizer.load_state_dict(state["optimizer"])
        session.scaler.load_state_dict(state["scaler"])
    except (ValueError, KeyError, RuntimeError) as e:
        raise MinitfError(
            f"{session.run_dir / ckpt.STATE}: the optimizer state does not fit this model "
            f"({first_line(e, 100)}); start a new run.out_dir"
        ) from None
    session.step, session.elapsed_before, session.best_val = state["step"], state["elapsed"], state["best_val"]
    session.best_step = state.get("best_step")  # absent from a checkpoint written before it was kept
    tc, world = session.cfg.train, session.procs.world  # an older checkpoint's tokens: its text batches' size
    total = state.get("tokens", session.step * tc.batch_size * session.cfg.model.block_size * tc.grad_accum * world)
    session.meter.total = session.meter.total_last = total
    session.saved_step = session.step
    runtime.set_host_rng_state(state["rng"], session.device, log)
    if len(state["rank_rng"]) == session.procs.world:
        torch_rng, data_rng = state["rank_rng"][session.procs.rank].split(len(torch.get_rng_state()))
        torch.set_rng_state(torch_rng.clone())  # clone: set_state wants its own storage
        session.batch_gen.set_state(data_rng.clone())
    else:  # another world size: fresh, distinct streams per rank
        log(
            f"warning: checkpoint from {len(state['rank_rng'])} processes resumed on {session.procs.world}; "
            f"batches are reseeded"
        )
        session.batch_gen.manual_seed(session.cfg.run.seed + session.procs.rank + 1000 * session.step)
        if session.device.type == "cuda":
            log(
                "note: on another number of GPUs the resume is not bit-exact: besides the batches, dropout's "
                "CUDA random stream is not the straight run's"
            )
    if session.procs.main:
        metrics.truncate(session.run_dir, session.step)
    log(f"resuming {session.run_dir} at step {session.step}")


def explain_changes(session: Session, changed: dict[str, tuple]) -> None:
    """A resume that changes permitted keys: say what changed and how the LR schedule goes on,
    and make config.yaml state the config that now drives the run."""
    for key, (old, new) in changed.items():
        session.log(f"resume: {key} {old!r} -> {new!r}")
    if any(key in ckpt.BUDGET for key in changed):
        # the schedule is a function of the budget, so a longer budget stretches the cosine: the
        # LR goes back up to where the longer run would be now. That is what a run planned this
        # long from the start would do; keeping min_lr instead would leave the added steps with
        # little to learn from.
        before = load_config(session.run_dir / ckpt.CONFIG).train
        tc, step, elapsed = session.cfg.train, session.step, session.elapsed_before
        then = lr_at(step - 1, schedule_progress(step - 1, elapsed, before), before, budget_steps(before))
        now = lr_at(step, schedule_progress(step, elapsed, tc), tc, budget_steps(tc))
        session.log(
            f"resume: the budget changed, so the LR follows the schedule of the new budget: "
            f"{then:.2e} at the last step, {now:.2e} now, annealing to train.min_lr={session.cfg.train.min_lr:.2e} "
            f"at the new end"
        )
    ckpt.write_config(session.run_dir, session.cfg)
