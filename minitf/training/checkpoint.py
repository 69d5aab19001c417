"""Writing a run directory (its names and `load_run` are run_dir.py's): checkpoints, a resume's
checks, and the lock.

Every file but metrics.jsonl and steps.jsonl (appended a line at a time) is written to a temporary name in the
same directory and moved into place with os.replace. A checkpoint is committed by one rename:
state.pt holds the weights beside the optimizer, RNG and counters, so weights and training state
always belong to the same step; model.safetensors (what generate, inspect and export read) is
written from the same weights right after, and resume repairs it if a kill came in between.
A trainer holds an OS lock on the directory (.lock) while it runs. Nothing is ever unpickled:
tensors come from safetensors, the training state from torch.load(weights_only=True).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_model

from ..chat_template import TEMPLATE_FILE, TOKENS_FILE
from ..config import Config, load_config, read_config_file, save_config
from ..errors import ConfigError, MinitfError
from ..run_dir import (
    BEST,
    CONFIG,
    LOCK,
    LOSS_PLOT,
    METRICS,
    RUN_FILES,
    STATE,
    STEPS,
    TOKENIZER,
    WEIGHTS,
    refuse_non_finite,
    weights_metadata,
    weights_step,
)
from ..system.files import atomic_write, open_nofollow, read_yaml, refuse_symlink
from ..system.runtime import give_back_freed_memory
from ..system.streamed_safetensors import write_streamed
from ..tokenizer import Tokenizer
from . import lora

# The keys a resume may change (--resume with overrides): the budget, the cadence of evaluations,
# checkpoints, logs and snapshots, how and where it runs, and sampling; the rest would make the
# checkpoint another run's.
RESUMABLE = (
    "train.max_steps",
    "train.max_seconds",
    "train.eval_every",
    "train.eval_batches",
    "train.eval_metric",
    "train.ckpt_every",
    "train.log_every",
    "train.snapshot_every",
    "train.logger",
    "train.typical_steps",
    "train.fit_budget",
    "train.compile",
    "train.activation_checkpointing",
    "train.max_bad_steps",
    "run.device",
    "run.out_dir",
    "run.name",
    "run.init_from",
    "run.weights_dtype",
    "data.num_proc",
    "sample.",
)


def resumable_words() -> str:
    """RESUMABLE as a sentence for --help: "train.max_steps, ..., and sample.*"."""
    keys = [k + "*" if k.endswith(".") else k for k in RESUMABLE]
    return ", ".join(keys[:-1]) + ", and " + keys[-1]


def save_weights(model: nn.Module, path: Path, step: int, tokenizer_hash: str | None = None) -> None:
    """Weights as safetensors, with the step and the hash of the tokenizer they were trained with."""
    meta = {"step": str(step), **({"tokenizer": tokenizer_hash} if tokenizer_hash else {})}
    if lora.is_plain(model, model.weights_dtype):  # as the readers take it: no copy to make
        # save_model drops the tied lm_head copy that safetensors cannot store twice
        atomic_write(path, lambda tmp: save_model(model, str(tmp), metadata=meta))
        return
    # a LoRA run's readers get the merged weights under the plain names, and every run's are in
    # run.weights_dtype: each tensor made and written in turn, never a second copy of the model
    entries = lora.merged_entries(model, model.weights_dtype)
    if model.config.tie_embeddings:  # stored once, under the head's name, as save_model stores it
        entries = [e for e in entries if e.name != "wte.weight"]
        meta["wte.weight"] = "lm_head.weight"
    atomic_write(path, lambda tmp: write_streamed(Path(tmp), entries, meta))
    give_back_freed_memory()  # the made tensors' pages go back to the OS, not into the next step's peak


def write_checkpoint(run_dir: Path, model: nn.Module, state: dict, step: int) -> None:
    """Commit a checkpoint: state.pt (training state + the weights) in one rename, then
    model.safetensors from the same weights for the readers. state["tokenizer"]: its hash."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    write_state(run_dir, {**state, "model": weights}, step)
    save_weights(model, run_dir / WEIGHTS, step, state.get("tokenizer"))


def write_state(run_dir: Path, state: dict, step: int) -> None:
    """The commit point: state.pt, written whole or not at all."""
    atomic_write(run_dir / STATE, lambda tmp: _torch_save({**state, "step": step}, tmp))


def _torch_save(obj: dict, path: Path) -> None:
    with open(path, "wb") as f:  # through Python's file: a full disk is its OSError, not torch's "unexpected pos"
        torch.save(obj, f)


def read_state(run_dir: Path, needs: str = "model") -> dict:
    """state.pt as a dict (weights_only: nothing is unpickled); `needs` is a key it must hold."""
    path = run_dir / STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not {"step", needs} <= state.keys():
            raise KeyError(needs)
    except FileNotFoundError:
        raise MinitfError(f"{path} not found; start a new run without --resume") from None
    except Exception as e:  # a truncated or foreign file: torch raises many kinds
        raise MinitfError(
            f"{path} is unreadable ({type(e).__name__}); the training state is damaged, start a new run.out_dir"
        ) from None
    return state


def load_checkpoint(run_dir: Path, model: nn.Module, log=print, repair: bool = True) -> dict:
    """The training state of the last committed checkpoint, its weights loaded into model.
    repair: rewrite model.safetensors from state.pt if it is missing or of another step."""
    path = run_dir / STATE
    state = read_state(run_dir)
    step, weights = state["step"], state["model"]
    refuse_non_finite(weights.items(), path, DIVERGED_STATE)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        raise MinitfError(
            f"{path} holds a model of another shape ({str(e).splitlines()[-1].strip()[:100]}); was config.yaml edited?"
        ) from None
    found = weights_step(run_dir / WEIGHTS)
    if repair and found != step:
        log(f"repairing {run_dir / WEIGHTS}: it holds step {found}, the committed checkpoint step {step}")
        save_weights(model, run_dir / WEIGHTS, step, state.get("tokenizer"))
    return state


DIVERGED_STATE = "it cannot be resumed; start a new run.out_dir with a lower train.lr"


def write_config(run_dir: Path, cfg: Config) -> None:
    atomic_write(run_dir / CONFIG, lambda tmp: save_config(cfg, tmp))


def write_run_files(run_dir: Path, cfg: Config, tokenizer: Tokenizer) -> None:
    write_config(run_dir, cfg)
    atomic_write(run_dir / TOKENIZER, lambda tmp: Path(tmp).write_text(tokenizer.to_json()))
    template = tokenizer.chat_template
    if template is not None:  # a chat run: the template its answers are read in, and the tokens it names
        if template.special:
            atomic_write(
                run_dir / TOKENS_FILE, lambda tmp: Path(tmp).write_text(template.tokens_json(), encoding="utf-8")
            )
        atomic_write(run_dir / TEMPLATE_FILE, lambda tmp: Path(tmp).write_text(template.source, encoding="utf-8"))


# what a resume may change without invalidating the run: budget, cadence, speed switches, where it runs
BUDGET = ("train.max_steps", "train.max_seconds")


def changed_keys(old: Config, new: Config) -> dict[str, tuple]:
    """{'section.key': (old, new)} for every key whose value differs (the model's vocab_size,
    which comes from the tokenizer, aside)."""
    a, b = old.to_dict(), new.to_dict()
    return {
        f"{sec}.{key}": (a[sec][key], b[sec][key])
        for sec in a
        for key in a[sec]
        if a[sec][key] != b[sec][key] and f"{sec}.{key}" != "model.vocab_size"
    }


def resume_config(overrides=(), config_path=None, default_config=None) -> Config:
    """The config a resume runs with: the run's own config.yaml, then config_path's values, then the overrides.

    config_path counts only if one is given. The run directory is the run.out_dir that the
    overrides, config_path or default_config name.
    """
    run_dir = Path(load_config(config_path or default_config, overrides).run.out_dir)
    if not (run_dir / CONFIG).is_file():
        what = "checkpoint" if not run_dir.is_dir() else CONFIG
        raise MinitfError(
            f"{run_dir} has no {what} to resume; drop --resume to start a new run, or name the run with run.out_dir=DIR"
        )
    base = read_yaml(run_dir / CONFIG)
    for section, values in (read_config_file(config_path) if config_path else {}).items():
        base.setdefault(section, {}).update(values or {})
    return load_config(base, overrides)


def check_run_dir(cfg: Config, resume: bool) -> tuple[Path, dict[str, tuple]]:
    """The run directory, and on resume the keys cfg changes from the run's own config.yaml
    (only RESUMABLE ones may change)."""
    run_dir = Path(cfg.run.out_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.out_dir {str(run_dir)!r} is a file; choose a directory path")
    for name in sorted(RUN_FILES):  # before any training time is spent: every write there would be refused
        refuse_symlink(run_dir / name)
    for path in sorted(run_dir.glob("sharded-*")):  # fsdp's checkpoint folders (fsdp.py)
        refuse_symlink(path)
    if resume and not (run_dir / STATE).is_file():
        if any((run_dir / n).is_file() for n in (WEIGHTS, BEST)):
            raise MinitfError(
                f"{run_dir} has weights but no training state ({STATE}): it stopped before its first "
                f"checkpoint or was copied without it, so it cannot be resumed; start a new run.out_dir"
            )
        raise MinitfError(f"{run_dir} has no checkpoint to resume; drop --resume to start a new run")
    if not resume:
        held = [n for n in (STATE, WEIGHTS, BEST) if (run_dir / n).is_file()]
        if held:
            raise MinitfError(
                f"{run_dir} already holds a run; pass --resume to continue it, or set run.out_dir to "
                f"a new directory (it has {', '.join(held)})"
            )
        check_fresh_dir(run_dir, cfg)
        return run_dir, {}
    check_resume_tokenizer(run_dir)
    changed = changed_keys(load_config(run_dir / CONFIG), cfg)
    fixed = [k for k in changed if not k.startswith(RESUMABLE)]
    if fixed:
        raise ConfigError(
            f"--resume cannot change {', '.join(fixed)} (the run was trained with "
            f"{', '.join(f'{k}={changed[k][0]!r}' for k in fixed)}); resume with the run's own "
            f"config or start a new run.out_dir. A resume may change only {', '.join(RESUMABLE)}*"
        )
    from ..corpus.prepare import check_corpus_unchanged

    check_corpus_unchanged(cfg.data, run_dir / STATE)  # before any data is prepared for the new text
    return run_dir, changed


def check_resume_tokenizer(run_dir: Path) -> None:
    """A resume needs the run's own tokenizer.json, checked before any data is prepared.

    The checkpoint's token ids mean nothing without it, and another one (even of the same size)
    would go on training on other tokens. The weights' metadata holds the hash of the tokenizer
    they were trained with.
    """
    path = run_dir / TOKENIZER
    if not path.is_file():
        raise MinitfError(
            f"{run_dir} has a checkpoint but no {TOKENIZER}, which --resume needs (the model's token ids mean "
            f"nothing without the tokenizer it was trained with); put the run's own {TOKENIZER} back from a copy "
            f"of the run, or start a new run.out_dir"
        )
    trained_with = weights_metadata(run_dir / WEIGHTS).get("tokenizer")
    if trained_with and trained_with != Tokenizer.load(path).hash:
        raise MinitfError(
            f"{path} is not the tokenizer this run was trained with (its hash differs from the one recorded "
            f"in {WEIGHTS}); put the run's own {TOKENIZER} back, or start a new run.out_dir"
        )


# what a fresh run may find in its directory: what an earlier attempt at the same run left before
# its first checkpoint (config.yaml, tokenizer.json, logs), the lock, and half-written temporary files
OURS = RUN_FILES - {STATE, WEIGHTS, BEST}
STALE = (METRICS, STEPS, LOSS_PLOT)  # rows of an attempt that never checkpointed


def check_fresh_dir(run_dir: Path, cfg: Config) -> None:
    """A fresh run writes only into an empty directory or one minitf created for this same run.

    Such a directory's config.yaml parses as a minitf config naming this run.out_dir, and every
    other entry is a file minitf writes; anything else is the user's, and is refused rather than
    overwritten. The logs of an earlier attempt that never reached a checkpoint are dropped, not
    mixed in.
    """
    if not run_dir.is_dir():
        return
    entries = sorted(run_dir.iterdir())
    foreign = [
        f"{e.name} (a link)" if e.is_symlink() else e.name
        for e in entries
        if e.is_symlink() or not (e.name in OURS or re.fullmatch(r"\..*\.tmp|sharded-\d{8}", e.name))
    ]
    if not foreign and (run_dir / CONFIG).exists() and not _our_config(run_dir / CONFIG, cfg):
        foreign = [f"{CONFIG} (not this run's)"]
    if foreign:
        raise MinitfError(
            f"{run_dir} holds files minitf did not write ({', '.join(foreign[:4])}{', ...' * (len(foreign) > 4)}); "
            f"a new run needs an empty directory or one minitf made for this run.out_dir: set run.out_dir to a "
            f"new directory, or move those files away"
        )
    for name in STALE:
        (run_dir / name).unlink(missing_ok=True)


def _our_config(path: Path, cfg: Config) -> bool:
    """path is a config.yaml minitf wrote for this run: a minitf config whose run.out_dir is cfg's."""
    try:
        theirs = load_config(path).run.out_dir
    except (MinitfError, OSError):
        return False
    mine = cfg.run.out_dir
    return theirs == mine or Path(theirs).resolve() == Path(mine).resolve()


@contextlib.contextmanager
def lock_run_dir(run_dir: Path, create: bool = True):
    """Hold an exclusive OS lock on run_dir/.lock: a second trainer on the same directory is refused.

    The kernel drops the lock when the process dies, so a kill -9 never leaves a stale one. A run
    that is refused or fails removes the .lock it created, and the directories it created if they
    are still empty: a refused run leaves the directory as it found it. create=False: a missing
    directory is not made (nor locked: there is nothing in it to protect).
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run.out_dir {str(run_dir)!r} is a file; choose a directory path")
    try:
        import fcntl
    except ImportError:  # Windows: no flock; run unlocked
        yield
        return
    if not create and not run_dir.is_dir():
        yield
        return
    made = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # deepest first: what mkdir creates
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinitfError(f"could not create {run_dir}: {e.strerror or e}") from None
    lock = run_dir / LOCK
    new_lock, locked = not os.path.lexists(lock), False
    try:
        fd = open_nofollow(lock, os.O_RDWR | os.O_CREAT)  # a linked .lock is never truncated
    except OSError as e:
        raise MinitfError(f"could not create {lock}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise MinitfError(
                f"{run_dir} is in use by pid {pid}; wait for that training to end or choose another run.out_dir"
            ) from None
        locked = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    except BaseException:
        # a run refused (or failed) leaves the directory as it found it: no .lock of ours among the
        # user's files, and no directory it created if nothing else was written there
        if locked and new_lock:
            with contextlib.suppress(OSError):
                lock.unlink()
            for d in made:
                try:
                    d.rmdir()  # only if empty
                except OSError:
                    break
        raise
    finally:
        os.close(fd)
