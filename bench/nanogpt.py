"""minitf against nanoGPT's CPU quick start, on one machine, in turns: `minitf bench --only
nanogpt-speed nanogpt-quality --nanogpt PATH` with PATH a clone of karpathy/nanoGPT.

Speed: nanoGPT's own train.py at its CPU quick-start model (its per-iteration times, the first
iterations and the evaluations left out) against minitf's training step at the same model
(`configs/nanogpt-cpu.yaml`, float32), one after the other in each round; the ratio is the median
of the rounds' ratios, so a machine that drifts moves both alike.

Quality at equal wall time, on any text file: nanoGPT's quick start (its character-level data
from the file, 2000 iterations, timed from launch to exit) against minitf's default recipe given
that many seconds (`minitf train data.source=file:FILE train.max_seconds=<nanoGPT's time>`). Both
hold out the file's last tenth by characters, so both are scored on the same validation text, each
on all of it, in bits per byte: nanoGPT's nats per character converted with the text's bytes per
character. nanoGPT's final weights are scored (its checkpoint written at every evaluation).

nanoGPT's code runs in its own processes, from the clone; its checkpoint is read back with
torch.load(weights_only=True), which holds plain tensors and numbers only.
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from minitf.errors import MinitfError

# nanoGPT README's CPU quick start, with the evaluation of 20 batches it suggests for a CPU
QUICK_START = [
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]
TOKENS_PER_ITER = 12 * 64
ITER_LINE = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", re.M)


def check_clone(nanogpt: str | Path) -> Path:
    root = Path(nanogpt).expanduser()
    if not (root / "train.py").is_file() or not (root / "model.py").is_file():
        raise MinitfError(
            f"--nanogpt {nanogpt}: not a nanoGPT clone (no train.py and model.py); git clone karpathy/nanoGPT"
        )
    return root


def prepare(root: Path, text_file: Path, name: str) -> Path:
    """nanoGPT's character-level data of text_file, as its shakespeare_char/prepare.py makes it
    (run from the clone on a copy of the file): data/<name>/{train,val}.bin and meta.pkl."""
    data_dir = root / "data" / name
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(text_file, data_dir / "input.txt")
    shutil.copyfile(root / "data" / "shakespeare_char" / "prepare.py", data_dir / "prepare.py")
    r = subprocess.run([sys.executable, "prepare.py"], cwd=data_dir, capture_output=True, text=True)
    if r.returncode != 0:
        raise MinitfError(f"nanoGPT's prepare.py failed on {text_file}: {r.stderr.strip().splitlines()[-1:]}")
    return data_dir


def nanogpt_train(root: Path, args: list[str], log_path: Path) -> tuple[float, str]:
    """Run nanoGPT's train.py with args; (wall seconds, its output)."""
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "train.py", *args], cwd=root, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    seconds = time.perf_counter() - t0
    log_path.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise MinitfError(f"nanoGPT's train.py failed (exit {r.returncode}); its output is in {log_path}")
    return seconds, r.stdout


def iteration_ms(output: str, skip: int = 10, eval_interval: int | None = None) -> float:
    """Median milliseconds per iteration in train.py's log, past the first `skip` iterations and
    without the iterations that follow an evaluation (their time includes it)."""
    times = [
        float(ms)
        for it, ms in ITER_LINE.findall(output)
        if int(it) >= skip and not (eval_interval and int(it) % eval_interval == 0)
    ]
    if not times:
        raise MinitfError("nanoGPT's train.py printed no iteration times")
    return statistics.median(times)


def speed(root: Path, rounds: int, iters: int, work: Path, log=print) -> dict:
    """Tokens/s of nanoGPT's train.py and of minitf's step at the same model, in turns."""
    from bench.core import train_throughput
    from minitf.config import load_config

    data = root / "data" / "shakespeare_char"
    if not (data / "train.bin").is_file():
        raise MinitfError(f"{data}/train.bin is missing: run `python data/shakespeare_char/prepare.py` in {root}")
    cfg = load_config("nanogpt-cpu", ["model.vocab_size=65"])
    args = [*QUICK_START, f"--max_iters={iters}", f"--eval_interval={iters + 1}", f"--out_dir={work / 'out'}"]
    rows = []
    for r in range(rounds):
        _, out = nanogpt_train(root, args, work / f"nanogpt-speed-r{r + 1}.log")
        theirs = TOKENS_PER_ITER * 1000 / iteration_ms(out)
        ours = train_throughput(cfg, torch.device("cpu"), steps=20, warmup=5, repeats=3)["tokens_per_s"]
        rows.append({"nanogpt_tokens_per_s": round(theirs), "minitf_tokens_per_s": round(ours)})
        log(f"round {r + 1}: nanoGPT {theirs:,.0f} tokens/s, minitf {ours:,.0f} tokens/s, x{ours / theirs:.2f}")
    ratio = statistics.median(row["minitf_tokens_per_s"] / row["nanogpt_tokens_per_s"] for row in rows)
    log(f"minitf / nanoGPT, median of {rounds} rounds: x{ratio:.2f}")
    return {"rounds": rows, "median_ratio": round(ratio, 3)}


def nanogpt_val_bpb(root: Path, data_dir: Path, out_dir: Path) -> float:
    """Bits per byte of nanoGPT's checkpoint on the whole val.bin: non-overlapping windows of its
    block size, every character scored once, nats per character times characters per byte."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", root / "model.py")
    ng = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ng)
    ckpt = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=True)
    model = ng.GPT(ng.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.eval()
    ids = torch.from_numpy(np.fromfile(data_dir / "val.bin", dtype=np.uint16).astype(np.int64))  # (N,)
    T = model.config.block_size
    n = ids.numel() - 1  # characters that have a next one to predict
    nats = 0.0
    with torch.no_grad():
        starts = list(range(0, n - n % T, T * 32)) + ([n - n % T] if n % T else [])
        for start in starts:
            width = T if start + T <= n else n - start  # the tail shorter than a window is one short window
            stop = min(start + T * 32, n - n % T) if width == T else n
            x = ids[start:stop].view(-1, width)  # (B, width)
            y = ids[start + 1 : stop + 1].view(-1, width)  # (B, width)
            logits, _ = model(x, y)  # (B, width, V): nanoGPT returns every position's logits with targets
            nats += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
    count = n
    text = (data_dir / "input.txt").read_text(encoding="utf-8")
    val_text = text[int(len(text) * 0.9) :]
    return nats / count / math.log(2) * len(val_text) / len(val_text.encode("utf-8"))


def quality(root: Path, corpora: list[Path], rounds: int, work: Path, recipe: list[str], log=print) -> list[dict]:
    """nanoGPT's quick start and minitf's recipe at equal wall time on each corpus, in turns."""
    from minitf.cli.speedrun import train_once

    rows = []
    for r in range(rounds):
        for corpus in corpora:
            name = f"minitf-{corpus.stem}"
            data_dir = prepare(root, corpus, name)
            out = work / f"nanogpt-{corpus.stem}-r{r + 1}"
            args = [*QUICK_START, f"--dataset={name}", f"--out_dir={out}", "--always_save_checkpoint=True"]
            seconds, _ = nanogpt_train(root, args, work / f"nanogpt-{corpus.stem}-r{r + 1}.log")
            theirs = nanogpt_val_bpb(root, data_dir, out)
            ours = train_once(
                "minitf",
                [f"data.source=file:{corpus.resolve()}", *recipe],
                work / f"minitf-{corpus.stem}-r{r + 1}",
                round(seconds, 1),
                work / f"minitf-{corpus.stem}-r{r + 1}.log",
            )
            row = {
                "corpus": corpus.name,
                "mb": round(corpus.stat().st_size / 1e6, 2),
                "round": r + 1,
                "seconds": round(seconds, 1),
                "nanogpt_val_bpb": round(theirs, 4),
                "minitf_val_bpb": round(ours["full_val_bpb"], 4),
                "minitf_steps": ours["steps"],
                "ratio": round(theirs / ours["full_val_bpb"], 3),
            }
            rows.append(row)
            log(
                f"{corpus.name} ({row['mb']} MB), round {r + 1}: {seconds:.0f} s each; val bits per byte nanoGPT "
                f"{theirs:.3f}, minitf {ours['full_val_bpb']:.3f} ({ours['steps']} steps): x{row['ratio']:.2f} lower"
            )
    return rows
