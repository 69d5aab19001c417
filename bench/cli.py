"""Measure minitf: training throughput, generation with and without the KV cache, tokenizer and
data preparation speed, start-up time, the explorer's first token, peak memory, and memory per process
under ddp and fsdp, the OpenAI-compatible server's first token and tokens/s. Prints a table; --json
writes the numbers with a description of the machine.

    minitf bench                                   # the default recipe on this machine
    minitf bench --config configs/nanogpt-cpu.yaml --vocab 65 --only train
    minitf bench --device cuda --config configs/gpt2-small.yaml --json gpu.json
    minitf bench --run runs/shakespeare --only startup explore
    minitf bench --only data --data-size 100 --data-files 200    # a generated 100 MB corpus
    minitf bench --only data --data-size 100 --data-procs 1 2 --data-rounds 3   # A/B in turns
    minitf bench --only memory                     # ~52M params, ddp vs fsdp, 2 CPU processes
    minitf bench --only serve --run runs/shakespeare --new-tokens 100   # 1 and 8 clients at once
    minitf bench --only profile                    # the training step by phase and by operator
    minitf bench --only nanogpt-speed --nanogpt ~/nanoGPT --rounds 5    # its train.py against ours
    minitf bench --only nanogpt-quality --nanogpt ~/nanoGPT --corpus a.txt b.txt   # equal wall time
"""

import argparse
import json

PARTS = (
    "train",
    "generate",
    "tokenizer",
    "data",
    "startup",
    "explore",
    "memory",
    "serve",
    "profile",
    "nanogpt-speed",
    "nanogpt-quality",
)
# run only when asked for: minutes, a second server, or a nanoGPT clone
SEPARATE = ("memory", "serve", "profile", "nanogpt-speed", "nanogpt-quality")


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    p = _parser(prog)
    args = _parse(p, argv)
    from bench.core import run_bench
    from minitf.system.runtime import keep_freed_memory

    if not args.system_malloc:
        keep_freed_memory()  # as minitf train does
    # the quick parts run together and print as they go; a generated corpus (--data-size) replaces
    # the data part's own corpus, and each separate part runs after them, on its own
    parts = [w for w in args.only if not (w == "data" and args.data_size) and w not in SEPARATE]
    results = run_bench(
        args.config, args.overrides, args.device, args.vocab, parts, args.run, args.new_tokens, args.steps, args.rounds
    )
    results["keep_freed_memory"] = not args.system_malloc
    if args.data_size:
        results["data_scaling"] = _data_scaling(args)
    if "memory" in args.only:
        from bench.memory import memory_per_rank

        results["memory_per_rank"] = memory_per_rank(args.memory_procs)
    if "serve" in args.only:
        results["serve"] = _serve(args)
    if "profile" in args.only:
        results["profile"] = _profile(args)
    nanogpt_parts = [w for w in args.only if w.startswith("nanogpt-")]
    if nanogpt_parts:
        results.update(_against_nanogpt(args, nanogpt_parts, p))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="shakespeare", help="a recipe's name or a YAML path (default: shakespeare)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "mps"])
    p.add_argument("--vocab", type=int, help="model vocabulary for the synthetic runs (default: data.vocab_size)")
    p.add_argument(
        "--only",
        nargs="+",
        default=[w for w in PARTS if w not in SEPARATE],
        metavar="PART",
        help=f"any of {', '.join(PARTS)} (default: all but {' and '.join(SEPARATE)})",
    )
    p.add_argument(
        "--run", help="a trained run for the start-up and explorer measurements (default: the newest under runs/)"
    )
    p.add_argument("--new-tokens", type=int, default=500)
    p.add_argument("--steps", type=int, default=20, help="timed training steps per repeat")
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of turns: generation, serve, nanogpt-speed and nanogpt-quality"
    )
    p.add_argument(
        "--data-size",
        type=float,
        metavar="MB",
        help="with --only data: prepare a generated corpus of this size instead of data.source",
    )
    p.add_argument("--data-files", type=int, default=1, help="the generated corpus as this many files")
    p.add_argument("--parquet", action="store_true", help="the generated corpus as parquet shards, read as hf:<dir>")
    p.add_argument(
        "--data-procs",
        type=int,
        nargs="+",
        metavar="N",
        help="data.num_proc values to time in turns (default: minitf's own choice)",
    )
    p.add_argument("--data-rounds", type=int, default=1, help="turns of --data-procs")
    p.add_argument("--memory-procs", type=int, default=2, help="processes for the memory part (gloo, CPU)")
    p.add_argument("--nanogpt", metavar="DIR", help="a clone of karpathy/nanoGPT, for the nanogpt-* parts")
    p.add_argument("--corpus", nargs="+", default=[], metavar="FILE", help="text files for nanogpt-quality")
    p.add_argument("--nanogpt-iters", type=int, default=200, help="train.py iterations per nanogpt-speed round")
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave glibc's allocator as it is (minitf train calls keep_freed_memory): compare both",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    return p


def _parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    # --only takes several words, so overrides written after it land there: move them back
    args.overrides += [w for w in args.only if "=" in w]
    args.only = [w for w in args.only if "=" not in w]
    unknown = [w for w in args.only if w not in PARTS]
    if unknown:
        p.error(f"--only {unknown[0]}: not a part; choose from {', '.join(PARTS)}")
    return args


def _data_scaling(args) -> list[dict]:
    """--data-size: data preparation on a generated corpus, one line per timed preparation."""
    from bench.data import data_scaling, describe

    rows = data_scaling(
        args.data_size, args.data_files, args.data_procs or [None], args.data_rounds, parquet=args.parquet
    )
    for r in rows:
        print(describe(r))
    return rows


def _serve(args) -> dict:
    """The OpenAI-compatible server's first token and tokens/s, for one client and several at once."""
    from bench.serve import describe, serve_speed
    from minitf.cli.common import newest_run

    r = serve_speed(args.run or newest_run(), args.new_tokens, args.rounds)
    print("\n".join(describe(r)))
    return r


def _profile(args) -> dict:
    """The recipe's training step by phase and by operator."""
    from bench.profile import describe, profile_step
    from minitf.config import load_config
    from minitf.system.runtime import resolve_device

    r = profile_step(load_config(args.config, args.overrides), resolve_device(args.device))
    print("\n".join(describe(r)))
    return r


def _against_nanogpt(args, parts: list[str], p: argparse.ArgumentParser) -> dict:
    import tempfile
    from pathlib import Path

    from bench import nanogpt

    if not args.nanogpt:
        p.error(f"--only {parts[0]} needs --nanogpt DIR, a clone of karpathy/nanoGPT")
    root = nanogpt.check_clone(args.nanogpt)
    corpora = [Path(c) for c in args.corpus]
    if "nanogpt-quality" in parts:
        if not corpora:
            p.error("--only nanogpt-quality needs --corpus FILE [FILE ...]: the text files to train on")
        missing = [str(c) for c in corpora if not c.is_file()]
        if missing:
            p.error(f"--corpus {missing[0]}: no such file")
    out = {}
    with tempfile.TemporaryDirectory(prefix="minitf-nanogpt-") as work:
        if "nanogpt-speed" in parts:
            out["nanogpt_speed"] = nanogpt.speed(root, args.rounds, args.nanogpt_iters, Path(work))
        if "nanogpt-quality" in parts:
            out["nanogpt_quality"] = nanogpt.quality(root, corpora, args.rounds, Path(work), args.overrides)
    return out
