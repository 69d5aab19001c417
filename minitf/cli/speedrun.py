"""Quality at equal wall time: train two or more recipes for the same budget, in turns, and
compare their validation bits per byte.

A recipe is a config (a recipe's name or a YAML file) and overrides, with an optional LABEL= in
front. The machine's speed drifts by up to 50% within minutes, so recipes are never compared
across time: each round trains every recipe once (the order rotates between rounds) and the
table reports per-round results and their medians. The first recipe is the reference: "t(ref)"
is the time each recipe took to reach the reference's final val bpb of the same round. "full val
bpb" evaluates every token of the validation split after training (the in-training curve uses a
few batches).

    minitf speedrun old=shakespeare-v1 new=shakespeare
    minitf speedrun adamw=shakespeare-v1 "muon=shakespeare-v1 train.optimizer=muon" my=configs/my.yaml \\
        --seconds 60 --rounds 3 --json speedrun.json
"""

import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from minitf.errors import ConfigError, MinitfError
from minitf.evaluate import evaluate_text
from minitf.run_dir import METRICS, load_run, read_rows
from minitf.system.machine import machine
from minitf.system.recipes import recipe_path


def parse_recipe(text: str) -> tuple[str, list[str]]:
    """'LABEL=CONFIG override ...' (LABEL= optional; CONFIG a recipe's name or a YAML path) -> (label,
    minitf train arguments)."""
    words = shlex.split(text)
    if not words:
        raise MinitfError("an empty recipe; write CONFIG [section.key=value ...], e.g. shakespeare or configs/my.yaml")
    label, config = (
        words[0].split("=", 1)
        if "=" in words[0] and "." not in words[0].split("=")[0]
        else (Path(words[0]).stem, words[0])
    )
    try:
        found = recipe_path(config)
    except ConfigError as e:
        raise MinitfError(f"recipe {label!r}: {e}") from None
    if not found.is_file():
        raise MinitfError(f"recipe {label!r}: config file {config!r} not found")
    return label, ["--config", config, *words[1:]]


def train_once(label: str, args: list[str], out_dir: Path, seconds: float, log_path: Path) -> dict:
    """Train one recipe in its own process for `seconds` of wall time; its curve and final numbers."""
    cmd = [
        sys.executable,
        "-m",
        "minitf",
        "train",
        *args,
        f"run.out_dir={out_dir}",
        f"train.max_seconds={seconds}",
        "train.max_steps=1000000",
    ]
    with open(log_path, "w") as log:
        r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise MinitfError(f"recipe {label!r} failed (exit {r.returncode}); its output is in {log_path}")
    rows = [row for row in read_rows(out_dir / METRICS) if "val_bpb" in row]
    model, tokenizer, cfg = load_run(out_dir)
    full = evaluate_text(model, tokenizer, cfg.data, log=lambda *a: None, splits=("val",))["val"]
    return {
        "curve": [(row["elapsed_s"], row["val_bpb"]) for row in rows],
        "final_bpb": rows[-1]["val_bpb"],
        "full_val_bpb": full["bits_per_byte"],
        "steps": rows[-1]["step"],
        "tokens_per_s": rows[-1]["tokens"] / rows[-1]["elapsed_s"],
        "seconds": rows[-1]["elapsed_s"],
        "params": sum(p.numel() for p in model.parameters()),
    }


def time_to_reach(curve: list, target: float) -> float | None:
    """Seconds until the curve first reaches target (linear between evaluations); None if never."""
    prev_t, prev_b = 0.0, None
    for t, b in curve:
        if b <= target:
            if prev_b is None or prev_b == b:
                return t
            return prev_t + (t - prev_t) * (prev_b - target) / (prev_b - b)
        prev_t, prev_b = t, b
    return None


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "recipes",
        nargs="+",
        metavar="[LABEL=]CONFIG [overrides]",
        help="two or more recipes, each one quoted argument; the first is the reference",
    )
    p.add_argument("--seconds", type=float, default=210.0, help="wall-clock budget per run (default: 210)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of turns (default: 2)")
    p.add_argument("--out-dir", default="runs/speedrun", help="where the runs go (default: runs/speedrun)")
    p.add_argument("--json", help="write every number and the machine here")
    args = p.parse_args(argv)
    recipes = dict(parse_recipe(r) for r in args.recipes)
    if len(recipes) < 2:
        p.error("give at least two recipes with distinct labels, e.g. old=configs/a.yaml new=configs/b.yaml")
    labels, results = list(recipes), {label: [] for label in recipes}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for rnd in range(args.rounds):
        order = labels[rnd % len(labels) :] + labels[: rnd % len(labels)]  # rotate who goes first
        for label in order:
            print(f"round {rnd + 1}/{args.rounds}: {label} ({args.seconds:.0f}s)", flush=True)
            run_dir = out / f"{label}-r{rnd + 1}"
            if run_dir.exists():
                raise MinitfError(f"{run_dir} exists; remove it or pass another --out-dir")
            results[label].append(
                train_once(label, recipes[label], run_dir, args.seconds, out / f"{label}-r{rnd + 1}.log")
            )
        target = results[labels[0]][rnd]["final_bpb"]
        for label in labels:
            results[label][rnd]["t_to_ref"] = time_to_reach(results[label][rnd]["curve"], target)
    report(recipes, results, args)


def report(recipes: dict, results: dict, args) -> None:
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    print(f"\n{args.rounds} round(s) of {args.seconds:.0f}s each, in turns; medians (per round)")
    print(f"{'recipe':<16}{'val bpb':>9}{'full val':>10}{'t(ref) s':>10}{'steps':>8}{'tok/s':>9}")
    summary = {}
    for label in recipes:
        rs = results[label]
        reach = [r["t_to_ref"] for r in rs if r["t_to_ref"] is not None]
        summary[label] = {k: med([r[k] for r in rs]) for k in ("final_bpb", "full_val_bpb", "steps", "tokens_per_s")}
        summary[label]["t_to_ref"] = med(reach) if len(reach) == len(rs) else None
        s = summary[label]
        t = f"{s['t_to_ref']:.0f}" if s["t_to_ref"] is not None else "never"
        print(
            f"{label:<16}{s['final_bpb']:>9.3f}{s['full_val_bpb']:>10.3f}{t:>10}{s['steps']:>8.0f}"
            f"{s['tokens_per_s']:>9,.0f}   (" + ", ".join(f"{r['full_val_bpb']:.3f}" for r in rs) + ")"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine(torch.device("cpu")),
                    "seconds": args.seconds,
                    "rounds": args.rounds,
                    "recipes": {label: shlex.join(words) for label, words in recipes.items()},
                    "summary": summary,
                    "runs": results,
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")
