"""Measurements minitf holds itself to: `minitf bench` (scripts/bench.py) prints them; tests never time.

They measure the commands themselves (start-up of `minitf generate`) and the shipped recipes,
through minitf's public functions.

Each function returns plain numbers. Training throughput runs the trainer's own step
(trainer.train_step) on random tokens, after warm-up, median of repeats.
"""

from __future__ import annotations

import http.client
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from bench.data import data_prep_speed, tokenizer_speed
from minitf.config import Config, SampleConfig, TrainConfig
from minitf.generate import generate_tokens
from minitf.model import Transformer
from minitf.optim import make_optimizer
from minitf.system.machine import machine
from minitf.system.runtime import peak_flops
from minitf.trainer import train_step
from minitf.training.session import Session


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class OneBatch:
    """Stands in for the token data: the same random batch every step, so only the step is timed."""

    def __init__(self, xy: torch.Tensor):
        self.xy = xy  # (B, T + 1)

    def get_batch(self, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        return self.xy[:, :-1], self.xy[:, 1:]  # (B, T) each


def train_throughput(cfg: Config, device: torch.device, steps: int = 20, warmup: int = 5, repeats: int = 3) -> dict:
    """Tokens/s of the trainer's own step (trainer.train_step: forward, backward, clip, optimizer,
    the step's one host sync) on random tokens, in a Session built as training builds it."""
    torch.manual_seed(0)
    model = Transformer(cfg.model).to(device)
    tc: TrainConfig = cfg.train
    B, T, V = tc.batch_size, cfg.model.block_size, cfg.model.vocab_size
    batch = OneBatch(torch.randint(0, V, (B, T + 1), device=device))
    optimizer = make_optimizer(model, tc, device)
    session = Session.create(
        cfg, model, optimizer, batch, device, run_dir=Path(tempfile.gettempdir())
    )  # writes nothing
    dtype = session.dtype
    if tc.compile:
        model.compile_regions()

    def step():
        train_step(session, tc.lr, interrupted=False)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(device)
    warmup_s = time.perf_counter() - t0
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        rates.append(B * T * tc.grad_accum * steps / (time.perf_counter() - t0))
    tok_s = statistics.median(rates)
    out = {
        "params": model.num_params(),
        "batch": B,
        "block": T,
        "vocab": V,
        "dtype": str(dtype).split(".")[-1],
        "compile": tc.compile,
        "warmup_s": round(warmup_s, 2),
        "tokens_per_s": round(tok_s),
        "ms_per_step": round(1000 * B * T * tc.grad_accum / tok_s, 2),
    }
    peak = peak_flops(device)
    if peak:
        out["mfu"] = round(model.flops_per_token() * tok_s / peak, 4)
    elif device.type == "cpu":  # no datasheet peak: hold the step to this machine's own matmul rate
        rate = matmul_flops(device)
        out["matmul_gflops"] = round(rate / 1e9, 1)
        out["matmul_ceiling_tokens_per_s"] = round(rate / model.flops_per_token())
    return out


def matmul_flops(device: torch.device, n: int = 1024, seconds: float = 1.0) -> float:
    """FLOP/s of float32 (n x n) @ (n x n) matmuls on this machine: what a training step could reach
    if every one of its FLOPs ran as fast as one large, cache-friendly matmul."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b  # warm-up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


GENERATION_RUNS = [(1, True, False), (1, False, False), (1, True, True), (8, True, False), (8, False, False)]


@torch.no_grad()
def generation_speed(cfg: Config, device: torch.device, new_tokens: int = 500, rounds: int = 3) -> list[dict]:
    """New tokens per second (all rows counted) from one prompt token, sampled with top-k, for each
    (batch, KV cache, compiled) of GENERATION_RUNS.

    The runs take turns, `rounds` times, and each reports its median: a machine's speed
    drifts over minutes, and turns keep the cached and uncached runs side by side. Each run is
    warmed up first; for the compiled one that first call, mostly compilation, is reported too.
    """
    torch.manual_seed(0)
    model = Transformer(cfg.model).to(device).eval()

    def run(n, batch, use_cache, compile):
        t0 = time.perf_counter()
        settings = SampleConfig(max_new_tokens=n, temperature=1.0, top_k=50, seed=0)
        n = sum(
            1 for _ in generate_tokens(model, [0], settings, num_samples=batch, use_cache=use_cache, compile=compile)
        )
        _sync(device)
        return n, time.perf_counter() - t0

    out = []
    for batch, use_cache, compile in GENERATION_RUNS:
        _, warmup_s = run(5, batch, use_cache, compile)
        out.append(
            {
                "batch": batch,
                "cache": use_cache,
                "compile": compile,
                "new_tokens": new_tokens,
                "rates": [],
                **({"first_call_s": round(warmup_s, 1)} if compile else {}),
            }
        )
    for _ in range(rounds):
        for r in out:
            n, dt = run(new_tokens, r["batch"], r["cache"], r["compile"])
            r["rates"].append(round(n * r["batch"] / dt, 1))
    for r in out:
        r["tokens_per_s"] = statistics.median(r["rates"])
    return out


def startup_to_first_token(run_dir: str | Path) -> dict:
    """Seconds from launching `minitf generate` to its first generated character on stdout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "minitf", "generate", "--run", str(run_dir), "--prompt", ""]
        + ["--stream", "--max-new-tokens", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    first = p.stdout.read(1)
    t_first = time.perf_counter() - t0
    p.stdout.read()
    p.wait()
    return {"run": str(run_dir), "first_token_s": round(t_first, 2), "ok": bool(first) and p.returncode == 0}


def explore_first_token(run_dir: str | Path, rounds: int = 5, new_tokens: int = 20) -> dict:
    """Seconds from sending a generate request to the explorer's HTTP API to the arrival of its
    first sampled token (the prompt's tokens, sent before it, are not counted), with the run's own
    sampling settings: its prompt, and a prompt of block_size tokens (the longest the page takes).
    The server runs in a thread of this process, as `minitf explore` runs it; the first request
    warms up and is reported apart."""
    from minitf.web.explore import Explorer, ExploreServer

    server = ExploreServer(Explorer(run_dir), "127.0.0.1", 0, log=lambda msg: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tok, cfg = server.explorer.tok, server.explorer.cfg
    block = cfg.model.block_size
    text, lo, hi = (cfg.sample.prompt + " ") * block, 0, (len(cfg.sample.prompt) + 1) * block
    while lo < hi:  # the longest start of text that fits in block_size tokens
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(tok.encode(text[:mid])) <= block else (lo, mid - 1)
    long_prompt = text[:lo]

    def first_token(prompt: str, seed: int) -> float:
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
        body = json.dumps({"prompt": prompt, "max_new_tokens": new_tokens, "seed": seed})
        t0 = time.perf_counter()
        conn.request("POST", "/api/generate", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        while b'"token"' not in r.readline():
            pass
        dt = time.perf_counter() - t0
        r.read()
        conn.close()
        return dt

    try:
        out = {"run": str(run_dir), "warmup_s": round(first_token(cfg.sample.prompt, 0), 3)}
        for name, prompt in (("prompt", cfg.sample.prompt), ("long_prompt", long_prompt)):
            times = [first_token(prompt, seed) for seed in range(rounds)]
            out[name] = {
                "tokens": len(tok.encode(prompt)),
                "first_token_s": round(statistics.median(times), 3),
                "max_s": round(max(times), 3),
                "times": [round(t, 3) for t in times],
            }
    finally:
        server.close()
    return out


def run_bench(
    config_path,
    overrides,
    device_name: str,
    vocab: int | None,
    parts,
    run_dir,
    new_tokens: int,
    steps: int,
    rounds: int = 3,
    log=print,
) -> dict:
    """Run the chosen measurements, print each as it finishes, and return them all."""
    from minitf.cli.common import newest_run
    from minitf.config import load_config
    from minitf.system.runtime import resolve_device

    cfg = load_config(config_path, overrides)
    cfg.model.vocab_size = vocab or cfg.data.vocab_size
    device = resolve_device(device_name, what="--device")
    res = {"machine": machine(device), "config": str(config_path), "overrides": list(overrides)}
    log(" | ".join(f"{k} {v}" for k, v in res["machine"].items()))
    # each part is logged as soon as it is measured: a long bench shows its numbers as it goes
    if "train" in parts:
        res["train"] = train_throughput(cfg, device, steps=steps)
        _log_train(res["train"], log)
    if "generate" in parts:
        res["generate"] = generation_speed(cfg, device, new_tokens, rounds)
        _log_generate(res["generate"], log)
        from bench.llamacpp import llamacpp_decode  # logs why when it cannot run

        res["generate_llamacpp"] = llamacpp_decode(cfg, device, new_tokens, rounds, log)
    if "tokenizer" in parts:
        r = res["tokenizer"] = tokenizer_speed(cfg.data.vocab_size, log=log)
        log(
            f"tokenizer BPE {r['vocab']} trained on {r['corpus_mb']} MB in {r['train_s']} s; encode "
            f"{r['encode_mb_per_s']} MB/s ({r['encode_s']} s); on 1 MB of letters without whitespace in "
            f"{r['no_whitespace_1mb_train_s']} s"
        )
    if "data" in parts:
        r = res["data"] = data_prep_speed(cfg)
        log(f"data      prepare {r['source']}: cold {r['cold_s']} s, cached {r['cached_s']} s")
    if "startup" in parts:
        r = res["startup"] = startup_to_first_token(run_dir or newest_run())
        log(f"startup   first generated character {r['first_token_s']} s after launch ({r['run']})")
    if "explore" in parts:
        res["explore"] = explore_first_token(run_dir or newest_run())
        _log_explore(res["explore"], log)
    if not parts:  # only the separate parts were asked for: they report their own
        return res
    res["peak_memory_mb"] = round(peak_memory_mb(device), 1)
    log(f"memory    peak {'RSS' if device.type == 'cpu' else 'CUDA allocated'} {res['peak_memory_mb']} MB")
    return res


def _log_train(r: dict, log) -> None:
    """Tokens/s with the model and step it measured; on a CPU, also how close that is to the
    machine's own matmul rate (there is no datasheet peak to give an MFU against)."""
    log(
        f"train     {r['tokens_per_s']:>10,} tokens/s  {r['ms_per_step']} ms/step  ({r['params']:,} params, "
        f"batch {r['batch']} x {r['block']}, vocab {r['vocab']}, {r['dtype']}, compile {r['compile']}"
        + (f", MFU {100 * r['mfu']:.1f}%" if "mfu" in r else "")
        + ")"
    )
    if "matmul_ceiling_tokens_per_s" in r:
        log(
            f"train     this machine's float32 matmuls run at {r['matmul_gflops']} GFLOP/s: a step with "
            f"no other cost would give {r['matmul_ceiling_tokens_per_s']:,} tokens/s; measured "
            f"{100 * r['tokens_per_s'] / r['matmul_ceiling_tokens_per_s']:.0f}% of that"
        )


def _log_generate(rows: list[dict], log) -> None:
    """Each generation run's tokens/s, then the KV cache's speed-up as the median of per-round
    ratios: a ratio of medians would pair rounds taken minutes apart on a drifting machine."""
    for r in rows:
        log(
            f"generate  {r['tokens_per_s']:>10,.1f} tokens/s  batch {r['batch']}, "
            f"{'KV cache' if r['cache'] else 'no cache'}{', compiled' if r['compile'] else ''}, "
            f"{r['new_tokens']} new tokens, median of {r['rates']}"
            + (f" (first call, compiling: {r['first_call_s']} s)" if r["compile"] else "")
        )
    rate = {(r["batch"], r["cache"], r["compile"]): r for r in rows}
    for batch, compile in [(1, False), (8, False), (1, True)]:
        on, off = rate[batch, True, compile]["rates"], rate[batch, False, False]["rates"]
        ratios = sorted(a / b for a, b in zip(on, off))  # per round: the two ran minutes apart at most
        log(
            f"generate  KV cache speed-up at batch {batch}{' (compiled)' if compile else ''}: "
            f"{statistics.median(ratios):.1f}x (rounds: {', '.join(f'{x:.1f}' for x in ratios)})"
        )


def _log_explore(r: dict, log) -> None:
    """The explorer's first token for the run's own prompt and for the longest prompt it takes."""
    for name in ("prompt", "long_prompt"):
        log(
            f"explore   first token {r[name]['first_token_s']} s after the request (median of "
            f"{len(r[name]['times'])}, max {r[name]['max_s']}), {r[name]['tokens']}-token prompt ({r['run']})"
        )
