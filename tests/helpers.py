"""What several test files share: the repository root, a play-like corpus generator, the tiny config."""

import os
import random
import sys
from pathlib import Path
from typing import NoReturn

import minitf

ROOT = Path(__file__).resolve().parent.parent

_NAMES = ["ROMEO", "JULIET", "NURSE", "FRIAR", "MERCUTIO", "TYBALT"]
_WORDS = (
    "love night day sweet death light fair heaven star blood sword heart moon grave honour "
    "name rose speak hence gentle kiss fortune dream tears sorrow house"
).split()


def make_play(seed: int, lines: int = 400) -> str:
    """Play-like text from a tiny grammar: speakers in capitals, short verse lines."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        if rng.random() < 0.25:
            out.append(f"\n{rng.choice(_NAMES)}:")
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 9))]
        out.append(f"O {' '.join(words)}{rng.choice(',.;!?')}".capitalize())
    return "\n".join(out) + "\n"


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


def tiny_train_args(out_dir, corpus_dir) -> list[str]:
    """scripts/train.py's arguments for the same model: --config configs/tiny.yaml and tiny_overrides."""
    return ["--config", "configs/tiny.yaml", *tiny_overrides(out_dir, corpus_dir)]


def tiny_config(out_dir, corpus_dir, *overrides) -> minitf.Config:
    """configs/tiny.yaml on the local corpus, in out_dir, even smaller and quicker."""
    return minitf.load_config(
        ROOT / "configs" / "tiny.yaml",
        [
            *tiny_overrides(out_dir, corpus_dir),
            "train.max_steps=8",
            "train.eval_every=4",
            "train.ckpt_every=4",
            "train.eval_batches=2",
            "train.log_every=2",
            "train.warmup_steps=2",
            *overrides,
        ],
    )


def default_sigint() -> None:
    """preexec_fn for a child that a test sends Ctrl-C: a process started in the background (as a
    CI runner may start this suite) inherits SIGINT ignored, and Python then keeps it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def train_with_snapshot(cfg, snapshot: Path, at_step: int, monkeypatch) -> Path:
    """Train cfg straight through, copying its run directory to `snapshot` right after the
    checkpoint of `at_step` is committed (as a kill just then would leave it); the run directory."""
    import shutil

    from minitf.training import checkpoint as ckpt

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


def join_gloo(rank: int, world: int, init_file: str) -> None:
    """A spawned test worker joins its gloo process group. A peer that never arrives fails the test
    within two minutes instead of gloo's default half hour."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )


def leave_gloo() -> NoReturn:
    """The last call of a spawned test worker. Every rank waits for the others before the group is
    destroyed (a rank that destroyed it while its peer was still working, rank 0 saving the results,
    left that peer hanging on a loaded machine); then the worker ends without interpreter
    finalization: FSDP's sharded parameters sit in reference cycles that keep the gloo group alive
    until finalization, and tearing gloo's threads down there aborted a rank in one suite run
    ('terminate called without an active exception', SIGABRT) after all its work was written."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def two_at_a_time(fn, items) -> list:
    """fn over items in two threads, results in order: for tests that start several processes that
    mostly import torch on one core each, so a 2-core machine runs two at once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, items))


def tiny_gpt2_config(tf, tok):
    """transformers' GPT2Config of the tiny test model's shape (2 layers, 2 heads, 32 wide,
    32 positions) for tokenizer tok, its <|endoftext|> as BOS and EOS: a valid run.init_from."""
    return tf.GPT2Config(
        vocab_size=tok.vocab_size,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.eot_id,
        eos_token_id=tok.eot_id,
    )


class MicroBatches:
    """A TokenData stand-in whose get_batch hands out the given (x, y) micro-batches in order."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def get_batch(self, *args, **kwargs):
        return next(self.batches)


def step_session(model, micro_batches, optimizer, tc, distributed: bool = False, raw_model=None):
    """A Session over `model` (DDP-wrapped or not; raw_model: the module itself) whose batches are
    `micro_batches`, for one call of the trainer's own forward_backward: float32, no autocast."""
    import contextlib
    import tempfile

    import torch

    from minitf.config import Config
    from minitf.system.runtime import Dist
    from minitf.training.metrics import Meter
    from minitf.training.session import Session

    raw = model if raw_model is None else raw_model
    return Session(
        cfg=Config(model=raw.config, train=tc),
        run_dir=Path(tempfile.gettempdir()),  # forward_backward writes nothing
        procs=Dist(world=2 if distributed else 1),
        device=torch.device("cpu"),
        dtype=torch.float32,
        data=MicroBatches(micro_batches),
        model=model,
        raw_model=raw,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext(),
        batch_gen=torch.Generator(),
        meter=Meter(1, 1.0, None, 0),
    )
