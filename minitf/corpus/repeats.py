"""data.source=repeats: a generated corpus where every line is a random phrase said twice.

It is the corpus on which induction heads (Olsson et al. 2022) pay off at once and form within
minutes on a CPU (configs/induction.yaml): the first half of a line is random words, which no
model can predict beyond their frequencies, and the second half repeats it, which a model predicts
only by looking back for the earlier copy of the current word and reading the word after it.
Natural text rewards the same mechanism less often, and forms it only after far more tokens.

The words are made-up two-syllable words ("fova bele fisa"), so the tokenizer learns each as one
or two tokens and no English bigram gives the next word away. The text is drawn from a fixed seed
and written once into the cache (MINITF_CACHE) as DOCUMENTS files, then read as a file: source is;
the same files on every machine, under a version in the folder's name that a change of the
generator moves on, checked against their sha256 manifest on every use (generated.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from .generated import generated_files

VERSION = 1  # the generator's version: its folder, and so its token cache, changes with it
DOCUMENTS, LINES = 100, 60  # 100 files of 60 lines: about 0.9 MB of text
WORDS, PHRASE = 300, (6, 20)  # a vocabulary of 300 made-up words; a phrase of 6 to 20 of them
SEED = 0


def repeats_files(cache: Path, log: Callable[[str], None]) -> list[Path]:
    """The corpus's files in cache/repeats-<VERSION>/, written on first use and checked against
    their manifest on every use (generated.py: a broken one is written again)."""
    folder = Path(cache) / f"repeats-{VERSION}"
    names = [f"doc_{i:03d}.txt" for i in range(DOCUMENTS)]

    def texts() -> dict[str, str]:
        log(f"data: writing the repeats corpus ({DOCUMENTS} files of {LINES} phrases said twice) to {folder}")
        return dict(zip(names, documents()))

    return generated_files(folder, names, texts, log)


def documents() -> list[str]:
    """DOCUMENTS texts, each LINES lines of a random phrase, a full stop, the phrase again."""
    rng = random.Random(SEED)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70: "ba", "be", ... "zu"
    words = rng.sample(sorted({rng.choice(syllables) + rng.choice(syllables) for _ in range(2000)}), WORDS)
    texts = []
    for _ in range(DOCUMENTS):
        lines = []
        for _ in range(LINES):
            phrase = " ".join(rng.choice(words) for _ in range(rng.randint(*PHRASE)))
            lines.append(f"{phrase}. {phrase}.")
        texts.append("\n".join(lines) + "\n")
    return texts
