"""data.source=chat: a generated corpus of short conversations whose answers can be checked exactly.

It is the chat recipe's default (configs/chat.yaml) and the tests' data: a small model pretrained
on Shakespeare learns to answer these in minutes on a laptop CPU, and the share of held-out
questions it answers exactly (`exact_match`) says how far it got. Four tasks, from easy to hard
for a small transformer:

    repeat   Repeat after me: crown of the night  ->  crown of the night     (copying)
    last     What is the last word of: sweet rose night?  ->  night          (finding)
    bigger   Which is bigger, 17 or 42?  ->  42                              (comparing)
    add      What is 17 plus 25?  ->  42                                     (arithmetic)

Some conversations open with a system message, some hold two exchanges. The text is drawn from a
fixed seed and written once into the cache (MINITF_CACHE) as JSONL files of OpenAI-style
messages, then read as data.source=file: would read them.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from pathlib import Path

from .generated import generated_files

VERSION = 1  # the generator's version: its folder, and so its token cache, changes with it
FILES, PER_FILE = 10, 2_000  # 20,000 conversations, about 2 MB
SEED = 0
WORDS = (
    "king queen love night day sword crown rose heart blood fair sweet death life lord lady gold "
    "moon sun star sea land war peace fool wise old young honour grace storm fire"
).split()
SYSTEM = "You answer in as few words as you can."


def chat_files(cache: Path, log: Callable[[str], None]) -> list[Path]:
    """The corpus's files in cache/chat-<VERSION>/, written on first use and checked on every use."""
    names = [f"part_{i:02d}.jsonl" for i in range(FILES)]

    def texts() -> dict[str, str]:
        log(f"data: writing the generated chat corpus ({FILES * PER_FILE:,} conversations) to {cache}/chat-{VERSION}")
        every = conversations()
        parts = [every[i * PER_FILE : (i + 1) * PER_FILE] for i in range(FILES)]
        return {name: "".join(json.dumps({"messages": c}) + "\n" for c in part) for name, part in zip(names, parts)}

    return generated_files(Path(cache) / f"chat-{VERSION}", names, texts, log)


@functools.lru_cache(maxsize=1)
def conversations() -> list[list[dict]]:
    """Every conversation of the corpus, in file order."""
    rng = random.Random(SEED)
    out = []
    for _ in range(FILES * PER_FILE):
        messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.3 else []
        for _ in range(2 if rng.random() < 0.3 else 1):
            question, answer = exchange(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        out.append(messages)
    return out


def exchange(rng: random.Random) -> tuple[str, str]:
    """One question of a random task, and its one right answer."""
    task = rng.choice(TASKS)
    a, b = rng.randrange(50), rng.randrange(50)
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
    if task == "repeat":
        return f"Repeat after me: {words}", words
    if task == "last":
        return f"What is the last word of: {words}?", words.split()[-1]
    if task == "bigger":
        b = b if b != a else (a + 1) % 50
        return f"Which is bigger, {a} or {b}?", str(max(a, b))
    return f"What is {a} plus {b}?", str(a + b)


TASKS = ("repeat", "last", "bigger", "add")


def task_of(question: str) -> str:
    """The task a generated question belongs to."""
    if question.startswith("Repeat"):
        return "repeat"
    if question.startswith("What is the last"):
        return "last"
    return "bigger" if question.startswith("Which") else "add"
