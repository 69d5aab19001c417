"""LoRA against full fine-tuning: peak memory and tokens/s of one training step, side by side.

    python -m bench.lora                # the ~0.5B Qwen3-shaped model, 3 rounds of A (full) then B (LoRA)
    python -m bench.lora --tiny --rounds 1 --out lora.json   # a seconds-long smoke run

Each measurement is a fresh process, so its peak is its own: it builds the model as train() does
(seeded random weights; LoRA: training/lora.adapt, rank 16 on every linear layer of the blocks),
the optimizer (minitf's AdamW over the parameters that train), and runs minitf's own training step
(trainer.forward_backward, then AdamW) on random tokens: one step untimed (AdamW makes its state
there), then `steps` timed. The full and the LoRA process alternate, so load from other work on
the machine falls on both alike.

Memory is the process's peak resident set (VmHWM, the OS's figure) with glibc's mmap threshold
fixed at 64 KB, so freed blocks go back to the OS and the peak is of memory in use (bench/memory.py
says why); the resident memory before the model was built (torch, the interpreter) is reported too.

The model: Qwen3's architecture (rope with base 1e6, RMSNorm, SwiGLU, q/k-norm, grouped-query
attention, tied embeddings, no biases, its 151,936-token vocabulary) at Qwen2.5-0.5B's sizes
(24 layers, 896 wide, 14 query heads over 2 key/value heads, 4,864 hidden): 494M parameters.
Qwen3-0.6B itself has 128-dimensional heads at width 1024, which minitf does not build (its
head_dim is n_embd / n_head).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.memory import RandomTokens, _held_bytes, _set_allocator, _vm

QWEN3_05B = dict(
    vocab_size=151936,
    block_size=256,
    n_layer=24,
    n_embd=896,
    n_head=14,
    n_kv_head=2,
    ffn_hidden=4864,
    positions="rope",
    rope_base=1e6,
    norm="rmsnorm",
    ffn="swiglu",
    qk_norm=True,
    bias=False,
    tie_embeddings=True,
    dropout=0.0,
)
TINY = dict(QWEN3_05B, vocab_size=512, block_size=64, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, ffn_hidden=128)
LORA = dict(lora_rank=16, lora_alpha=32.0)  # a common choice; the adapters are a small share at any rank


def _worker(method: str, shape: dict, batch: int, steps: int, checkpoint: bool = False, dtype: str = "float32") -> dict:
    """One method's step in this process: its peak memory and tokens/s."""
    from minitf.config import Config, ModelConfig, TrainConfig
    from minitf.model import Transformer
    from minitf.optim import make_optimizer
    from minitf.trainer import forward_backward
    from minitf.training import lora
    from minitf.training.session import Session

    _set_allocator("mmap")
    import peft  # noqa: F401  both methods' processes hold the same libraries before the baseline

    before = _vm("VmRSS")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**shape))
    tc = TrainConfig(optimizer="adamw", batch_size=batch, **(LORA if method == "lora" else {}))
    model = lora.adapt(model, tc, log=lambda *a: None, dtype=getattr(torch, dtype))
    model.checkpoint_blocks = checkpoint  # train.activation_checkpointing: each block recomputed in backward
    cpu = torch.device("cpu")
    optimizer = make_optimizer(model, tc, cpu)
    cfg = Config(model=model.config, train=tc)
    data = RandomTokens({"batch": batch, "model": shape})
    session = Session.create(cfg, model, optimizer, data, cpu, run_dir=Path("."), dtype=getattr(torch, dtype))
    times = []
    for i in range(steps + 1):  # the first builds AdamW's state, untimed
        t = time.perf_counter()
        forward_backward(session)
        optimizer.step()
        held = _held_bytes(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "method": method,
        "checkpoint": checkpoint,
        "dtype": dtype,
        "peak_rss": _vm("VmHWM"),
        "rss_before_model": before,
        "held_bytes": held,
        "trainable": trainable,
        "tokens_per_s": batch * shape["block_size"] / statistics.median(times),
    }


def run(shape: dict, batch: int, steps: int, rounds: int, checkpoint: bool = False, dtype: str = "float32") -> dict:
    """`rounds` of full then LoRA, each in its own process; every measurement and the medians."""
    results = []
    for r in range(rounds):
        for method in ("full", "lora"):
            args = json.dumps(
                dict(method=method, shape=shape, batch=batch, steps=steps, checkpoint=checkpoint, dtype=dtype)
            )
            out = subprocess.run(
                [sys.executable, "-m", "bench.lora", "--worker", args],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            if out.returncode:
                raise SystemExit(f"bench.lora: the {method} process failed:\n{out.stderr[-2000:]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(describe(results[-1], r), flush=True)
    med = {
        m: {k: statistics.median(x[k] for x in results if x["method"] == m) for k in ("peak_rss", "tokens_per_s")}
        for m in ("full", "lora")
    }
    ratio = med["lora"]["peak_rss"] / med["full"]["peak_rss"]
    return {
        "shape": shape,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "runs": results,
        "median": med,
        "lora_peak_share": ratio,
    }


def describe(r: dict, round_: int) -> str:
    gib = 2**30
    held = ", ".join(f"{k} {v / gib:.2f}" for k, v in r["held_bytes"].items())
    return (
        f"round {round_ + 1} {r['method']:>4}: peak RSS {r['peak_rss'] / gib:.2f} GiB "
        f"(before the model {r['rss_before_model'] / gib:.2f}; held GiB: {held}), "
        f"{r['tokens_per_s']:.0f} tokens/s, {r['trainable']:,} trainable"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (a smoke run)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step (each block_size tokens)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per process, after one untimed")
    p.add_argument("--rounds", type=int, default=3, help="full-then-LoRA rounds, each process fresh")
    p.add_argument("--checkpoint", action="store_true", help="both with activation checkpointing")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="train.dtype of both")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(**json.loads(a.worker))))
        return
    result = run(TINY if a.tiny else QWEN3_05B, a.batch, a.steps, a.rounds, a.checkpoint, a.dtype)
    m = result["median"]
    print(
        f"median: full {m['full']['peak_rss'] / 2**30:.2f} GiB, {m['full']['tokens_per_s']:.0f} tokens/s; "
        f"LoRA {m['lora']['peak_rss'] / 2**30:.2f} GiB, {m['lora']['tokens_per_s']:.0f} tokens/s; "
        f"LoRA's peak is {result['lora_peak_share']:.0%} of full's"
    )
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
