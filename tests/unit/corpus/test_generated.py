"""minitf.corpus.generated: a generated corpus is written once, checked against its manifest on every
use, and drawn again (one line saying why) when a file was emptied, cut short, edited or removed,
or when its folder is not a folder."""

import hashlib
import os
import shutil

import pytest

from minitf.config import DataConfig
from minitf.corpus import repeats
from minitf.corpus.generated import MANIFEST, generated_files
from minitf.corpus.sources import Source
from minitf.errors import MinitfError


def test_written_once_with_a_manifest_and_not_drawn_again(tmp_path):
    drawn, said = [], []

    def texts():
        drawn.append(1)
        return {"b.jsonl": '{"x": 1}\n', "a.txt": "naïve\n"}

    paths = generated_files(tmp_path / "toy-1", ["a.txt", "b.jsonl"], texts, said.append)
    assert paths == [tmp_path / "toy-1" / "a.txt", tmp_path / "toy-1" / "b.jsonl"]
    assert paths[0].read_text(encoding="utf-8") == "naïve\n" and paths[1].read_text() == '{"x": 1}\n'
    sha = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts().items()}
    drawn.pop()
    assert (tmp_path / "toy-1" / MANIFEST).read_text() == f"{sha['a.txt']}  a.txt\n{sha['b.jsonl']}  b.jsonl\n"
    assert generated_files(tmp_path / "toy-1", ["a.txt", "b.jsonl"], texts, said.append) == paths
    assert drawn == [1] and said == []  # checked, found whole, not drawn again
    with pytest.raises(MinitfError, match="file names must be plain names"):
        generated_files(tmp_path / "toy-2", ["../escape.txt"], texts, said.append)
    with pytest.raises(MinitfError, match=r"its texts are named \['a.txt', 'b.jsonl'\]"):
        generated_files(tmp_path / "toy-3", ["c.txt"], texts, said.append)
    assert not (tmp_path / "toy-3").exists()


def _empty(folder):
    (folder / "doc_003.txt").write_text("")


def _truncate(folder):
    with open(folder / "doc_003.txt", "r+b") as f:
        f.truncate(100)


def _edit(folder):
    text = (folder / "doc_003.txt").read_text()
    (folder / "doc_003.txt").write_text(text.replace("a", "o", 1))


def _remove(folder):
    (folder / "doc_003.txt").unlink()


def _no_manifest(folder):
    (folder / MANIFEST).unlink()  # e.g. a folder written by an older minitf


def _a_file(folder):
    shutil.rmtree(folder)
    folder.write_text("not a folder")


def _a_link(folder):
    os.rename(folder, folder.with_name("elsewhere"))
    folder.symlink_to(folder.with_name("elsewhere"))


@pytest.mark.parametrize(
    "breaking, why",
    [
        (_empty, "doc_003.txt is not the text that was generated (emptied, cut short or edited)"),
        (_truncate, "doc_003.txt is not the text that was generated (emptied, cut short or edited)"),
        (_edit, "doc_003.txt is not the text that was generated (emptied, cut short or edited)"),
        (_remove, "doc_003.txt is missing"),
        (_no_manifest, f"{MANIFEST} is missing or unreadable"),
        (_a_file, "repeats-1 is a file, not the generated corpus's folder"),
        (_a_link, "repeats-1 is a link, not the generated corpus's folder"),
    ],
)
def test_a_broken_repeats_corpus_is_drawn_again_not_trained_on(tmp_path, monkeypatch, breaking, why):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path))
    first = Source(DataConfig(source="repeats"))
    folder = tmp_path / "repeats-1"
    breaking(folder)
    said = []
    source = Source(DataConfig(source="repeats"), said.append)
    named = folder.parent if why.startswith("repeats-1") else folder
    assert said[0] == f"data: {named}/{why}; drawing the generated corpus again"
    assert said[1].startswith("data: writing the repeats corpus") and len(said) == 2
    assert folder.is_dir() and not folder.is_symlink()
    assert [p.read_text() for p in source.files] == repeats.documents()
    assert source.fingerprint == first.fingerprint  # the same text: the token cache stays valid
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing left aside
