"""Training's numbers: the speed meter (tokens/s, MFU) and where every number goes, one small
logger that every metric passes through.

- metrics.jsonl: one row per evaluation (train and val loss, val bits per byte, LR, grad norm,
  tokens/s, elapsed seconds), always. Plots, the explorer and resume read it.
- steps.jsonl: the training loss, LR, grad norm and tokens/s every train.log_every steps, always,
  so curves have detail between evaluations.
- TensorBoard event files under <run>/tensorboard/ too, with train.logger=tensorboard
  (`pip install -e '.[tensorboard]'`; view with `tensorboard --logdir runs`).

Rows are appended with one write each, so a kill leaves at most one cut line, which readers
skip and a resume drops (`truncate`, with every row past the checkpoint's step).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..errors import MinitfError
from ..run_dir import METRICS, STEPS, TENSORBOARD, read_rows
from ..system.files import atomic_write, open_nofollow, refuse_symlink


def append_row(path: Path, record: dict) -> None:
    try:  # O_NOFOLLOW: a linked metrics.jsonl is refused, never appended to
        fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with open(fd, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise MinitfError(f"could not write {path}: {e.strerror or e}") from None


def truncate(run_dir: Path, step: int) -> None:
    """On resume, drop rows logged after the checkpoint we go back to, so steps never repeat."""
    for name in (METRICS, STEPS):
        path = Path(run_dir) / name
        if path.is_file():
            rows = [r for r in read_rows(path) if r.get("step", 0) <= step]
            text = "".join(json.dumps(r) + "\n" for r in rows)
            atomic_write(path, lambda tmp, text=text: Path(tmp).write_text(text))


def check_log_dir(run_dir: Path, kind: str) -> None:
    """With train.logger=tensorboard, <run>/tensorboard must be a directory (or not be there yet):
    a symbolic link would send the event files where it points, a file would stop the writer."""
    path = Path(run_dir) / TENSORBOARD
    if kind != "tensorboard":
        return
    refuse_symlink(path)
    if path.exists() and not path.is_dir():
        raise MinitfError(
            f"{path} is a file; train.logger=tensorboard writes its event files in a directory of that name: "
            f"move the file away, or use train.logger=jsonl"
        )


class Logger:
    """Writes a run's metrics (rank 0 only). kind: "jsonl" (the files only) or "tensorboard"
    (the files and event files). resume_step: events after it are dropped from TensorBoard's view."""

    def __init__(self, run_dir: Path, kind: str = "jsonl", resume_step: int | None = None):
        self.run_dir, self.tb = Path(run_dir), None
        for name in (METRICS, STEPS):  # now, not at the first row, so no training time is lost
            refuse_symlink(self.run_dir / name)
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MinitfError(
                    "train.logger=tensorboard needs the tensorboard package: "
                    "pip install -e '.[tensorboard]' (or pip install tensorboard)"
                ) from None
            check_log_dir(self.run_dir, kind)
            self.tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD), purge_step=resume_step)

    def log_step(self, row: dict) -> None:
        """A training step's numbers: step, loss, lr, grad_norm, tokens_per_s (mfu where known)."""
        append_row(self.run_dir / STEPS, row)
        self._scalars(
            row,
            {
                "loss": "train/loss",
                "lr": "train/lr",
                "grad_norm": "train/grad_norm",
                "tokens_per_s": "perf/tokens_per_s",
                "mfu": "perf/mfu",
            },
        )

    def log_eval(self, row: dict) -> None:
        """An evaluation's numbers, as metrics.jsonl holds them."""
        append_row(self.run_dir / METRICS, row)
        self._scalars(row, {"train_loss": "eval/train_loss", "val_loss": "eval/val_loss", "val_bpb": "eval/val_bpb"})

    def _scalars(self, row: dict, names: dict[str, str]) -> None:
        if self.tb is None:
            return
        for key, tag in names.items():
            if row.get(key) is not None:
                self.tb.add_scalar(tag, row[key], global_step=row["step"])
        self.tb.flush()  # a kill loses nothing already logged

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class Meter:
    """Tokens per second (and MFU on a known GPU) between two log points, for the progress bar.

    It counts the positions each step's batches held (count): a text batch is block_size long, a
    batch of conversations as long as its longest, so tokens/s is of what really ran. total is every
    position since step 0 (a checkpoint keeps it): metrics.jsonl's tokens."""

    def __init__(self, flops_per_token: float, peak: float | None, step: int, total: int = 0):
        self.flops_per_token, self.peak = flops_per_token, peak
        self.t_last, self.step_last, self.tok_s = time.time(), step, 0.0
        self.total = self.total_last = total

    def count(self, positions: int) -> None:
        self.total += positions

    def update(self, step: int, loss: float, lr: float) -> dict:
        now = time.time()
        tokens, self.total_last = self.total - self.total_last, self.total
        self.tok_s = tokens / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, step
        post = {"step": step, "loss": f"{loss:.3f}", "lr": f"{lr:.2e}", "tok/s": f"{self.tok_s:,.0f}"}
        if self.peak:
            post["mfu"] = f"{100 * self.mfu:.1f}%"
        return post

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation between the last two log points: a fraction of the peak."""
        return self.flops_per_token * self.tok_s / self.peak if self.peak else 0.0
