"""Is the loss mask free? A supervised fine-tuning step against a pretraining step on the same model
and batch shape, timed in turns.

    python -m bench.sft                  # the default recipe's model, 7 rounds
    python -m bench.sft --tiny --rounds 2

Both run the trainer's own step (trainer.forward_backward, then the optimizer) on the same random
tokens, in one process, alternating A (pretraining: every target learned) and B (SFT: the targets
of the prompt part of each row are -100, as chat_data.py makes them, about 85% of them as in the
generated chat corpus): the only difference is the mask and the token-weighted micro-batches.
Prints the tokens/s of each round and the median ratio B / A.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

MASKED = 0.85  # the share of a generated chat conversation's tokens that are context, not answer


def step_seconds(session, steps: int) -> float:
    from minitf.trainer import forward_backward

    t = time.perf_counter()
    for _ in range(steps):
        forward_backward(session)
        session.optimizer.step()
        session.optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - t) / steps


class Batches:
    """The same random rows every step; with `mask`, the first MASKED of each row's targets ignored."""

    def __init__(self, vocab: int, batch: int, block: int, mask: bool):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(vocab, (batch, block), generator=g)
        self.y = torch.randint(vocab, (batch, block), generator=g)
        if mask:
            self.y[:, : int(MASKED * block)] = -100

    def get_batch(self, *args, **kwargs):
        return self.x, self.y


def main(argv=None) -> None:
    from minitf.config import Config, DataConfig, ModelConfig, TrainConfig
    from minitf.model import Transformer
    from minitf.optim import make_optimizer
    from minitf.system.runtime import resolve_dtype
    from minitf.training.session import Session

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="steps per round and method")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    shape = dict(n_layer=1, n_embd=32, n_head=2, block_size=64) if a.tiny else {}
    model_cfg = ModelConfig(vocab_size=4096, positions="rope", **shape)  # the default recipe's model
    cpu = torch.device("cpu")
    sessions = {}
    for name, fmt in (("pretrain", "text"), ("sft", "chat")):
        torch.manual_seed(0)
        cfg = Config(
            model=model_cfg,
            train=TrainConfig(),
            data=DataConfig(format=fmt, source="chat" if fmt == "chat" else "shakespeare"),
        )
        model = Transformer(model_cfg)
        dtype = resolve_dtype(cfg.train.dtype, cpu)
        batches = Batches(model_cfg.vocab_size, cfg.train.batch_size, model_cfg.block_size, mask=fmt == "chat")
        optimizer = make_optimizer(model, cfg.train, cpu)
        sessions[name] = Session.create(cfg, model, optimizer, batches, cpu, run_dir=Path("."), dtype=dtype)
        step_seconds(sessions[name], 2)  # warm-up: the optimizer's state, the allocator
    tokens = TrainConfig().batch_size * model_cfg.block_size
    rows = []
    for r in range(a.rounds):
        row = {name: tokens / step_seconds(s, a.steps) for name, s in sessions.items()}
        rows.append(row)
        print(f"round {r + 1}: pretraining {row['pretrain']:,.0f} tokens/s, SFT {row['sft']:,.0f} tokens/s", flush=True)
    ratio = statistics.median(row["sft"] / row["pretrain"] for row in rows)
    print(f"median SFT / pretraining: {ratio:.3f} (tokens/s, same model and batch shape, in turns)")
    if a.out:
        a.out.write_text(json.dumps({"rounds": rows, "median_ratio": ratio, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
