"""The induction recipe's parts: the generated repeats corpus (data.source=repeats) and
configs/induction.yaml with its 1-layer control."""

import pytest

import minitf
from minitf.config import DataConfig
from minitf.corpus import repeats
from minitf.corpus.sources import Source
from minitf.errors import ConfigError


def test_repeats_lines_say_a_phrase_twice_and_never_change():
    docs = repeats.documents()
    assert len(docs) == repeats.DOCUMENTS and docs == repeats.documents()  # a fixed seed: the same text everywhere
    lines = docs[0].splitlines()
    assert len(lines) == repeats.LINES
    for line in lines:
        first, second = line.split(". ")
        assert second == first + "." and 6 <= len(first.split()) <= 20
    words = {w.strip(".") for doc in docs for w in doc.split()}
    assert len(words) == repeats.WORDS and all(len(w) == 4 for w in words)  # made-up words of two syllables
    assert docs[0].startswith("fova bele fisa gozi bedi seba. fova bele fisa gozi bedi seba.\n")


def test_repeats_source_is_written_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path))
    said = []
    source = Source(DataConfig(source="repeats"), said.append)
    assert len(source.files) == repeats.DOCUMENTS and source.files[0].parent == tmp_path / "repeats-1"
    assert source.files[0].read_text() == repeats.documents()[0] and len(said) == 1
    again = Source(DataConfig(source="repeats"), said.append)
    assert again.fingerprint == source.fingerprint and len(said) == 1  # found, not written again
    with pytest.raises(ConfigError, match=r"^data.source must be 'shakespeare', 'repeats', .*; got 'repeats:more'$"):
        Source(DataConfig(source="repeats:more"))


def test_the_induction_recipe_and_its_one_layer_control():
    cfg = minitf.load_config("induction")
    assert (cfg.data.source, cfg.model.n_layer, cfg.train.snapshot_every) == ("repeats", 2, 50)
    assert cfg.train.max_seconds is None and cfg.train.max_steps == 3000  # steps, not seconds: runs compare
    control = minitf.load_config("induction", ["model.n_layer=1", "run.name=induction-1layer"])
    assert control.model.n_layer == 1 and control.run.out_dir == "runs/induction-1layer"
