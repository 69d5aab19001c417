"""minitf.training.naming: the prompt a run suggests for sampling, fitted to its validation text."""

import types

import numpy as np

from minitf.training import naming

# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


class Chars:
    """TokenData's face for fitting_prompt: one token per character, id 0 the end of a document."""

    def __init__(self, val: str, one_document: bool):
        self.ids = np.array([ord(c) for c in val], dtype=np.int64)
        self.tokenizer = types.SimpleNamespace(eot_id=0, decode=lambda ids: "".join(map(chr, ids)))
        n = 1 if one_document else 5
        self.meta = {"splits": {"train": {"documents": n}, "val": {"documents": 1}}}

    def tokens(self, split):
        return self.ids


def test_a_fitting_prompt_is_a_line_or_the_first_words_of_the_validation_text():
    assert naming.fitting_prompt(Chars("CHAPTER ONE\nIt was a dark night.\x00next", False)) == "CHAPTER ONE\n"
    # one document cut mid-line: its first whole line
    assert naming.fitting_prompt(Chars("ter of it.\nMARY:\nNo.", True)) == "MARY:\n"
    long = "It was the best of times, it was the worst of times, it was the age of wisdom\n"
    assert naming.fitting_prompt(Chars(long, False)) == "It was the best of"
    assert (
        naming.fitting_prompt(Chars("ACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGTACGT", False))
        == "ACGTACGTACGTACGTACGT"
    )
    assert naming.fitting_prompt(Chars("\x00", False)) == ""
