"""minitf.cli.export_gguf, called in process: --out never replaces a run's file or a FIFO."""

import os

import pytest

from minitf.cli import export_gguf
from minitf.errors import MinitfError
from tests.support.errors import writes_one_line as one_line

# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


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


def test_export_gguf_force_never_replaces_a_fifo(tiny_run, tmp_path):
    out = tmp_path / "pipe.gguf"  # a device node is refused the same way (not tested: renaming over one is harm)
    os.mkfifo(out)
    for force in ([], ["--force"]):  # with or without --force: never 'already exists; pass --force'
        with pytest.raises(MinitfError) as e:
            export_gguf.main(["--run", str(tiny_run), "--out", str(out), *force])
        assert (
            one_line(e) == f"--out {out} is a FIFO, not a regular file; minitf replaces regular files only: name a file"
        )
    assert out.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["pipe.gguf"]
