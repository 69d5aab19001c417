"""Snapshots: the weights every train.snapshot_every steps, so training can be watched afterwards.

A checkpoint keeps only the latest weights; a question like "when did this model form its
induction heads?" needs the weights of many steps (`minitf heads` reads them back). Each snapshot
is the weights alone, as safetensors with the step in its metadata, written atomically to
<run>/snapshots/step_000100.safetensors. A history costs count x size on disk, so it is for small
models: a model over MAX_PARAMS parameters, or a history over MAX_BYTES, is refused at start-up,
and the start-up line says what the history will cost.
"""

from __future__ import annotations

import torch.nn as nn

from ..errors import ConfigError
from ..run_dir import SNAPSHOTS, list_snapshots, snapshot_path
from .checkpoint import save_weights
from .session import Session

MAX_PARAMS = 50_000_000  # 200 MB a snapshot in float32: past it, a history is gigabytes after a few dozen
MAX_BYTES = 4 * 2**30  # the most disk a run's history may take


def plan(every: int, model: nn.Module, first_step: int, max_steps: int) -> str:
    """The start-up line: how many snapshots, of what size, and the disk they take (count x size).

    Refused in one line (ConfigError) when the model is large or the history would be.
    """
    params = sum(p.numel() for p in model.parameters())  # a tied head counted once, as it is stored
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if params > MAX_PARAMS:
        raise ConfigError(
            f"train.snapshot_every keeps the weights of small models only: this one has {params:,} parameters "
            f"(over {MAX_PARAMS:,}); set train.snapshot_every=0"
        )
    count = max_steps // every - first_step // every  # an upper bound when the time budget ends the run first
    if count * size > MAX_BYTES:
        raise ConfigError(
            f"train.snapshot_every={every} would keep up to {count:,} snapshots x {_mb(size)} = "
            f"{_mb(count * size)}, over {_mb(MAX_BYTES)}; raise train.snapshot_every or lower train.max_steps"
        )
    return f"snapshots: every {every} steps, up to {count:,} x {_mb(size)} = {_mb(count * size)} in {SNAPSHOTS}/"


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB" if n < 2**30 else f"{n / 2**30:,.1f} GB"


def begin(session: Session) -> None:
    """Before the first step: say what the history costs, and drop the snapshots of steps past the
    one training starts from (a killed run's, which these steps write again); the rest stay."""
    every = session.cfg.train.snapshot_every
    if not every or not session.procs.main:
        return
    session.log(plan(every, session.raw_model, session.step, session.cfg.train.max_steps))
    for step, path in list_snapshots(session.run_dir):
        if step > session.step:
            path.unlink(missing_ok=True)


def keep(session: Session) -> None:
    """After a step: its weights in snapshots/ when the step is a multiple of train.snapshot_every."""
    every = session.cfg.train.snapshot_every
    if every and session.step % every == 0 and session.procs.main:
        path = snapshot_path(session.run_dir, session.step)
        path.parent.mkdir(exist_ok=True)
        save_weights(session.raw_model, path, session.step, session.data.tokenizer.hash)
