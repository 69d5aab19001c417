"""The prepared GPU measurement: everything `bench/gpu.sh` runs on a lent GPU, in one process that
writes one JSON (gpu.json) beside the shell script's log, section by section, so a command cut short
still leaves what it measured.

    python -m bench.gpu --out DIR [--nanogpt CLONE] [--dry-run]

Sections, each a dict in gpu.json (an error is recorded in its section and the next one runs):
- cuda_tests: the tests that skip without a CUDA device ("needs a CUDA device"), run by pytest;
- train: the default recipe for a fixed number of steps, eager and with train.compile=true, each
  resumed once with more steps; tokens/s, MFU and the time beyond the steady rate from steps.jsonl,
  peak memory from the training process;
- gpt2_small: configs/gpt2-small.yaml's training step (bench/core.py train_throughput) and, given a
  nanoGPT clone, nanoGPT's own bench.py at the same model and batch;
- decode: batch-1 decoding of the 124M model (gpt2-small's shape, random weights) in bfloat16,
  eager, compiled without CUDA graphs and compiled with them (the default on a GPU), and Hugging
  Face generate on `minitf export`'s directory of it.

The corpus is generated here (random words, written to DIR/corpus), so nothing is fetched.
--dry-run: the same code paths on the CPU at tiny sizes (a 1-layer model, a few steps and tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

SIZES = {
    "gpu": {
        "device": "cuda",
        "corpus_words": 60_000,  # distinct words: enough pairs for BPE to reach GPT-2's 50,257 tokens
        "corpus_repeats": 4,
        "train_steps": 300,
        "log_every": 50,
        "recipe": [],
        "gpt2": [],
        "gpt2_steps": (3, 10, 2),  # warm-up, timed steps, repeats
        "decode_vocab": 50257,
        "decode_tokens": 256,
        "decode_rounds": 3,
    },
    "dry": {
        "device": "cpu",
        "corpus_words": 400,
        "corpus_repeats": 4,
        "train_steps": 4,
        "log_every": 2,
        "recipe": ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32"]
        + ["train.batch_size=2", "data.vocab_size=300"],
        "gpt2": ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32"]
        + ["train.batch_size=2", "train.grad_accum=1"],
        "gpt2_steps": (1, 2, 1),
        "decode_vocab": 300,
        "decode_tokens": 8,
        "decode_rounds": 1,
    },
}
NANOGPT_SKIPPED = "no nanoGPT clone given (bench/gpu.sh --nanogpt DIR)"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__)
    p.add_argument("--out", required=True, help="folder for gpu.json and what the runs write")
    p.add_argument("--nanogpt", metavar="DIR", help="a clone of karpathy/nanoGPT: its bench.py beside ours")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, through the same code")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sizes = SIZES["dry" if args.dry_run else "gpu"]
    device = torch.device(sizes["device"])
    from minitf.system.machine import machine

    results = {"dry_run": args.dry_run, "sizes": sizes, "machine": machine(device)}
    corpus = write_corpus(out / "corpus", sizes["corpus_words"], sizes["corpus_repeats"])
    sections = {
        "cuda_tests": lambda: cuda_tests(out),
        "train": lambda: train_runs(out, corpus, sizes),
        "gpt2_small": lambda: gpt2_small(out, device, sizes, args.nanogpt),
        "decode": lambda: decode(out, corpus, device, sizes),
    }
    for name, section in sections.items():
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            results[name] = section()
        except Exception as e:  # one broken section must not cost the others their GPU time
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        results[name]["section_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(results[name]), flush=True)
        (out / "gpu.json").write_text(json.dumps(results, indent=2) + "\n")


def write_corpus(folder: Path, words: int, repeats: int) -> Path:
    """A text corpus of made-up words, each used `repeats` times in random order: BPE merges its
    words apart, so the tokenizer can reach a large vocabulary on a few MB."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(words)]
    stream = vocab * repeats
    rng.shuffle(stream)
    lines = [" ".join(stream[i : i + 12]) + "." for i in range(0, len(stream), 12)]
    path = folder / "words.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---- the CUDA-only tests


def cuda_tests(out: Path) -> dict:
    """pytest on the test files that hold a test skipped without a CUDA device, selecting those tests
    (-k cuda: their names, the `cuda` marker, or a file named for CUDA). Skips on a CPU."""
    root = Path(__file__).resolve().parent.parent
    files = sorted(
        str(f.relative_to(root))
        for f in (root / "tests").rglob("test_*.py")
        if "needs a CUDA device" in f.read_text(encoding="utf-8")
    )
    # -n 0: in one process, so no two tests share the GPU at once
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-k", "cuda", *files]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    (out / "cuda_tests.log").write_text(r.stdout + r.stderr)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", r.stdout)}
    return {"files": files, "exit_code": r.returncode, **counts}


# ---- the default recipe, trained and resumed


def train_runs(out: Path, corpus: Path, sizes: dict) -> dict:
    """The default recipe for train_steps steps, then resumed to twice that, eager and compiled."""
    n, res = sizes["train_steps"], {}
    for name, compiled in (("eager", False), ("compiled", True)):
        run = out / "runs" / name
        words = [f"run.out_dir={run}", f"run.device={sizes['device']}", f"data.source=file:{corpus}"]
        words += [f"train.max_steps={n}", "train.max_seconds=null", f"train.log_every={sizes['log_every']}"]
        words += [f"train.eval_every={n}", f"train.ckpt_every={n}", "train.eval_batches=2"]
        words += [f"train.compile={str(compiled).lower()}", *sizes["recipe"]]
        first = train_child(out, f"{name}", words)
        resumed = train_child(out, f"{name}-resumed", ["--resume", str(run), f"train.max_steps={2 * n}"])
        rows = _steps_rows(run)
        res[name] = {**first, **_rates(rows, 0, n)}
        res[f"{name}_resumed"] = {**resumed, **_rates(rows, n, 2 * n)}
    for key in ("", "_resumed"):  # compilation: what the compiled run spent beyond the eager one's start
        res[f"compile{key}_s"] = round(res[f"compiled{key}"]["overhead_s"] - res[f"eager{key}"]["overhead_s"], 2)
    return res


def train_child(out: Path, name: str, words: list[str]) -> dict:
    """`minitf train WORDS` in its own process (its peak memory alone), logged to OUT/train-NAME.log."""
    peak = out / f"train-{name}.peak"
    child = "import sys; from bench.gpu import train_in_process; train_in_process(sys.argv[1], sys.argv[2:])"
    cmd = [sys.executable, "-c", child, str(peak), *words]
    env = {**os.environ, "MINITF_CACHE": str(out / "cache")}  # the token cache beside the results
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    (out / f"train-{name}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"minitf train ({name}) exited {r.returncode}: see train-{name}.log")
    return {"wall_s": round(wall, 1), "peak_memory_mb": json.loads(peak.read_text())["peak_memory_mb"]}


def train_in_process(peak: str, words: list[str]) -> None:
    """What train_child runs: minitf train's own main, then this process's peak memory."""
    from bench.core import peak_memory_mb
    from minitf.cli.train import main as train_main

    train_main(words)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where run.device trains
    Path(peak).write_text(json.dumps({"peak_memory_mb": round(peak_memory_mb(device), 1)}))


def _steps_rows(run: Path) -> list[dict]:
    from minitf.run_dir import read_rows

    return read_rows(run / "steps.jsonl")


def _rates(rows: list[dict], start: int, stop: int) -> dict:
    """tokens/s and MFU (medians, the first interval left out: it holds start-up and compilation),
    and overhead_s: the first interval's time beyond what its steps take at the steady rate."""
    seg = [r for r in rows if start < r["step"] <= stop]
    steady = seg[1:] or seg
    tok_s = statistics.median(r["tokens_per_s"] for r in steady)
    step_s = statistics.median(
        (b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"]) for a, b in zip(seg, seg[1:])
    )
    before = max((r["elapsed_s"] for r in rows if r["step"] <= start), default=0.0)
    first = seg[0]["elapsed_s"] - before
    mfus = [r["mfu"] for r in steady if "mfu" in r]
    return {
        "steps": stop - start,
        "tokens_per_s": round(tok_s),
        "mfu": round(statistics.median(mfus), 4) if mfus else None,
        "first_interval_s": round(first, 2),
        "overhead_s": round(first - (seg[0]["step"] - start) * step_s, 2),
    }


# ---- GPT-2 small's training step, and nanoGPT's


def gpt2_small(out: Path, device: torch.device, sizes: dict, nanogpt: str | None) -> dict:
    """configs/gpt2-small.yaml's step through bench/core.py's train_throughput (compiled, as the
    recipe says), and nanoGPT's bench.py at the same model and per-step batch when a clone is given."""
    from bench.core import peak_memory_mb, train_throughput
    from minitf.config import load_config

    cfg = load_config("gpt2-small", sizes["gpt2"])
    cfg.model.vocab_size = cfg.data.vocab_size
    warmup, steps, repeats = sizes["gpt2_steps"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    r = train_throughput(cfg, device, steps=steps, warmup=warmup, repeats=repeats)
    r["compile_s"] = round(r["warmup_s"] - warmup * r["ms_per_step"] / 1000, 2)  # warm-up beyond steady steps
    r["peak_memory_mb"] = round(peak_memory_mb(device), 1)
    res = {"minitf": r}
    if nanogpt is None:
        res["nanogpt"] = {"skipped": NANOGPT_SKIPPED}
    else:
        res["nanogpt"] = nanogpt_bench(Path(nanogpt), out, cfg, device)
    return res


# nanoGPT's bench.py calls torch.cuda.synchronize before its burn-in, after it (10 steps) and after
# its 20 timed steps: stamping those calls times its compilation without changing its code
NANOGPT_WRAPPER = """
import json, runpy, sys, time, torch
stamps, sync = [], torch.cuda.synchronize
def stamped(*a, **k):
    if torch.cuda.is_available():
        sync(*a, **k)
    stamps.append(time.perf_counter())
torch.cuda.synchronize = stamped
sys.argv = ["bench.py", *sys.argv[1:]]
runpy.run_path("bench.py", run_name="__main__")
peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
print("MINITF_GPU " + json.dumps({"stamps": stamps, "peak_memory_mb": peak}))
"""


def nanogpt_bench(root: Path, out: Path, cfg, device: torch.device) -> dict:
    """nanoGPT's bench.py (random tokens, its simple benchmark: 10 burn-in steps, 20 timed) at
    gpt2-small's model and the batch of one micro-step (nanoGPT's bench has no accumulation)."""
    from bench.nanogpt import check_clone

    root = check_clone(root)
    m, tc = cfg.model, cfg.train
    args = [f"--batch_size={tc.batch_size}", f"--block_size={m.block_size}", f"--bias={m.bias}"]
    args += ["--real_data=False", "--profile=False", f"--compile={tc.compile}", f"--device={device.type}"]
    r = subprocess.run([sys.executable, "-c", NANOGPT_WRAPPER, *args], cwd=root, capture_output=True, text=True)
    (out / "nanogpt-bench.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"nanoGPT's bench.py exited {r.returncode}: see nanogpt-bench.log")
    return nanogpt_numbers(r.stdout, tc.batch_size * m.block_size, args)


def nanogpt_numbers(output: str, tokens_per_iter: int, args: list[str]) -> dict:
    """tokens/s, MFU, compile time and peak memory from nanoGPT bench.py's output under the wrapper."""
    ms, mfu = re.search(r"time per iteration: ([\d.]+)ms, MFU: ([\d.]+)%", output).groups()
    hook = json.loads(output.split("MINITF_GPU ", 1)[1].splitlines()[0])
    t = hook["stamps"]  # before the burn-in, after it, after the timed steps
    step_s = (t[2] - t[1]) / 20
    return {
        "args": args,
        "tokens_per_s": round(tokens_per_iter / (float(ms) / 1000)),
        "ms_per_step": float(ms),
        "mfu": round(float(mfu) / 100, 4),
        "compile_s": round(t[1] - t[0] - 10 * step_s, 2),
        "peak_memory_mb": None if hook["peak_memory_mb"] is None else round(hook["peak_memory_mb"], 1),
    }


# ---- batch-1 decoding of the 124M model


def decode(out: Path, corpus: Path, device: torch.device, sizes: dict) -> dict:
    """Tokens/s of batch-1 decoding from a one-token prompt, the 124M shape with random weights in
    bfloat16: minitf eager, compiled without and with CUDA graphs (cudagraph_skips: the graphs
    torch.compile declined: 0 when they ran, more on a CPU, where they cannot), then Hugging Face
    generate on the exported directory."""
    from torch._dynamo.utils import counters

    from minitf.fast.decoding import compile_decode
    from minitf.run_dir import load_run

    run = write_decode_run(out / "runs" / "decode", corpus, sizes)
    model, tok, _ = load_run(run, device=device)
    model = model.to(torch.bfloat16)
    n, rounds = sizes["decode_tokens"], sizes["decode_rounds"]
    res = {"params": model.num_params(), "vocab": tok.vocab_size, "dtype": "bfloat16", "new_tokens": n}
    res["eager"] = _timed(lambda k: _minitf_tokens(model, k, False), n, rounds, device)
    for name, graphs in (("compiled", False), ("compiled_cuda_graphs", True)):
        compile_decode(model, cuda_graphs=graphs)  # the step generate's compile=True then takes
        skips = counters["inductor"]["cudagraph_skips"]
        res[name] = _timed(lambda k: _minitf_tokens(model, k, True), n, rounds, device)
        res[name]["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
    res["hf"] = hf_decode(run, out / "hf-decode", device, n, rounds)
    return res


def write_decode_run(run: Path, corpus: Path, sizes: dict) -> Path:
    """A run directory holding gpt2-small's model, random weights, and a tokenizer trained on the
    corpus (its vocabulary sets the model's: GPT-2's 50,257 when the corpus has the pairs)."""
    from minitf.config import load_config
    from minitf.model import Transformer
    from minitf.tokenizer import Tokenizer
    from minitf.training.checkpoint import save_weights, write_run_files

    tok = Tokenizer.train(corpus.read_text().splitlines(), vocab_size=sizes["decode_vocab"])
    cfg = load_config("gpt2-small", [o for o in sizes["gpt2"] if o.startswith("model.")])
    cfg.model.vocab_size = tok.vocab_size
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    run.mkdir(parents=True, exist_ok=True)
    write_run_files(run, cfg, tok)
    save_weights(model, run / "model.safetensors", step=0, tokenizer_hash=tok.hash)
    return run


def _minitf_tokens(model, n: int, compiled: bool) -> int:
    from minitf.config import SampleConfig
    from minitf.generate import generate_tokens

    settings = SampleConfig(max_new_tokens=n, temperature=1.0, top_k=50, seed=0)
    return sum(1 for _ in generate_tokens(model, [0], settings, compile=compiled))


def _timed(run, n: int, rounds: int, device: torch.device) -> dict:
    """The first call (for a compiled step, mostly compilation), then the median of `rounds` calls."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    run(n)
    _sync(device)
    first = time.perf_counter() - t0
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        made = run(n)
        _sync(device)
        rates.append(made / (time.perf_counter() - t0))
    from bench.core import peak_memory_mb

    return {
        "first_call_s": float(f"{first:.3g}"),  # 3 digits: an eager first call can take 2 ms
        "tokens_per_s": round(statistics.median(rates), 1),
        "rates": [round(x, 1) for x in rates],
        "peak_memory_mb": round(peak_memory_mb(device), 1),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_decode(run: Path, export_dir: Path, device: torch.device, n: int, rounds: int) -> dict:
    """`minitf export` of the run, then transformers' generate at the same length, top-k 50."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return {"skipped": "transformers is not installed (pip install -e '.[hf]')"}
    r = subprocess.run(
        [sys.executable, "-m", "minitf", "export", "--run", str(run), "--out", str(export_dir), "--force"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"minitf export exited {r.returncode}: {r.stderr.strip()[-300:]}")
    hf = AutoModelForCausalLM.from_pretrained(export_dir).to(device, torch.bfloat16).eval()
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)  # (1, 1): the same one-token prompt

    @torch.inference_mode()
    def run_hf(k: int) -> int:
        torch.manual_seed(0)
        kw = {"max_length": k + 1, "min_new_tokens": k, "do_sample": True, "top_k": 50, "pad_token_id": 0}
        return hf.generate(ids, **kw).shape[1] - 1

    return {"exported": r.stdout.strip(), **_timed(run_hf, n, rounds, device)}


if __name__ == "__main__":
    main()
