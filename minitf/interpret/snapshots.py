"""A run's snapshots, each checked before it is scored: what `minitf heads` reads.

Training writes a snapshot as <run>/snapshots/step_000100.safetensors (run_dir.snapshot_path),
a regular file written atomically, with the step and the hash of the run's tokenizer in its
metadata (training/snapshots.py). A file there that minitf did not write so, copied in or edited,
would be scored under its file name: step 4 twice when a `step_4.safetensors` sits beside
`step_000004`, a 23-digit step stretching the plot's axis, another run's weights shown as this
run's. So each file is checked against its name, its metadata and the run's config, and the
first that does not fit is refused in one line naming the file and what is wrong with it.
"""

from __future__ import annotations

import re
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ..config import Config
from ..errors import MinitfError, first_line, shown
from ..model import Transformer
from ..run_dir import SNAPSHOTS, TOKENIZER, list_snapshots, snapshot_path

_STEP = re.compile(r"step_(\d{1,30})\.safetensors")  # longer digit runs are no step a run reaches


def checked_snapshots(
    run_dir: Path, cfg: Config, tokenizer_hash: str | None, model: Transformer
) -> list[tuple[int, Path]]:
    """(step, path) of every snapshot of run_dir, in step order, each checked: a file the run's
    writer names, holding its own step (no later than train.max_steps), the run's tokenizer (its
    hash; None: not checked) and the tensors of the run's model. Anything else named
    step_*.safetensors is refused."""
    kept = list_snapshots(run_dir)  # only the names the writer gives
    written = {path.name for _, path in kept}
    for path in sorted((run_dir / SNAPSHOTS).glob("step_*.safetensors")):
        if path.name not in written:
            raise MinitfError(f"{_where(run_dir, path)} {_misnamed(run_dir, path)}; remove it")
    for step, path in kept:
        problem = _link(run_dir, path) or _wrong_step(step, cfg) or _contents(path, step, tokenizer_hash, model)
        if problem:
            raise MinitfError(f"{_where(run_dir, path)} {problem}")
    return kept


def _where(run_dir: Path, path: Path) -> str:
    return f"{run_dir}: snapshot {SNAPSHOTS}/{path.name}"


def _misnamed(run_dir: Path, path: Path) -> str:
    """What is wrong with a name the writer does not give."""
    m = _STEP.fullmatch(path.name)
    if not m:
        return f"holds no step a run reaches (minitf writes {snapshot_path(run_dir, 100).name} for step 100)"
    own = snapshot_path(run_dir, int(m.group(1)))
    twice = f", which is there too: step {int(m.group(1))} would count twice" if own.exists() else ""
    return f"is not a name minitf writes (step {int(m.group(1))}'s snapshot is {own.name}{twice})"


def _link(run_dir: Path, path: Path) -> str | None:
    """A link that leads out of the run, or something that is not a regular file."""
    target = path.resolve()
    if not target.is_relative_to(run_dir.resolve()):
        return f"is a link to {shown(str(target))}, outside the run: training writes its snapshots itself; remove it"
    if not target.is_file():
        return "is not a regular file (training writes its snapshots as files); remove it"
    return None


def _wrong_step(step: int, cfg: Config) -> str | None:
    if step > cfg.train.max_steps:
        return f"holds step {step:,}, past the run's train.max_steps={cfg.train.max_steps:,}; remove it"
    return None


def _contents(path: Path, step: int, tokenizer_hash: str | None, model: Transformer) -> str | None:
    """The file's metadata against its name and the run's tokenizer, its tensors against the model."""
    try:
        with safe_open(str(path), "pt") as f:
            meta, shapes = f.metadata() or {}, {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        return f"is truncated or corrupted ({first_line(e, 120)}); remove it"
    if meta.get("step") != str(step):
        return f"holds step {shown(meta.get('step'))} in its metadata, not {step}: it was renamed; remove it"
    if tokenizer_hash and meta.get("tokenizer", tokenizer_hash) != tokenizer_hash:
        return f"was trained with another tokenizer than the run's {TOKENIZER}: it is another run's; remove it"
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, shape in shapes.items():
        if own.get(name) != shape:
            want = f"the run's config makes {own[name]}" if name in own else "the run's model has no such tensor"
            return f"holds {name} of shape {shape}, where {want}: it is another model's; remove it"
    return None
