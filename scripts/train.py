"""Train a transformer language model and write a run directory.

    python scripts/train.py                                   # default recipe, configs/shakespeare.yaml
    python scripts/train.py --config configs/tiny.yaml train.max_steps=200 model.n_layer=2
    python scripts/train.py --resume                          # continue the run in run.out_dir
    python scripts/train.py train.max_seconds=60              # a wall-clock budget (the LR still anneals)
    torchrun --nproc_per_node=2 scripts/train.py              # data parallel over 2 processes
"""
import argparse

from minitf.cli import REPO, run_main
from minitf.config import describe_keys, load_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="config keys (set with section.key=value) and their defaults:\n"
                                       + describe_keys())
    p.add_argument("--config", default=str(REPO / "configs" / "shakespeare.yaml"), help="YAML recipe")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in run.out_dir")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override config values")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides)
    from minitf.trainer import train  # after parsing, so --help and config errors are instant

    train(cfg, resume=args.resume)


if __name__ == "__main__":
    run_main(main)
