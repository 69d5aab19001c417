"""The export commands end to end (export, export-gguf, attention, evaluate on a run): which weights
they read, refusals before writing, a full disk."""

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.cli import export
from minitf.errors import MinitfError
from minitf.system.files import current_umask
from minitf.training import checkpoint as ckpt
from tests.support.errors import victim
from tests.support.errors import writes_one_line as one_line
from tests.support.processes import command
from tests.support.runs import refusal

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_best_flags_of_attention_and_export(tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    model, tok, _ = minitf.load_run(run)
    with torch.no_grad():  # best.safetensors now holds other weights than model.safetensors
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ckpt.save_weights(model, run / "best.safetensors", 1, tok.hash)
    args = ["--run", str(run), "--text", "ROMEO: O", "--print", "--head", "1"]
    best, latest = command("attention", *args, "--best"), command("attention", *args)
    assert best.returncode == 0 and best.stdout.startswith("layer 0, head 1: attention weights")
    from minitf.inspection import format_weights

    assert best.stdout.strip() == format_weights(minitf.inspect(model, tok, "ROMEO: O"), 0, 1).strip()
    assert best.stdout != latest.stdout
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    r = command("export", "--run", str(run), "--best", "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-1500:]
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    torch.testing.assert_close(exported["transformer.wte.weight"][:300], model.wte.weight.detach()[:300])


def test_export_gguf_says_which_weights_it_exported(tiny_run, tmp_path):
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    model, tok, _ = minitf.load_run(run)
    ckpt.save_weights(model, run / "best.safetensors", 3, tok.hash)
    latest = ckpt.weights_step(run / "model.safetensors")
    r = command("export-gguf", "--run", str(run), "--out", str(tmp_path / "m.gguf"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"[exported {run}: model.safetensors, step {latest} (the latest; --best exports best.safetensors, "
        f"step 3, the lowest val loss)]"
    ]


# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_evaluate_and_both_exports_refuse_before_writing(nan_run, tmp_path):
    from minitf.cli import evaluate, export, export_gguf

    with pytest.raises(MinitfError, match=refusal(nan_run).replace("(", r"\(")):
        evaluate.main(["--run", str(nan_run), "--batch-size", "2"])
    pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export.main(["--run", str(nan_run), "--out", str(tmp_path / "hf")])
    with pytest.raises(MinitfError, match=r"model.safetensors: tensor blocks.0.attn.c_attn.weight holds NaN"):
        export_gguf.main(["--run", str(nan_run), "--out", str(tmp_path / "m.gguf")])
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()


# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


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
