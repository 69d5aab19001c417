"""The run directory: what training writes and what `load_run` reads back.

    runs/<name>/config.yaml  tokenizer.json  model.safetensors  best.safetensors
                state.pt  metrics.jsonl  loss.png

Every file is written to a temporary name in the same directory and moved into place with
os.replace, so a kill at any moment leaves the previous complete file readable. Nothing is ever
unpickled: tensors come from safetensors, the training state from torch.load(weights_only=True).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from .config import Config, ConfigError, MinitfError, load_config, save_config
from .io import atomic_write
from .model import Transformer
from .tokenizer import Tokenizer

WEIGHTS, BEST, STATE, CONFIG, TOKENIZER, METRICS = (
    "model.safetensors", "best.safetensors", "state.pt", "config.yaml", "tokenizer.json", "metrics.jsonl")


def save_weights(model: nn.Module, path: Path, step: int) -> None:
    # save_model drops the tied lm_head copy that safetensors cannot store twice
    atomic_write(path, lambda tmp: save_model(model, str(tmp), metadata={"step": str(step)}))


def save_state(state: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise MinitfError(f"{path} not found; start a new run without --resume") from None
    except Exception as e:  # a truncated or foreign file
        raise MinitfError(f"{path} is unreadable ({type(e).__name__}); the training state is damaged") from None


def load_weights(model: nn.Module, path: Path) -> None:
    path = Path(path)
    if not path.is_file():
        raise MinitfError(f"{path} not found; is this a run directory written by minitf training?")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise MinitfError(f"{path} is truncated or corrupted ({str(e).splitlines()[0][:120]})") from None
    if missing or unexpected:
        raise MinitfError(f"{path} does not fit this model config (missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]}); was config.yaml edited?")


def append_metrics(run_dir: Path, record: dict) -> None:
    with open(Path(run_dir) / METRICS, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a kill
            pass
    return out


def truncate_metrics(run_dir: Path, step: int) -> None:
    """On resume, drop records logged after the checkpoint we go back to, so steps never repeat."""
    records = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    atomic_write(Path(run_dir) / METRICS,
                 lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in records)))


def load_run(path: str | Path, best: bool = False, device: str | torch.device = "cpu"):
    """(model, tokenizer, config) from a run directory; the model is in eval mode on `device`."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise MinitfError(f"run directory {str(run_dir)!r} does not exist; train one first "
                          f"(python scripts/train.py) or pass --run DIR")
    for name in (CONFIG, TOKENIZER, BEST if best else WEIGHTS):
        if not (run_dir / name).is_file():
            raise MinitfError(f"{run_dir} has no {name}; it is not a complete minitf run directory")
    cfg = load_config(run_dir / CONFIG)
    tok = Tokenizer.load(run_dir / TOKENIZER)
    if cfg.model.vocab_size != tok.vocab_size:
        raise MinitfError(f"{run_dir / TOKENIZER} has {tok.vocab_size} tokens but the model was built "
                          f"for {cfg.model.vocab_size}; the tokenizer does not belong to this run")
    model = Transformer(cfg.model).to(device)
    load_weights(model, run_dir / (BEST if best else WEIGHTS))
    return model.eval(), tok, cfg


def write_run_files(run_dir: Path, cfg: Config, tokenizer: Tokenizer) -> None:
    atomic_write(run_dir / CONFIG, lambda tmp: save_config(cfg, tmp))
    atomic_write(run_dir / TOKENIZER, lambda tmp: Path(tmp).write_text(tokenizer.to_json()))


def check_run_dir(cfg: Config, resume: bool) -> Path:
    run_dir = Path(cfg.run.out_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.out_dir {str(run_dir)!r} is a file; choose a directory path")
    has_ckpt = (run_dir / STATE).is_file()
    if resume and not has_ckpt:
        raise MinitfError(f"{run_dir} has no checkpoint to resume; drop --resume to start a new run")
    if not resume and has_ckpt:
        raise MinitfError(f"{run_dir} already holds a run; pass --resume to continue it, or set "
                          f"run.out_dir to a new directory")
    if resume:
        saved = load_config(run_dir / CONFIG).model
        saved.vocab_size = cfg.model.vocab_size = None
        if saved != cfg.model:
            diff = [k for k in vars(saved) if getattr(saved, k) != getattr(cfg.model, k)]
            raise ConfigError(f"--resume with a different model config ({', '.join('model.' + k for k in diff)}"
                              f"); resume with the run's own settings or start a new run.out_dir")
    return run_dir
