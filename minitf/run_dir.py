"""A run directory, read: load_run, its weights, metrics and snapshots.

    runs/<name>/config.yaml  tokenizer.json  model.safetensors  best.safetensors
                state.pt  metrics.jsonl  steps.jsonl  loss.png  (tensorboard/)  (snapshots/)
                (train.parallel=fsdp: sharded-<step>/, see training/fsdp.py)

model.safetensors holds the weights of the latest checkpoint, best.safetensors those of the lowest
val loss, each with its step and the hash of the tokenizer it was trained with in its metadata;
metrics.jsonl holds one row per evaluation, steps.jsonl one per train.log_every steps, snapshots/
the weights every train.snapshot_every steps. Every tool that is not training (generate, inspect,
export, evaluate, the explorer, the server) only reads a run, and reads it with what is here;
writing, resuming and the trainer's lock are training/checkpoint.py's. Nothing is ever unpickled:
tensors come from safetensors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model

from .chat_template import TEMPLATE_FILE, TOKENS_FILE
from .config import load_run_config
from .conversations.template_files import load_template
from .errors import MinitfError, first_line
from .model import Transformer
from .system.runtime import resolve_device
from .tokenizer import Tokenizer, check_vocab

WEIGHTS, BEST, STATE, CONFIG, TOKENIZER = (
    "model.safetensors",
    "best.safetensors",
    "state.pt",
    "config.yaml",
    "tokenizer.json",
)
METRICS, STEPS, TENSORBOARD = "metrics.jsonl", "steps.jsonl", "tensorboard"  # training's numbers (training/metrics.py)
LOSS_PLOT = "loss.png"  # the loss curves drawn after each evaluation
SNAPSHOTS = "snapshots"  # train.snapshot_every's folder of weights, one file per kept step (training/snapshots.py)
LOCK = ".lock"  # held by the trainer writing the run (training/checkpoint.py)
FINITE_CHUNK = 1 << 24  # elements checked for NaN/inf at once (refuse_non_finite): 16M, a bounded temporary
# every name minitf writes in a run directory: an export never writes over one of them
RUN_FILES = {
    CONFIG,
    TOKENIZER,
    WEIGHTS,
    BEST,
    STATE,
    METRICS,
    STEPS,
    LOSS_PLOT,
    TENSORBOARD,
    SNAPSHOTS,
    LOCK,
    TEMPLATE_FILE,
    TOKENS_FILE,
}


def load_run(path: str | Path, best: bool = False, device: str | torch.device = "cpu"):
    """(model, tokenizer, config) from a run directory; the model is in eval mode on `device`."""
    if not isinstance(path, (str, Path)):
        raise MinitfError(f"load_run takes the path of a run directory, got {type(path).__name__}")
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise MinitfError(
            f"run directory {str(run_dir)!r} does not exist; train one first (minitf train) or pass --run DIR"
        )
    for name in (CONFIG, TOKENIZER, BEST if best else WEIGHTS):
        if not (run_dir / name).is_file():
            raise MinitfError(f"{run_dir} has no {name}; it is not a complete minitf run directory")
    cfg = load_run_config(run_dir / CONFIG)
    tok = Tokenizer.load(run_dir / TOKENIZER)
    check_vocab(tok, cfg.model.vocab_size, "the tokenizer does not belong to this run", what=str(run_dir / TOKENIZER))
    weights = run_dir / (BEST if best else WEIGHTS)
    trained_with = weights_metadata(weights).get("tokenizer")
    if trained_with and trained_with != tok.hash:
        raise MinitfError(
            f"{run_dir / TOKENIZER} is not the tokenizer this model was trained with (its hash "
            f"differs from the one recorded in {weights.name}); restore the run's own tokenizer.json"
        )
    model = Transformer(cfg.model).to(as_device(device))
    load_weights(model, weights)
    tok.chat_template = load_template(run_dir)  # a chat run's (None for a base model)
    return model.eval(), tok, cfg


def load_weights(model: nn.Module, path: Path) -> None:
    """A weights file into model: refused in one line if it is missing, damaged, of another
    config, or holds a NaN or infinite value (which would make every token's logits NaN)."""
    path = Path(path)
    if not path.is_file():
        raise MinitfError(f"{path} not found; is this a run directory written by minitf training?")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MinitfError(f"{path} is truncated or corrupted ({first_line(e, 120)})") from None
    if missing or unexpected:
        raise MinitfError(
            f"{path} does not fit this model config (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); was config.yaml edited?"
        )
    with safe_open(str(path), "pt") as f:  # the file's own names (it stores a tied head once, as lm_head.weight)
        names = list(f.keys())
    weights = model.state_dict()
    other = path.with_name(BEST if path.name == WEIGHTS else WEIGHTS)
    way_out = (
        f"use {other.name} ({'--best' if other.name == BEST else 'without --best'}) or " if other.is_file() else ""
    )
    refuse_non_finite(((name, weights[name]) for name in names), path, f"{way_out}train again with a lower train.lr")


def weights_metadata(path: Path) -> dict:
    """A weights file's metadata (step, tokenizer hash); {} if it is missing or unreadable."""
    try:
        with safe_open(str(path), "pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError):
        return {}


def weights_step(path: Path) -> int | None:
    """The training step a weights file was saved at, or None if it is missing or unreadable."""
    step = weights_metadata(path).get("step")
    return int(step) if step is not None and step.isdigit() else None


def which_weights(run_dir: Path, best: bool, verb: str) -> str:
    """The weights a tool reads from run_dir, for its start-up line: the file and its step, and,
    when it reads the latest and the best are other weights, that --best `verb` them instead."""
    run_dir = Path(run_dir)
    path = run_dir / (BEST if best else WEIGHTS)
    words = f"{path.name}, step {weights_step(path)}"
    best_step = weights_step(run_dir / BEST)
    if not best and best_step is not None and best_step != weights_step(path):
        words += f" (the latest; --best {verb} {BEST}, step {best_step}, the lowest val loss)"
    return words


def is_run_dir(path: Path) -> bool:
    """path holds a minitf run (a config.yaml beside weights or a training state): exports never write there."""
    path = Path(path)
    return (path / CONFIG).is_file() and any((path / n).is_file() for n in (WEIGHTS, BEST, STATE))


def read_rows(path: Path) -> list[dict]:
    """The rows of metrics.jsonl or steps.jsonl; [] if there is none. A line cut short by a kill is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            pass
    return out


def snapshot_path(run_dir: str | Path, step: int) -> Path:
    """Where the snapshot of `step` is kept: <run>/snapshots/step_000100.safetensors."""
    return Path(run_dir) / SNAPSHOTS / f"step_{step:06d}.safetensors"


_SNAPSHOT = re.compile(r"step_(\d{6}|[1-9]\d{6,29})\.safetensors")  # snapshot_path's names only: f"{step:06d}"


def list_snapshots(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every snapshot in a run directory, in step order; [] if it has none. Only the
    names snapshot_path gives count: a step_4.safetensors beside step_000004 is not step 4 again."""
    folder = Path(run_dir) / SNAPSHOTS
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.safetensors") if (m := _SNAPSHOT.fullmatch(p.name))]
    return sorted(found)


def refuse_non_finite(tensors, where, fix: str) -> None:
    """Weights holding NaN or infinity compute NaN for every token: refused in one line naming the
    file and the first such tensor. tensors: (name, tensor) pairs; fix: what the user can do."""
    for name, t in tensors:
        if torch.is_tensor(t) and t.is_floating_point() and not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise MinitfError(
                f"{where}: tensor {name} holds NaN/inf values ({bad} of {t.numel()}); the weights are unusable "
                f"(training diverged, or the file was damaged): {fix}"
            )


def all_finite(t: torch.Tensor) -> bool:
    """Whether t holds no NaN or infinity, checked FINITE_CHUNK elements at a time: isfinite's
    temporaries over a whole downloaded embedding (a Llama 3's 262M elements) would take 1.2 GB."""
    return all(bool(torch.isfinite(part).all()) for part in t.reshape(-1).split(FINITE_CHUNK))


def as_device(device: str | torch.device) -> torch.device:
    """load_run's device argument as a torch.device: a name is resolved, and refused if unknown."""
    if isinstance(device, str) and ":" not in device:
        return resolve_device(device)  # names it, if it is unknown or not there
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise MinitfError(f"device {device!r} is not a torch device; use auto, cpu, cuda or mps") from None
