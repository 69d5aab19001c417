"""Train a transformer language model and write a run directory.

minitf train                                        # the default recipe (configs/shakespeare.yaml)
minitf train --config tiny train.max_steps=200 model.n_layer=2    # a recipe by name, or a YAML path
minitf train --resume                               # continue runs/shakespeare from its config.yaml
minitf train --resume runs/x train.max_steps=4000   # continue runs/x, longer (or run.out_dir=runs/x)
minitf train train.max_seconds=60                   # a wall-clock budget (the LR still anneals)
torchrun --nproc_per_node=2 scripts/train.py        # data parallel over 2 processes
"""

import argparse
import os

from minitf.config import describe_keys, load_config
from minitf.errors import MinitfError
from minitf.system.recipes import recipes
from minitf.training.checkpoint import resumable_words


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (set with section.key=value) and the values a plain "
        "run uses, from configs/shakespeare.yaml (the defaults):\n" + describe_keys(load_config()),
    )
    p.add_argument(
        "--config",
        help=f"a recipe's name ({', '.join(recipes())}) or a YAML file's path (default: the defaults, "
        "which are configs/shakespeare.yaml; with --resume the run's own config.yaml, and a --config given "
        "then applies on top)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (without it: run.out_dir) from its last checkpoint and its own "
        f"config.yaml; only {resumable_words()} may change (docs/training.md, Resume)",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config values")
    args = p.parse_args(argv)
    resuming = args.resume is not False  # --resume alone is True, --resume RUN_DIR its directory
    overrides = _resume_dir(args.resume, args.overrides)
    if resuming:
        from minitf.training.checkpoint import resume_config

        cfg = resume_config(overrides, args.config)
    else:
        cfg = load_config(args.config, overrides)
    # after parsing, so --help and config errors are instant
    from minitf.export.hf import is_hf_model
    from minitf.plots.figures import plot_loss
    from minitf.system.runtime import keep_freed_memory
    from minitf.trainer import train

    # a process-wide allocator setting (this process only trains), for the small models trained here:
    # fsdp frees and regathers shards all the time, and a downloaded model's hundreds of megabytes
    # freed around each save would stay resident (LoRA on Qwen3-0.6B's shape peaked at 4.05 GiB with
    # it, 3.26 without), so both need freed memory returned
    if cfg.train.parallel != "fsdp" and not (cfg.run.init_from and is_hf_model(cfg.run.init_from)):
        keep_freed_memory()
    train(cfg, resume=resuming, on_eval=plot_loss)


def _resume_dir(resume: str | bool, overrides: list[str]) -> list[str]:
    """The overrides, with `--resume RUN_DIR`'s directory as run.out_dir. argparse hands --resume
    the word after it, so `--resume run.out_dir=runs/x ...` arrives as an override there: it goes
    back to the overrides (a section.key=value word is an override unless a directory has that name)."""
    if not isinstance(resume, str):
        return overrides
    if "=" in resume and not os.path.isdir(resume):
        return [resume, *overrides]
    named = [o.split("=", 1)[1] for o in overrides if o.startswith("run.out_dir=")]
    if named and os.path.normpath(named[-1]) != os.path.normpath(resume):
        raise MinitfError(f"--resume {resume} and run.out_dir={named[-1]} name two runs; give one of them")
    return [f"run.out_dir={resume}", *overrides]
