"""What a training run shows its user: progress and a steps.jsonl row while it trains
(`StepReport`), and how it ended (`say_how_it_ended`)."""

from __future__ import annotations

import shlex

from .. import budget
from ..system.progress import progress_bar
from .session import Session


class StepReport:
    """The progress bar, and a row of steps.jsonl every train.log_every steps (rank 0's)."""

    def __init__(self, session: Session):
        self.session = session
        self.bar = _progress_bar(session)

    def step(self, loss: float, lr: float, norm: float, elapsed: float) -> None:
        """Show the step just taken (session.step): the bar moves, and every log_every steps the
        loss, LR and speed are shown and logged."""
        session, tc = self.session, self.session.cfg.train
        self.bar.update(min(elapsed, tc.max_seconds) - self.bar.n if tc.max_seconds else 1)
        if session.step % tc.log_every and session.step != tc.max_steps:
            return
        self.bar.set_postfix(session.meter.update(session.step, loss, lr))
        if session.logger is not None:
            session.logger.log_step(
                {
                    "step": session.step,
                    "loss": loss,
                    "lr": lr,
                    "grad_norm": norm,
                    "tokens_per_s": round(session.meter.tok_s),
                    "elapsed_s": round(elapsed, 2),
                    **({"mfu": session.meter.mfu} if session.meter.peak else {}),
                }
            )

    def write(self, line: str) -> None:
        """A line above the bar, on rank 0."""
        if self.session.procs.main:
            self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


def _progress_bar(session: Session):
    """A bar on a terminal, a line every 10 s in a log file or a pipe. It counts seconds under a
    time budget, so its ETA is the budget's, not max_steps'."""
    tc = session.cfg.train
    if tc.max_seconds is None:
        return progress_bar(
            tc.max_steps,
            "training",
            unit="step",
            initial=session.step,
            disable=not session.procs.main,
            dynamic_ncols=True,
        )
    return progress_bar(
        tc.max_seconds,
        "training",
        unit="s",
        initial=session.elapsed_before,
        disable=not session.procs.main,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f}{unit} [{elapsed}<{remaining}{postfix}]",
    )


def say_how_it_ended(session: Session) -> None:
    """The closing lines: where and why the run stopped, a note if the budget bought too few steps,
    a note if the latest weights are worse than the best, how to train longer when the budget or
    max_steps ended it, and the run directory with the command that samples from it."""
    session.log(
        f"stopped at step {session.step} ({session.stop_reason}) after {session.elapsed():.0f}s; "
        f"best val loss {session.best_val:.4f}"
    )
    tc, reason = session.cfg.train, session.stop_reason
    short = budget.short_run_note(tc, session.step, reason, session.run_dir)
    for note in (short, _worse_than_best(session)):
        if note is not None:
            session.log(note)
    if short is None and reason in (budget.OUT_OF_TIME, "max_steps"):  # the short note says it already
        session.log(f"to train longer: {budget.train_longer(session.run_dir, tc, reason == budget.OUT_OF_TIME)}")
    if reason.startswith("interrupted"):  # Ctrl-C, or a scheduler's SIGTERM: the checkpoint is the step just saved
        session.log(f"to go on from step {session.step}: minitf train --resume {shlex.quote(str(session.run_dir))}")
    chat = session.data.tokenizer.chat_template is not None  # a chat model: its template came with the data
    use = "talk to it: minitf chat" if chat else "sample from it: minitf generate"
    session.log(f"run directory: {session.run_dir}\n{use} --run {shlex.quote(str(session.run_dir))}")


def _worse_than_best(session: Session) -> str | None:
    """The note for a run whose latest evaluation is worse than its best (overfitting, or a resume
    that went on too long): by how much, the best's step, and that --best uses those weights, since
    the tools read the latest by default. None otherwise."""
    if session.last_val is None or not session.last_val[1] > session.best_val:
        return None
    (step, last), best = session.last_val, session.best_val
    at = f" at step {session.best_step}" if session.best_step is not None else ""
    return (
        f"note: the latest weights (step {step}, val loss {last:.4f}) are {last - best:.4f} worse than "
        f"the best{at} (val loss {best:.4f}, in best.safetensors); generate, serve and export use the latest: "
        f"give them --best for the best"
    )
