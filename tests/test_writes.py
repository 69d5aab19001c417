"""Writes land only where minitf means them to: no symlink redirects a write out of the run
directory, a fresh run never overwrites files it did not write, exports never replace a run's
weights, and the run directory is never the current directory or a repository root."""

import os
import re
from pathlib import Path

import pytest

import minitf
from minitf.cli import export, export_gguf
from minitf.config import load_config
from minitf.errors import ConfigError, MinitfError
from minitf.system.files import atomic_write, current_umask
from minitf.training.checkpoint import lock_run_dir
from minitf.training.metrics import METRICS, Logger, append_row, read_rows

from .helpers import tiny_config

QUIET = dict(log=lambda *a: None)


def victim(tmp_path: Path, name: str = "precious.txt") -> tuple[Path, bytes]:
    """A user's file outside the run directory, and its bytes, which must never change."""
    path = tmp_path / name
    data = b"the user's own bytes\n"
    path.write_bytes(data)
    return path, data


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# symlinks inside a run directory


def test_a_linked_lock_is_refused_and_its_target_kept(tmp_path):
    target, data = victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(MinitfError) as e, lock_run_dir(run):
        pass
    assert re.fullmatch(
        rf"{run}/\.lock is a symbolic link \(to {target}\); minitf does not write through .*", one_line(e)
    )
    assert target.read_bytes() == data


def test_a_planted_tmp_link_is_not_written_through(tmp_path):
    target, data = victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".state.pt.tmp").symlink_to(target)  # the name atomic_write used to write to
    atomic_write(run / "state.pt", lambda tmp: Path(tmp).write_bytes(b"checkpoint"))
    assert (run / "state.pt").read_bytes() == b"checkpoint" and not (run / "state.pt").is_symlink()
    assert target.read_bytes() == data
    assert not [p for p in run.glob(".*.tmp") if not p.is_symlink()]  # no temporary file of ours left


def test_atomic_write_refuses_a_linked_target(tmp_path):
    target, data = victim(tmp_path)
    (tmp_path / "model.safetensors").symlink_to(target)
    with pytest.raises(MinitfError, match=r"model\.safetensors is a symbolic link") as e:
        atomic_write(tmp_path / "model.safetensors", lambda tmp: Path(tmp).write_bytes(b"weights"))
    one_line(e)
    assert target.read_bytes() == data and (tmp_path / "model.safetensors").is_symlink()


def test_a_linked_metrics_file_is_never_appended_to(tmp_path):
    target, data = victim(tmp_path)
    (tmp_path / METRICS).symlink_to(target)
    with pytest.raises(MinitfError, match=rf"^{tmp_path}/metrics\.jsonl is a symbolic link") as e:
        append_row(tmp_path / METRICS, {"step": 1})
    one_line(e)
    with pytest.raises(MinitfError, match=r"metrics\.jsonl is a symbolic link"):
        Logger(tmp_path)  # refused when the logger starts, before any training time is spent
    assert target.read_bytes() == data


def test_a_linked_tensorboard_directory_is_refused(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install -e '.[tensorboard]')")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    with pytest.raises(MinitfError, match=r"tensorboard is a symbolic link") as e:
        Logger(run, "tensorboard")
    one_line(e)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("name", ["state.pt", "metrics.jsonl", "steps.jsonl", "model.safetensors"])
def test_resume_refuses_a_linked_run_file_before_training(tmp_path, corpus, name):
    run = minitf.train(tiny_config(tmp_path / "run", corpus), **QUIET)
    target = tmp_path / "moved"
    (run / name).rename(target)
    data = target.read_bytes()
    (run / name).symlink_to(target)
    with pytest.raises(MinitfError, match=rf"^{run}/{re.escape(name)} is a symbolic link") as e:
        minitf.train(tiny_config(run, corpus, "train.max_steps=12"), resume=True, **QUIET)
    one_line(e)
    assert target.read_bytes() == data


def test_a_run_directory_that_is_itself_a_link_still_works(tmp_path, corpus):
    scratch = tmp_path / "scratch" / "x"
    scratch.mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x").symlink_to(scratch)
    run = minitf.train(tiny_config(tmp_path / "runs" / "x", corpus), **QUIET)
    assert (scratch / "state.pt").is_file() and (scratch / "model.safetensors").is_file()
    minitf.train(tiny_config(run, corpus, "train.max_steps=12"), resume=True, **QUIET)
    assert [r["step"] for r in read_rows(scratch / METRICS)] == [4, 8, 12]


# ---------------------------------------------------------------------------------------------
# a fresh run in a directory that is not empty


def test_a_fresh_run_refuses_a_directory_of_the_users_files(tmp_path, corpus):
    run = tmp_path / "mine"
    run.mkdir()
    files = {"config.yaml": b"my: own\n", "tokenizer.json": b"{}", "loss.png": b"\x89PNG mine"}
    for name, data in files.items():
        (run / name).write_bytes(data)
    with pytest.raises(MinitfError) as e:
        minitf.train(tiny_config(run, corpus), **QUIET)
    assert one_line(e) == (
        f"{run} holds files minitf did not write (config.yaml (not this run's)); a new run needs an empty "
        f"directory or one minitf made for this run.out_dir: set run.out_dir to a new directory, or move those "
        f"files away"
    )
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == files


def test_a_fresh_run_names_unknown_files(tmp_path, corpus):
    run = tmp_path / "mine"
    run.mkdir()
    for name in ("a.txt", "b.csv", "c.py", "d", "e"):
        (run / name).write_text(name)
    with pytest.raises(MinitfError, match=r"holds files minitf did not write \(a\.txt, b\.csv, c\.py, d, \.\.\.\)"):
        minitf.train(tiny_config(run, corpus), **QUIET)
    assert (run / "a.txt").read_text() == "a.txt"


def test_a_config_of_another_run_is_not_ours(tmp_path, corpus):
    run = tmp_path / "run"
    run.mkdir()
    other = tiny_config(tmp_path / "other", corpus)
    minitf.config.save_config(other, run / "config.yaml")
    data = (run / "config.yaml").read_bytes()
    with pytest.raises(MinitfError, match=r"config\.yaml \(not this run's\)"):
        minitf.train(tiny_config(run, corpus), **QUIET)
    assert (run / "config.yaml").read_bytes() == data


def test_a_fresh_run_reuses_what_an_attempt_before_its_first_checkpoint_left(tmp_path, corpus):
    cfg = tiny_config(tmp_path / "run", corpus)
    run = Path(cfg.run.out_dir)
    run.mkdir()
    minitf.config.save_config(cfg, run / "config.yaml")
    for step in (25, 50):  # logs of an attempt that never checkpointed: dropped, not mixed in
        append_row(run / METRICS, {"step": step, "val_loss": 1.0})
    minitf.train(cfg, **QUIET)
    assert [r["step"] for r in read_rows(run / METRICS)] == [4, 8]


# ---------------------------------------------------------------------------------------------
# exports


def test_export_refuses_a_run_directory_and_keeps_its_weights(tiny_run, capsys):
    before = {p.name: p.read_bytes() for p in tiny_run.iterdir() if p.is_file()}
    for force in ([], ["--force"]):
        with pytest.raises(MinitfError) as e:
            export.main(["--run", str(tiny_run), "--out", str(tiny_run), *force])
        assert one_line(e) == (
            f"--out {tiny_run} is a minitf run directory; exporting there would replace its weights: "
            f"choose a new directory"
        )
    after = {p.name: p.read_bytes() for p in tiny_run.iterdir() if p.is_file()}
    assert after == before


def test_export_refuses_a_file_and_a_non_empty_directory_without_force(tiny_run, tmp_path):
    target, data = victim(tmp_path)
    with pytest.raises(MinitfError) as e:
        export.main(["--run", str(tiny_run), "--out", str(target)])
    assert one_line(e) == f"--out {target} is a file; --out names a directory to create"
    assert target.read_bytes() == data
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(MinitfError) as e:
        export.main(["--run", str(tiny_run), "--out", str(busy)])
    assert one_line(e) == (
        f"--out {busy} is not empty (it has notes.txt); pass --force to write into it, or choose a new directory"
    )
    assert os.listdir(busy) == ["notes.txt"]
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    export.main(["--run", str(tiny_run), "--out", str(busy), "--force"])
    assert (busy / "config.json").is_file() and (busy / "notes.txt").read_text() == "mine"


def test_export_gguf_never_replaces_a_run_file(tiny_run):
    data = (tiny_run / "model.safetensors").read_bytes()
    with pytest.raises(MinitfError) as e:
        export_gguf.main(["--run", str(tiny_run), "--out", str(tiny_run / "model.safetensors"), "--force"])
    assert one_line(e) == (
        f"--out {tiny_run / 'model.safetensors'} is a file of the run in {tiny_run}; name a new file, e.g. model.gguf"
    )
    with pytest.raises(MinitfError, match=r"is a directory; name the file to write"):
        export_gguf.main(["--run", str(tiny_run), "--out", str(tiny_run)])
    assert (tiny_run / "model.safetensors").read_bytes() == data


# ---------------------------------------------------------------------------------------------
# run.out_dir and run.name


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.out_dir=", "run.out_dir is empty; name the run directory, e.g. run.out_dir=runs/mine"),
        ("run.name=", "run.name is empty; give the run a name, e.g. run.name=shakespeare"),
        (
            "run.out_dir=.",
            "run.out_dir '.' is the current directory; runs write config.yaml and weights there: "
            "choose a directory of its own, e.g. run.out_dir=runs/mine",
        ),
    ],
)
def test_an_empty_or_current_run_directory_is_refused(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert one_line(e) == message


def test_a_repository_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for repo, entry, text in (("git", ".git", None), ("clone", "pyproject.toml", '[project]\nname = "minitf"\n')):
        (tmp_path / repo).mkdir()
        if text is None:
            (tmp_path / repo / entry).mkdir()
        else:
            (tmp_path / repo / entry).write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"run.out_dir={repo}"])
        assert one_line(e) == (
            f"run.out_dir '{repo}' is a repository root; runs write config.yaml and weights there: "
            f"choose a directory of its own, e.g. run.out_dir=runs/mine"
        )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    assert load_config(None, ["run.out_dir=other"]).run.out_dir == "other"  # not a repository of its own


def test_export_gguf_force_never_replaces_a_fifo(tiny_run, tmp_path):
    out = tmp_path / "pipe.gguf"  # a device node is refused the same way (not tested: renaming over one is harm)
    os.mkfifo(out)
    with pytest.raises(MinitfError) as e:
        export_gguf.main(["--run", str(tiny_run), "--out", str(out), "--force"])
    assert one_line(e) == f"--out {out} is a FIFO, not a regular file; --force replaces regular files only: name a file"
    assert out.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe.gguf"]


def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(tiny_run, tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    import errno

    def full(self, path):
        Path(path).write_bytes(b'{"half": ')  # what a full disk leaves of a file: its start
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "hf" / "mine"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with monkeypatch.context() as m:
        m.setattr(minitf.Tokenizer, "save", full)
        with pytest.raises(MinitfError) as e:
            export.main(["--run", str(tiny_run), "--out", str(out)])
        assert one_line(e) == f"could not write {out}: No space left on device; nothing was written there"
        with pytest.raises(MinitfError) as e:
            export.main(["--run", str(tiny_run), "--out", str(busy), "--force"])
        assert one_line(e) == f"could not write {busy}: No space left on device; the files there are intact"
    assert sorted(os.listdir(tmp_path)) == ["busy"] and os.listdir(busy) == ["notes.txt"]  # no temporary, no hf/
    export.main(["--run", str(tiny_run), "--out", str(out)])  # the next export finds nothing in its way
    assert sorted(os.listdir(out)) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~current_umask())


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_a_file_in_a_directory_that_takes_no_new_files_is_one_line_that_says_so():
    """/proc/version is there, but no file can be made beside it: the line says that, not only
    'No such file or directory' about a file that exists."""
    with pytest.raises(MinitfError) as e:
        atomic_write(Path("/proc/version"), lambda tmp: Path(tmp).write_text("x"))
    one_line(e)
    assert str(e.value) == (
        "could not write /proc/version: no new file can be made in /proc (No such file or directory), and "
        "minitf writes a file beside its target first, then renames it: write to another directory; "
        "the previous file there is intact"
    )
