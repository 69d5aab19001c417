"""The time budget's arithmetic: what train.max_seconds buys, and what a short run says.

What a budget buys, what a run does when it buys little, and how to give a run more.

- `budget_steps`: the steps a budget buys on a typical 2-core CPU (train.typical_steps, measured
  in the default recipe's TYPICAL_SECONDS): the LR warmup's share of the budget (the trainer hands it
  to optim.lr_at as a number) and the note of `short_run_note` compare with it.
- `spent`: whether the loop's time is up. `train_longer`: the command that resumes a run with
  twice the budget that ended it.
- A depth for the budget: at equal wall time a smaller model takes more steps, and on two CPU
  cores a budget of a minute or two buys only a few hundred steps of the default model (3 layers
  x 128). There 2 layers at 1.5x the peak learning rates end lower: ~0.04 bits per byte at 100 s
  in float32, while at ~1,750 steps 3 layers end 0.009 lower (docs/performance.md, "A depth for
  the budget"). So before a new run of the default model under a time budget, a few steps of it
  are timed on this machine (the trainer times its own step for as long as `keep_timing`
  says, and `step_seconds` sums them up); if the budget buys fewer than SHORT_STEPS of
  them, `fit` makes the run train SHORT_LAYERS layers at LR_SCALE times its learning rates (peaks
  and floor) instead. The choice is written into the run's config.yaml, so a resume, an export or
  generate sees the model that was trained; train.fit_budget=false keeps 3. The fit is skipped
  where it cannot pay: a model.n_layer the user set, a run that max_steps ends before the budget
  (fewer layers buy steps it cannot take), and a run so short that timing it would cost more
  than FIT_SHARE of it.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from .config import Config, ModelConfig, TrainConfig

# the budget train.typical_steps is measured in: the default recipe's train.max_seconds
TYPICAL_SECONDS: float = TrainConfig.__dataclass_fields__["max_seconds"].default
OUT_OF_TIME = "time budget"  # the stop reason of a run the budget ended


def budget_steps(tc: TrainConfig) -> int | None:
    """The steps this run's time budget buys on a typical 2-core CPU: train.typical_steps, scaled
    from TYPICAL_SECONDS to max_seconds. None without a time budget or a typical_steps."""
    if tc.max_seconds is None or not tc.typical_steps:
        return None
    return max(1, round(tc.typical_steps * tc.max_seconds / TYPICAL_SECONDS))


def spent(tc: TrainConfig, elapsed: float) -> bool:
    """The time budget is used up after `elapsed` seconds of training."""
    return tc.max_seconds is not None and elapsed >= tc.max_seconds


def short_run_note(tc: TrainConfig, steps: int, stop_reason: str, run_dir: Path) -> str | None:
    """The note for a run the time budget ended after under half the steps it buys on a typical
    machine: its model is weaker than the recipe's, and how to give it more time. None otherwise."""
    expected = budget_steps(tc)
    if stop_reason != OUT_OF_TIME or not expected or steps >= expected / 2:
        return None
    return (
        f"note: this machine did {steps} steps in train.max_seconds={tc.max_seconds:g}, under half the "
        f"~{expected} this recipe gets in that time on a typical 2-core CPU, so the model is weaker than "
        f"the recipe's. To train longer: {train_longer(run_dir, tc, out_of_time=True)}"
    )


def train_longer(run_dir: Path, tc: TrainConfig, out_of_time: bool) -> str:
    """The command, as a user can paste it into a shell, that resumes run_dir with twice the budget
    that ended it: the time budget, or max_steps."""
    longer = f"train.max_seconds={2 * tc.max_seconds:g}" if out_of_time else f"train.max_steps={2 * tc.max_steps}"
    return f"minitf train --resume {shlex.quote(str(run_dir))} {longer}"


def charged_time(used: float, old: float | None, new: float) -> tuple[float, str]:
    """A resume that changes train.max_seconds from old to new after `used` seconds: (the seconds
    the run is charged with, the line that says what it has used and what the new budget adds).

    Seconds the last attempt ran past its own budget (the closing evaluation and save, or a step
    begun just before the end) are not charged to the new one: the old budget ended the schedule
    at its end, so a budget raised from 8 s to 16 s adds 8 s, even after an attempt that took 20 s.
    """
    charged, past = used, ""
    if old is not None and used > old:
        charged = old
        past = f" ({used - old:.1f}s of them past train.max_seconds={old:g}, not charged to the new budget)"
    adds = max(0.0, new - charged)
    return charged, f"resume: the run has used {used:.1f}s{past}; train.max_seconds={new:g} adds {adds:.1f}s"


# ---------------------------------------------------------------- a depth for the budget

SHORT_STEPS = 1300  # below this many steps of the default model, the budget is short
SHORT_LAYERS = 2
LR_SCALE = 1.5
WARMUP_STEPS = 2  # untimed: the first steps allocate buffers
TIMED_STEPS = 5


def applies(cfg: Config, resuming: bool, world: int) -> bool:
    """Whether the depth is fitted: a new single-process run of the default model (any vocabulary)
    under a time budget, with train.fit_budget on, the one shape the rule was measured for."""
    # a resume keeps the depth it has; under torchrun every rank would have to agree on one timing;
    # a compiled step's first steps time the compiler, not the step; a model.n_layer the user set
    # (even to the default's 3) is their choice, not the default's
    tc = cfg.train
    default = dataclasses.replace(ModelConfig(), vocab_size=cfg.model.vocab_size)
    return (
        tc.fit_budget
        and tc.max_seconds is not None
        and not resuming
        and world == 1
        and not tc.compile
        and not cfg.run.init_from
        and cfg.model == default
        and "model.n_layer" not in cfg.given
    )


def keep_timing(tc: TrainConfig, seconds: list[float]) -> bool:
    """Whether the trainer times one more step, given the seconds of the steps timed so far: the
    fit times WARMUP_STEPS untimed steps then TIMED_STEPS (trainer.time_steps runs them).

    The timing stops early as soon as its cost passes FIT_SHARE of the run it is for (`_too_dear`):
    what it has spent, and past the warm-up what the steps left would take at the last one's
    speed. A warm-up step is slow by nature (it allocates), so the steps left are not projected
    from it: a loaded machine's slow first step does not call off the fit."""
    done, steps = len(seconds), WARMUP_STEPS + TIMED_STEPS
    if done == 0:
        return True
    if done >= steps:
        return False
    left = (steps - done) * seconds[-1] if done > WARMUP_STEPS else 0.0
    return not _too_dear(tc, sum(seconds) + left, seconds[-1])


def step_seconds(seconds: list[float]) -> tuple[float, bool]:
    """(seconds per step, timed in full) from the steps keep_timing let the trainer time: the mean
    past the warm-up, or the last step's seconds if the timing stopped early."""
    if len(seconds) < WARMUP_STEPS + TIMED_STEPS:
        return seconds[-1], False
    return sum(seconds[WARMUP_STEPS:]) / TIMED_STEPS, True


# The most of a run the timing may cost. The shorter model's gain is a few hundredths of a bit per
# byte at equal time (docs/performance.md); a timing that costs more than a tenth of the run's steps
# gives much of it back, and at train.max_seconds=8 its 7 steps took longer than the run's own.
FIT_SHARE = 0.1


def _too_dear(tc: TrainConfig, cost: float, step_seconds: float) -> bool:
    """The timing's cost (seconds, projected) is more than FIT_SHARE of the run: its time budget,
    or its max_steps at step_seconds if those end it first."""
    return cost > FIT_SHARE * min(tc.max_seconds, tc.max_steps * step_seconds)


def fit(cfg: Config, step_seconds: float, timed: bool = True) -> str:
    """Set cfg for the steps the budget buys at step_seconds per step of the default model; return
    the start-up line that says what was chosen and why. timed=False: the timing stopped early
    (too dear for this run), and the model is kept."""
    tc, layers = cfg.train, cfg.model.n_layer
    bought = round(tc.max_seconds / step_seconds)
    if tc.max_steps <= bought:  # fewer layers buy more steps, which a step-bounded run cannot take
        return (
            f"budget: train.max_steps={tc.max_steps:,} ends this run before train.max_seconds={tc.max_seconds:g} "
            f"(~{bought:,} steps here): keeping {layers} layers, as fewer would not train more steps"
        )
    why = f"train.max_seconds={tc.max_seconds:g} buys ~{bought:,} steps of {layers} layers here"
    if not timed:
        return (
            f"budget: train.max_seconds={tc.max_seconds:g} is too short to time this machine in (~{step_seconds:.2g}s "
            f"a step; timing takes {WARMUP_STEPS + TIMED_STEPS}): keeping {layers} layers without fitting the depth"
        )
    if bought >= SHORT_STEPS:
        return f"budget: {why}: keeping {layers} layers"
    cfg.model.n_layer = SHORT_LAYERS
    kept = [f"train.{name}" for name in ("lr", "min_lr", "muon_lr") if f"train.{name}" in cfg.given]
    for name in ("lr", "min_lr", "muon_lr"):  # a rate the user set is theirs; the others follow the model
        if f"train.{name}" not in kept:
            setattr(tc, name, _scaled(getattr(tc, name)))
    as_set = f" ({', '.join(kept)} as set)" if kept else ""
    return (
        f"budget: {why}, under {SHORT_STEPS:,}: training {SHORT_LAYERS} layers at {LR_SCALE:g}x the learning "
        f"rates{as_set} (lr {tc.lr:.3g}, muon_lr {tc.muon_lr:.3g}), "
        f"which learn more in a short budget; train.fit_budget=false keeps {ModelConfig().n_layer}"
    )


def _scaled(rate: float) -> float:
    """rate x LR_SCALE as config.yaml should show it: 6e-4, not 0.0006000000000000001."""
    return float(f"{rate * LR_SCALE:.12g}")
