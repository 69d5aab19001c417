"""minitf.cli.train, called in process: --help gives every key its meaning, the plain run is the
default config, --resume's argument."""

import re

import pytest

import minitf
from minitf.cli.train import _resume_dir
from tests.support.errors import exit_code

# The `minitf` command: one front door over the same code as scripts/*.py, with their one-line errors.


def test_train_help_gives_every_key_its_meaning(capsys):
    assert exit_code(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "    model.n_embd = 128" in out and "width of the residual stream" in out
    # choices, and the recipes by name (argparse wraps the list where its length puts the line ends,
    # a hyphenated name included)
    assert "[adamw|muon]" in out and "chat, gpt2-small, induction, nanogpt-cpu" in re.sub(
        r"-\s+", "-", " ".join(out.split())
    )


def test_the_plain_train_run_is_the_default_config(monkeypatch):
    """`minitf train` (and scripts/train.py, the same function) with no arguments trains load_config()."""
    import minitf.system.runtime
    import minitf.trainer

    seen = []
    monkeypatch.setattr(minitf.trainer, "train", lambda cfg, **kw: seen.append(cfg))
    monkeypatch.setattr(minitf.system.runtime, "keep_freed_memory", lambda: None)
    from minitf.cli import train

    train.main([])
    train.main(["--config", "shakespeare"])
    assert seen == [minitf.load_config(), minitf.load_config()] and seen[0].train.optimizer == "muon"


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def test_resume_takes_the_run_directory_or_an_override_after_it(tmp_path):
    assert _resume_dir(False, ["train.max_steps=8"]) == ["train.max_steps=8"]
    assert _resume_dir(True, ["train.max_steps=8"]) == ["train.max_steps=8"]  # --resume alone: run.out_dir
    assert _resume_dir("runs/x", ["train.max_steps=8"]) == ["run.out_dir=runs/x", "train.max_steps=8"]
    # an override right after --resume stays an override
    assert _resume_dir("run.out_dir=runs/x", ["train.max_steps=8"]) == ["run.out_dir=runs/x", "train.max_steps=8"]
    assert _resume_dir("train.max_steps=8", []) == ["train.max_steps=8"]
    odd = tmp_path / "a=b"  # unless a directory has that name
    odd.mkdir()
    assert _resume_dir(str(odd), []) == [f"run.out_dir={odd}"]
    assert _resume_dir("runs/x", ["run.out_dir=runs/x/"]) == ["run.out_dir=runs/x", "run.out_dir=runs/x/"]
    with pytest.raises(minitf.MinitfError, match=r"^--resume runs/x and run.out_dir=runs/y name two runs"):
        _resume_dir("runs/x", ["run.out_dir=runs/y"])
