"""One run per directory and per process: a refused run leaves no trace (no .lock, no directory),
a second minitf.train() in the same process while one runs is refused (each run stays
reproducible), and the sharded checkpoint's temporary folder has a fresh name no link can take."""

import os
import threading

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.errors import MinitfError

from .helpers import tiny_config

QUIET = dict(log=lambda *a: None)


def test_a_refused_fresh_run_leaves_no_lock_among_the_users_files(tmp_path, corpus):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(MinitfError, match="holds files minitf did not write"):
        minitf.train(tiny_config(mine, corpus), **QUIET)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_refused_run_removes_the_directories_it_created(tmp_path, corpus):
    new = tmp_path / "runs" / "new"
    with pytest.raises(MinitfError, match="matches no files"):
        minitf.train(tiny_config(new, corpus, f"data.source=file:{tmp_path / 'no-such-data'}"), **QUIET)
    assert os.listdir(tmp_path) == []  # neither runs/new nor runs/ is left


def test_a_run_that_fails_after_writing_keeps_its_files_and_its_lock_goes(tmp_path, corpus, monkeypatch):
    from minitf import trainer

    def boom(*a, **k):
        raise MinitfError("a failure in the middle of training")

    monkeypatch.setattr(trainer, "train_step", boom)
    with pytest.raises(MinitfError, match="a failure in the middle"):
        minitf.train(tiny_config(tmp_path / "run", corpus), **QUIET)
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "config.yaml" in left and "tokenizer.json" in left and ".lock" not in left


def test_a_finished_run_keeps_its_lock_file(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    assert (run / ".lock").read_text() == str(os.getpid())


def test_a_second_train_while_one_runs_in_another_thread_is_refused_and_the_first_stays_exact(tmp_path, corpus):
    inside, go_on, results = threading.Event(), threading.Event(), {}

    def log_then_wait(*_):  # the first line is logged inside train(): hold the run there
        inside.set()
        go_on.wait(60)

    def first():
        results["run"] = minitf.train(tiny_config(tmp_path / "a", corpus), log=log_then_wait, plot=False)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(60)
        with pytest.raises(MinitfError, match=r"^minitf.train is already running in this process \(another thread\)"):
            minitf.train(tiny_config(tmp_path / "b", corpus), **QUIET)
        assert not (tmp_path / "b").exists()
    finally:
        go_on.set()
        thread.join(120)
    assert results["run"] == tmp_path / "a"
    alone = minitf.train(tiny_config(tmp_path / "alone", corpus), **QUIET)  # afterwards a run may start again
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(alone / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)  # the threaded run is the run alone


def test_sharded_checkpoints_are_written_into_a_fresh_folder_never_through_a_link(tmp_path, corpus, monkeypatch):
    from minitf import trainer

    """train.parallel=fsdp in one process writes the same sharded checkpoint as under torchrun."""
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.parallel=fsdp", "train.max_steps=4"), **QUIET)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (run / ".sharded-00000008.tmp").symlink_to(victim)  # the name every save of step 8 used to write into
    resume = lambda steps: minitf.train(run, resume=True, overrides=[f"train.max_steps={steps}"], **QUIET)  # noqa: E731
    resume(8)
    assert os.listdir(victim) == ["keep.txt"]  # no shard landed behind the link
    folder = run / "sharded-00000008"
    assert folder.is_dir() and not folder.is_symlink() and (folder / ".metadata").is_file()
    assert [p.name for p in run.iterdir() if p.name.startswith(".sharded")] == [".sharded-00000008.tmp"]
    assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # as the run's other folders

    (run / "sharded-00000012").symlink_to(victim)  # a link where the folder of step 12 goes
    with pytest.raises(MinitfError, match=r"sharded-00000012 is a symbolic link \(to .*victim\); minitf does not"):
        resume(12)  # refused before any step
    assert os.listdir(victim) == ["keep.txt"]
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8 and (folder / ".metadata").is_file()

    # planted while the run trains (after the check above), the link is refused at the save itself
    (run / "sharded-00000012").unlink()
    real_step = trainer.train_step

    def plant_then_step(run_, *a):
        if run_.step == 10 and not (run / "sharded-00000012").is_symlink():
            (run / "sharded-00000012").symlink_to(victim)
        return real_step(run_, *a)

    monkeypatch.setattr(trainer, "train_step", plant_then_step)
    with pytest.raises(MinitfError, match=r"sharded-00000012 is a symbolic link"):
        resume(12)
    assert os.listdir(victim) == ["keep.txt"]
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8 and len(load_file(run / "model.safetensors"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
