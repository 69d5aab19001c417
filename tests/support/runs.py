"""The tiny recipe (configs/tiny.yaml made smaller still, on the local corpus), trained runs and the
copies a test writes to, weights that hold a NaN, and the clocks that make training's timing
independent of this machine's speed."""

import itertools
import shutil
import types
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

import minitf
from minitf import trainer
from minitf.system import progress
from minitf.training import checkpoint as ckpt
from minitf.training import session

from . import ROOT

QUIET = dict(log=lambda *a: None)


def tiny_overrides(out_dir, corpus_dir) -> list[str]:
    """The overrides that make configs/tiny.yaml smaller still, on the local corpus, in out_dir."""
    return [
        f"run.out_dir={out_dir}",
        f"data.source=file:{corpus_dir}",
        "data.vocab_size=300",
        "model.n_embd=32",
        "model.block_size=32",
        "train.batch_size=4",
    ]


# the cadence of the tiny test recipe: 8 steps, evaluated and checkpointed every 4
_CADENCE = [
    "train.eval_every=4",
    "train.ckpt_every=4",
    "train.eval_batches=2",
    "train.log_every=2",
    "train.warmup_steps=2",
]


def tiny_train_args(out_dir, corpus_dir) -> list[str]:
    """scripts/train.py's arguments for the same model: --config configs/tiny.yaml and tiny_overrides."""
    return ["--config", "configs/tiny.yaml", *tiny_overrides(out_dir, corpus_dir)]


def tiny_config(out_dir, corpus_dir, *overrides) -> minitf.Config:
    """configs/tiny.yaml on the local corpus, in out_dir, even smaller and quicker."""
    return minitf.load_config(
        ROOT / "configs" / "tiny.yaml",
        [*tiny_overrides(out_dir, corpus_dir), "train.max_steps=8", *_CADENCE, *overrides],
    )


def tiny_args(run, corpus, *extra) -> list[str]:
    """scripts/train.py arguments for the tiny test recipe (tiny_config's overrides)."""
    return ["scripts/train.py", *tiny_train_args(run, corpus), *_CADENCE, *extra]


def copy_run(run: Path, dst: Path) -> Path:
    """A copy of a trained run directory at dst, as if it had been trained there: its config.yaml
    names dst as run.out_dir, so a resume of the copy writes only to the copy and logs nothing about
    a moved directory. dst has run's name, the run.name a fresh run takes from its directory."""
    run, dst = Path(run), Path(dst)
    assert dst.name == run.name, f"a copy of {run} must be named {run.name!r} as well, not {dst.name!r}"
    shutil.copytree(run, dst)
    config = dst / ckpt.CONFIG
    text = config.read_text()
    assert text.count(f"out_dir: {run}\n") == 1, text
    config.write_text(text.replace(f"out_dir: {run}\n", f"out_dir: {dst}\n"))
    return dst


def train_with_snapshot(cfg, snapshot: Path, at_step: int, monkeypatch) -> Path:
    """Train cfg straight through, copying its run directory to `snapshot` right after the
    checkpoint of `at_step` is committed (as a kill just then would leave it); the run directory."""
    real_save = ckpt.write_checkpoint

    def save_and_snapshot(run_dir, model, state, step):
        real_save(run_dir, model, state, step)
        if step == at_step and not snapshot.exists():
            shutil.copytree(run_dir, snapshot)

    monkeypatch.setattr(ckpt, "write_checkpoint", save_and_snapshot)
    try:
        return minitf.train(cfg, log=lambda *a: None)
    finally:
        monkeypatch.setattr(ckpt, "write_checkpoint", real_save)


def snapshot_weights(path) -> dict:
    return load_file(str(path))


TENSOR = "blocks.0.attn.c_attn.weight"


def poison(path, name=TENSOR, value=float("nan")):
    """Overwrite one value of tensor `name` in a safetensors file, its metadata (step, tokenizer) kept."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(path), metadata=meta)


def refusal(run, name=TENSOR) -> str:
    """The line every loader gives for a NaN in run's model.safetensors."""
    return f"{run / ckpt.WEIGHTS}: tensor {name} holds NaN/inf values (1 of "


class FakeClock:
    """time.time() for training: `now` moves only when a test moves it."""

    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def slow_clock(monkeypatch, seconds_per_step: float) -> FakeClock:
    """Make training's clock advance seconds_per_step per optimizer step, and not otherwise: a
    machine of that speed, with evaluations and checkpoints taking no time."""
    clock = FakeClock()
    monkeypatch.setattr(session, "time", clock)
    monkeypatch.setattr(trainer, "time", clock)
    real = trainer.forward_backward

    def step(*args, **kw):
        clock.now += seconds_per_step
        return real(*args, **kw)

    monkeypatch.setattr(trainer, "forward_backward", step)
    return clock


def fake_monotonic(monkeypatch, seconds_per_call: float) -> None:
    """Progress lines' clock: seconds_per_call more at each reading."""
    ticks = itertools.count(step=seconds_per_call)
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))


def run_copy(tiny_run, tmp_path, **extra):
    """A copy of tiny_run (tmp_path / "run") whose config.yaml holds extra keys ({'section': {'key': value}})."""
    import yaml

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    d = yaml.safe_load((run / "config.yaml").read_text())
    for section, keys in extra.items():
        d.setdefault(section, {}).update(keys)
    (run / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return run
