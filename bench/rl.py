"""Reinforcement learning against more fine-tuning, at equal wall time, from one starting chat run.

    python -m bench.rl --base runs/shakespeare              # 60 s of SFT, then 120 s of each run
    python -m bench.rl --base runs/shakespeare --start-seconds 60 --seconds 120 --out rl.json

A short SFT run on the generated chat corpus (configs/chat.yaml for --start-seconds) is the start:
weak at addition, the hardest of its tasks. From it, runs of --seconds each, one after the other:

    more SFT      configs/chat.yaml again: imitating the corpus's answers
    RL            configs/rl.yaml: GRPO on the corpus's questions, the exact reward
    RL, checker   configs/rl.yaml on the corpus's training questions and, beside them, questions
                  with no answer to imitate ("Name a number bigger than 37."), rewarded by a
                  checker (`bigger_or_exact`: any number above the one named)

Every run is then asked the same held-out questions of the corpus greedily (exact_match, per
task), and the checker's questions, in the phrasing it trained on and in one it never saw ("Say a
number bigger than 37."): the share of answers the checker accepts. Prints the table and writes
the numbers, with the steps each run took, to --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import time
from pathlib import Path

QUIET = {"log": lambda *a: None}
TRAINED, UNSEEN = "Name a number bigger than {n}.", "Say a number bigger than {n}."
BOUNDS = range(10, 90)


def bigger_or_exact(messages: list[dict], answer: str, expected: str | None) -> float:
    """exact where the prompt has an expected answer; else 1.0 for a number above the question's own."""
    if expected is not None:
        return float(answer.strip() == expected.strip())
    bound = int(re.findall(r"\d+", messages[-1]["content"])[-1])
    return float(answer.strip().isdigit() and int(answer.strip()) > bound)


def train(recipe: str, out: Path, init_from: Path, seconds: float, *more: str) -> tuple[Path, int, float]:
    import minitf
    from minitf.run_dir import METRICS, read_rows

    overrides = [
        f"run.out_dir={out}",
        f"run.init_from={init_from}",
        f"train.max_seconds={seconds}",
        "train.eval_every=100000",  # one evaluation, at the end: the minutes go to training
        "train.ckpt_every=100000",
        *more,
    ]
    started = time.perf_counter()
    run = minitf.train(minitf.load_config(recipe, overrides), **QUIET)
    last = [r for r in read_rows(run / METRICS) if "val_loss" in r][-1]
    return run, int(last["step"]), time.perf_counter() - started


def checker_data(folder: Path, start: Path) -> Path:
    """A folder of JSONL for the checker run: the corpus's training conversations (those the start
    run did not hold out) and the checker's questions in the trained phrasing, each bound 8 times."""
    from minitf.corpus import chat_corpus
    from minitf.corpus.split import val_rule

    folder.mkdir(parents=True, exist_ok=True)
    is_val = val_rule(None, 0.1)
    every = chat_corpus.conversations()
    lines = [json.dumps({"messages": c, "answer": c[-1]["content"]}) for i, c in enumerate(every) if not is_val(i)]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    asks = [json.dumps({"messages": [{"role": "user", "content": TRAINED.format(n=n)}]}) for n in BOUNDS] * 8
    random.Random(0).shuffle(asks)
    (folder / "asks.jsonl").write_text("\n".join(asks) + "\n")
    return folder


def accepted(run: Path, phrasing: str) -> float:
    """The share of the checker's questions (every bound) whose greedy answer it accepts."""
    import minitf

    model, tok, _ = minitf.load_run(run)
    right = 0
    for n in BOUNDS:
        messages = [{"role": "user", "content": phrasing.format(n=n)}]
        answer = minitf.chat(model, tok, messages, temperature=0.0, max_new_tokens=8)
        right += bigger_or_exact(messages, answer, None)
    return round(right / len(BOUNDS), 3)


def exact(run: Path, questions: list[dict]) -> dict[str, float]:
    import minitf
    from minitf.conversations.answer import exact_match
    from minitf.corpus import chat_corpus

    model, tok, _ = minitf.load_run(run)
    asked = [[*q["messages"], {"role": "assistant", "content": q["answer"]}] for q in questions]
    return {k: round(v, 3) for k, v in exact_match(model, tok, asked, chat_corpus.task_of).items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="a pretrained run (the quick start's runs/shakespeare)")
    p.add_argument("--start-seconds", type=float, default=60.0)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--questions", type=int, default=400, help="held-out questions asked of each run")
    p.add_argument("--work", default="runs/bench-rl")
    p.add_argument("--out", help="write the numbers here (JSON)")
    args = p.parse_args(argv)

    import torch

    from minitf.conversations.cache import prepare_chat_data
    from minitf.run_dir import load_run

    work = Path(args.work)
    start, start_steps, _ = train("chat", work / "start", Path(args.base), args.start_seconds)
    runs = {"start": (start, start_steps, 0.0)}
    runs["more SFT"] = train("chat", work / "sft", start, args.seconds)
    runs["RL"] = train("rl", work / "rl", start, args.seconds)
    checker = checker_data(work / "checker-data", start)
    runs["RL, checker"] = train(
        "rl",
        work / "rl-checker",
        start,
        args.seconds,
        f"data.source=file:{checker}",
        "rl.reward=bench.rl:bigger_or_exact",
    )
    _, tok, cfg = load_run(start)  # the held-out questions its chat cache kept (built by its training)
    questions = prepare_chat_data(cfg.data, tok, tok.chat_template, log=lambda *a: None).questions[: args.questions]
    rows = {
        name: {
            "steps": steps,
            "seconds": round(seconds, 1),
            **exact(run, questions),
            "checker_trained": accepted(run, TRAINED),
            "checker_unseen": accepted(run, UNSEEN),
        }
        for name, (run, steps, seconds) in runs.items()
    }
    columns = ["all", "add", "bigger", "last", "repeat", "checker_trained", "checker_unseen"]
    print(f"{'':13}{'steps':>7}" + "".join(f"{c[:16]:>17}" for c in columns))
    for name, r in rows.items():
        print(f"{name:13}{r['steps']:>7}" + "".join(f"{r.get(c, 0):>17.1%}" for c in columns))
    if args.out:
        machine = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__}
        Path(args.out).write_text(json.dumps({"machine": machine, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
