"""One run per directory and per process: a refused run leaves no trace (no .lock, no directory),
a second minitf.train() in the same process while one runs is refused (each run stays
reproducible), and the sharded checkpoint's temporary folder has a fresh name no link can take."""

import os
import re
import threading
from pathlib import Path

import pytest
from safetensors.torch import load_file

import minitf
from minitf.errors import MinitfError
from minitf.training.metrics import METRICS, append_row, read_rows
from tests.support.errors import writes_one_line as one_line
from tests.support.runs import copy_run, tiny_config


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


def test_a_finished_run_keeps_its_lock_file(run_4_steps):
    run = run_4_steps  # trained in this process
    assert (run / ".lock").read_text() == str(os.getpid())


def test_a_second_train_while_one_runs_in_another_thread_is_refused_and_the_first_stays_exact(
    tmp_path, corpus, run_8_steps
):
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
    alone = run_8_steps  # the same config, trained alone
    minitf.train(tiny_config(tmp_path / "again", corpus, "train.max_steps=1"), **QUIET)  # afterwards a run may start
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(alone / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)  # the threaded run is the run alone


# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


QUIET = dict(log=lambda *a: None)


@pytest.mark.parametrize("name", ["state.pt", "metrics.jsonl", "steps.jsonl", "model.safetensors"])
def test_resume_refuses_a_linked_run_file_before_training(tmp_path, corpus, run_8_steps, name):
    run = copy_run(run_8_steps, tmp_path / "run")
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
