"""A corpus that is not what it seems or does not hold still: symlinks in a data directory, a file
edited in place (same size, mtime put back), a file changed while it is tokenized, and --resume
after the corpus changed. Each reads every real file once, or makes a new cache, or is refused in
one line naming the file or the source."""

import errno
import hashlib
import math
import os
from pathlib import Path

import pytest

import minitf
import minitf.corpus.prepare
import minitf.corpus.sources
import minitf.corpus.token_cache
import minitf.data
from minitf.config import DataConfig
from minitf.corpus.prepare import prepare_data
from minitf.corpus.sources import Source, _text_files, cache_dir
from minitf.corpus.split import val_rule
from minitf.errors import MinitfError
from tests.support.corpus import Log, make_play, same_size_edit, write_docs


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def linked_corpus(root):
    """Two documents, then a link loop, a second link to a directory, and a link to a file."""
    write_docs(root / "sub", 2)
    (root / "sub" / "loop").symlink_to("..")  # sub/loop/sub/loop/... without end
    (root / "again").symlink_to("sub")  # the same directory by another name
    (root / "sub" / "copy.txt").symlink_to("doc00.txt")  # a file already in the tree
    return root


@pytest.mark.parametrize("pattern", ["{d}", "{d}/**/*.txt"])
def test_a_symlink_loop_and_links_read_each_file_once(tmp_path, pattern):
    d = linked_corpus(tmp_path / "linked")
    plain = tmp_path / "plain"
    write_docs(plain / "sub", 2)
    source = Source(DataConfig(source=f"file:{pattern.format(d=d)}"))
    assert source.files == [d / "sub" / "doc00.txt", d / "sub" / "doc01.txt"]  # their link-free names
    assert (d / "sub" / "copy.txt", d / "sub" / "doc00.txt") in source.aliases

    log = Log()
    data = prepare_data(DataConfig(source=f"file:{pattern.format(d=d)}", vocab_size=300), log=log)
    assert log.has("data: ") and log.has("2 documents") and log.has("read once (e.g.")
    ref = prepare_data(DataConfig(source=f"file:{plain}", vocab_size=300), log=Log())
    # the same two documents as the tree without links: one in train, one (the last) in val
    assert data.meta["splits"] == ref.meta["splits"]
    assert data.meta["splits"]["train"]["documents"] == data.meta["splits"]["val"]["documents"] == 1
    assert (data.tokens("train") == ref.tokens("train")).all() and (data.tokens("val") == ref.tokens("val")).all()


def test_a_hard_link_and_a_glob_of_links_count_once(tmp_path):
    d = tmp_path / "c"
    write_docs(d, 3)
    os.link(d / "doc01.txt", d / "hard.txt")
    (d / "soft.txt").symlink_to(d / "doc02.txt")
    source = Source(DataConfig(source=f"file:{d}/*.txt"))
    assert source.files == [d / "doc00.txt", d / "doc01.txt", d / "doc02.txt"]
    assert source.aliases == [(d / "hard.txt", d / "doc01.txt"), (d / "soft.txt", d / "doc02.txt")]


def test_a_directory_reached_only_through_a_link_is_read(tmp_path):
    outside = tmp_path / "elsewhere"
    write_docs(outside, 2)
    d = tmp_path / "c"
    write_docs(d, 1)
    (d / "more").symlink_to(outside)
    (d / "more2").symlink_to(outside)  # a second link to it is not read again
    assert Source(DataConfig(source=f"file:{d}")).files == [
        d / "doc00.txt",
        d / "more" / "doc00.txt",
        d / "more" / "doc01.txt",
    ]


def test_a_same_size_edit_with_the_mtime_put_back_makes_a_new_cache(tmp_path):
    write_docs(tmp_path / "c", 4)
    cfg = DataConfig(source=f"file:{tmp_path / 'c'}", vocab_size=300)
    first = prepare_data(cfg, log=Log())
    same_size_edit(tmp_path / "c" / "doc01.txt")
    log = Log()
    edited = prepare_data(cfg, log=log)
    assert log.has("tokenized") and not log.has("reusing")
    assert edited.path != first.path and edited.meta["fingerprint"] != first.meta["fingerprint"]
    assert not (edited.tokens("train") == first.tokens("train")[: len(edited.tokens("train"))]).all()


def test_remembered_hashes_read_only_new_or_changed_files(tmp_path, monkeypatch):
    """Remembered hashes (here trusted at once: RACY_NS=0) are used while a file's stat fields hold;
    a same-size edit with the mtime put back moves the ctime, so that file alone is read again, and
    a touch that changes nothing but the mtime reads it again and keeps the cache."""
    monkeypatch.setattr(minitf.corpus.sources, "RACY_NS", 0)
    hashed = []
    real_digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, alg: hashed.append(f.name) or real_digest(f, alg))
    c = tmp_path / "c"
    write_docs(c, 4)
    cfg = DataConfig(source=f"file:{c}", vocab_size=300)
    first = prepare_data(cfg, log=Log())
    assert sorted(hashed) == [str(c / f"doc0{i}.txt") for i in range(4)]

    hashed.clear()
    log = Log()
    assert prepare_data(cfg, log=log).path == first.path and log.has("reusing") and hashed == []

    same_size_edit(c / "doc02.txt")
    hashed.clear()
    edited = prepare_data(cfg, log=Log())
    assert hashed == [str(c / "doc02.txt")] and edited.path != first.path

    os.utime(c / "doc03.txt")  # touch: new mtime, same content
    hashed.clear()
    log = Log()
    assert prepare_data(cfg, log=log).path == edited.path and log.has("reusing")
    assert hashed == [str(c / "doc03.txt")]


def test_a_copied_corpus_keeps_its_cache_and_an_unwritable_memo_only_costs_a_read(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(minitf.corpus.sources, "RACY_NS", 0)  # remember hashes at once
    write_docs(tmp_path / "c", 3)
    cfg = DataConfig(source="file:c", vocab_size=300)
    monkeypatch.chdir(tmp_path)
    first = prepare_data(cfg, log=Log())
    (tmp_path / "c").rename(tmp_path / "old")
    (tmp_path / "c").mkdir()
    for f in (tmp_path / "old").iterdir():
        (tmp_path / "c" / f.name).write_bytes(f.read_bytes())  # new inodes and times, the same text
    log = Log()
    assert prepare_data(cfg, log=log).path == first.path and log.has("reusing")
    for memo in (cache / "hashes").iterdir():  # a memo that can be neither read nor replaced
        memo.unlink()
        memo.mkdir()
    assert Source(cfg).fingerprint == first.meta["fingerprint"]
    same_size_edit(tmp_path / "c" / "doc00.txt")
    assert Source(cfg).fingerprint != first.meta["fingerprint"]


def test_a_file_gone_or_unreadable_when_it_is_hashed_is_one_line(tmp_path, monkeypatch):
    c = tmp_path / "c"
    write_docs(c, 2)
    listed = minitf.corpus.sources._text_files(str(c))
    monkeypatch.setattr(minitf.corpus.sources, "_text_files", lambda spec, kind: listed)
    (c / "doc01.txt").unlink()  # between the listing and the hashing
    with pytest.raises(MinitfError, match=f"^could not read {c / 'doc01.txt'}: No such file or directory; is"):
        Source(DataConfig(source=f"file:{c}"))
    (c / "doc01.txt").mkdir()  # (root reads any file; a directory cannot be read as one)
    with pytest.raises(MinitfError, match=f"^could not read {c / 'doc01.txt'}: Is a directory; make it readable"):
        Source(DataConfig(source=f"file:{c}"))


@pytest.mark.parametrize("which", ["doc00.txt", "doc03.txt"])  # the one being read, one not read yet
def test_a_file_changed_while_it_is_tokenized_is_refused(tmp_path, cache, monkeypatch, which):
    c = tmp_path / "c"
    write_docs(c, 4)
    cfg = DataConfig(source=f"file:{c}", vocab_size=300, num_proc=1)
    prepare_data(DataConfig(source=cfg.source, vocab_size=300, val_fraction=0.3), log=Log())  # trains the BPE
    # small reads and tasks: the first task is encoded while doc00.txt is still being read
    monkeypatch.setattr(minitf.corpus.sources, "READ_BYTES", 64)
    monkeypatch.setattr(minitf.corpus.sources, "BLOCK_CHARS", 97)
    monkeypatch.setattr(minitf.corpus.token_cache, "PIECE_CHARS", 40)
    monkeypatch.setattr(minitf.corpus.token_cache, "TASK_CHARS", 300)
    encode_task = minitf.corpus.token_cache.encode_task
    calls = []

    def edit_then_encode(tok, dtype, task):
        if not calls:
            same_size_edit(c / which)
        calls.append(1)
        return encode_task(tok, dtype, task)

    monkeypatch.setattr(minitf.corpus.token_cache, "encode_task", edit_then_encode)
    tokenizer = minitf.data.Tokenizer.load(next((cache / "tokenizers").glob("*.json")))
    with pytest.raises(MinitfError) as e:
        prepare_data(cfg, tokenizer, log=Log())
    assert str(e.value).startswith(f"{c / which} changed while it was being read for tokenizing")
    assert "\n" not in str(e.value)
    built = [p for p in (cache / "tokens").iterdir()]
    assert len(built) == 1  # only the first build's cache: nothing half-built, nothing from the mixed text

    monkeypatch.setattr(minitf.corpus.token_cache, "encode_task", encode_task)  # nothing writes now: it builds
    log = Log()
    assert prepare_data(cfg, tokenizer, log=log).path not in built and log.has("tokenized")


def test_a_file_changed_while_the_bpe_trains_is_refused_and_no_tokenizer_is_kept(tmp_path, cache, monkeypatch):
    c = tmp_path / "c"
    write_docs(c, 3)
    pieces = minitf.corpus.prepare.pieces
    seen = []

    def edit_while_reading(blocks):
        for piece in pieces(blocks):
            if not seen:  # doc00.txt is read; doc01.txt is not yet
                same_size_edit(c / "doc01.txt")
            seen.append(piece)
            yield piece

    monkeypatch.setattr(minitf.corpus.prepare, "pieces", edit_while_reading)
    with pytest.raises(MinitfError, match=f"^{c / 'doc01.txt'} changed while it was being read"):
        prepare_data(DataConfig(source=f"file:{c}", vocab_size=300), log=Log())
    assert not list((cache / "tokenizers").glob("*.json")) and not (cache / "tokens").exists()


def test_a_single_file_changed_after_its_counting_pass_is_refused(tmp_path, monkeypatch):
    """One file is read first to count its characters (for the split), then to train the BPE and
    to tokenize; an edit between the passes is caught by the next one."""
    f = tmp_path / "one.txt"
    f.write_text(make_play(0))
    split_blocks = minitf.corpus.sources._split_blocks

    def edit_then_split(blocks, cut):  # called after counting, before the next pass reads
        monkeypatch.setattr(minitf.corpus.sources, "_split_blocks", split_blocks)
        same_size_edit(f)
        return split_blocks(blocks, cut)

    monkeypatch.setattr(minitf.corpus.sources, "_split_blocks", edit_then_split)
    with pytest.raises(MinitfError, match=f"^{f} changed while it was being read"):
        prepare_data(DataConfig(source=f"file:{f}", vocab_size=300), log=Log())


# Corpus sources, the train/val split, the token cache, batches and bad input, on tiny local corpora.


@pytest.mark.parametrize(
    "n,f", [(2, 0.1), (2, 0.5), (3, 0.5), (4, 0.1), (5, 0.1), (6, 0.1), (42, 0.1), (1000, 0.05), (999, 0.3), (7, 0.5)]
)
def test_val_rule_counts_and_bounds(n, f):
    val = [i for i in range(n) if val_rule(n, f)(i)]
    assert 1 <= len(val) <= n // 2  # never more val than train
    assert len(val) == max(1, math.ceil(n * f - 0.5))  # n*f rounded, halves down
    if n * f > 0.5:  # the rule needs no n, so a stream splits the same way
        assert val == [i for i in range(n) if val_rule(None, f)(i)]
    else:
        assert val == [n - 1]


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_a_cache_directory_that_is_a_file(tmp_path, monkeypatch, corpus):
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(source=f"file:{corpus}", vocab_size=300), log=lambda *a: None)
    assert str(e.value) == (
        f"MINITF_CACHE={tmp_path / 'cache'} is a file, not a directory; point MINITF_CACHE at a directory "
        f"(made if missing), or unset it"
    )
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache" / "sub"))
    with pytest.raises(MinitfError, match="lies under .*cache, which is a file, not a directory"):
        cache_dir()


def test_a_cache_directory_on_a_read_only_file_system(tmp_path, monkeypatch, corpus):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(source=f"file:{corpus}", vocab_size=300), log=lambda *a: None)
    assert str(e.value) == (
        f"MINITF_CACHE={tmp_path / 'cache'} cannot be made (Read-only file system); "
        "point MINITF_CACHE at a writable directory"
    )
    monkeypatch.undo()
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a read-only mount answers, even to root
    with pytest.raises(MinitfError, match=r"^MINITF_CACHE=.*cache is not writable; point MINITF_CACHE at a writable"):
        cache_dir()


def test_file_names_with_glob_characters(tmp_path):
    (tmp_path / "notes[1].txt").write_text("the first note\n")
    (tmp_path / "notes1.txt").write_text("a file the pattern notes[1].txt would match instead\n")
    (tmp_path / "dir[x]").mkdir()
    (tmp_path / "dir[x]" / "a.txt").write_text("inside a directory with brackets\n")
    assert _text_files(str(tmp_path / "notes[1].txt"))[0] == [tmp_path / "notes[1].txt"]
    assert _text_files(str(tmp_path / "dir[x]"))[0] == [tmp_path / "dir[x]" / "a.txt"]
    # a path that is not there is still a pattern
    assert _text_files(str(tmp_path / "notes[0-9].txt"))[0] == [tmp_path / "notes1.txt"]
