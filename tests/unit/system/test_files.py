"""minitf.system.files: atomic_write never writes through a link, and a failed write is one line that leaves nothing."""

import io
import os
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import minitf
import minitf.system.files
from minitf.errors import MinitfError
from minitf.system.files import atomic_write
from tests.support.errors import victim
from tests.support.errors import writes_one_line as one_line

# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        OSError(30, "Read-only file system"),
        RuntimeError("PytorchStreamWriter failed writing file data/0"),
        SafetensorError("Error while serializing: IoError"),
    ],
)
def test_a_failed_write_is_one_line_and_leaves_nothing(tmp_path, error):
    def fail(tmp):
        tmp.write_bytes(b"half")
        raise error

    with pytest.raises(MinitfError, match=r"could not write .*new.bin: .+; nothing was written there$"):
        minitf.system.files.atomic_write(tmp_path / "new.bin", fail)
    (tmp_path / "old.bin").write_bytes(b"complete")
    with pytest.raises(MinitfError, match="the previous file there is intact"):
        minitf.system.files.atomic_write(tmp_path / "old.bin", fail)
    assert (tmp_path / "old.bin").read_bytes() == b"complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.bin"]


def test_ctrl_c_during_torch_save_is_an_interrupt_not_a_failed_write(tmp_path):
    """A second Ctrl-C in torch.save's stream write comes out of torch.save as RuntimeError
    ("unexpected pos"): the write raises the interrupt (the command then says interrupted, exit
    130), not "could not write" (exit 2); the previous file stays and nothing is left beside it."""

    class Interrupted(io.RawIOBase):  # Ctrl-C in its third write, past the header torch.save writes itself
        writes = 0

        def writable(self):
            return True

        def write(self, b):
            self.writes += 1
            if self.writes == 3:
                raise KeyboardInterrupt
            return len(b)

    (tmp_path / "state.pt").write_bytes(b"complete")
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "state.pt", lambda tmp: torch.save({"a": torch.zeros(10)}, Interrupted()))
    with pytest.raises(KeyboardInterrupt):
        minitf.system.files.atomic_write_dir(
            tmp_path / "out", lambda tmp: torch.save({"a": torch.zeros(10)}, Interrupted())
        )
    assert (tmp_path / "state.pt").read_bytes() == b"complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


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


# One checked path for every file a user names (system.files.check_out_file): a FIFO, a device
# node, a directory or a link is never replaced, and an existing file only with force or when the
# same command wrote it.


def test_check_out_file_refuses_what_a_rename_would_destroy(tmp_path):
    from minitf.system.files import check_out_file

    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    for force in (False, True):  # --force replaces regular files only
        with pytest.raises(MinitfError) as e:
            check_out_file(fifo, force)
        assert (
            one_line(e)
            == f"--out {fifo} is a FIFO, not a regular file; minitf replaces regular files only: name a file"
        )
        with pytest.raises(MinitfError, match=r"^--out /dev/null is a character device, not a regular file"):
            check_out_file("/dev/null", force)
    with pytest.raises(MinitfError, match=rf"^--out {tmp_path} is a directory; name the file to write, e.g. "):
        check_out_file(tmp_path, True)
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(MinitfError, match=rf": {tmp_path / 'notes'} is a file, not a directory$"):
        check_out_file(tmp_path / "notes" / "x.png", True)
    (tmp_path / "link.png").symlink_to(tmp_path / "notes")
    with pytest.raises(MinitfError, match="is a symbolic link; minitf does not write through links"):
        check_out_file(tmp_path / "link.png", True)
    with pytest.raises(MinitfError) as e:
        check_out_file(tmp_path / "notes")
    assert (
        one_line(e) == f"--out {tmp_path / 'notes'} already exists; pass --force to replace it, or choose another name"
    )
    assert check_out_file(tmp_path / "notes", True) == tmp_path / "notes"  # asked for
    assert check_out_file(tmp_path / "notes", ours=lambda p: p.read_text() == "mine") == tmp_path / "notes"
    assert check_out_file(tmp_path / "new.png") == tmp_path / "new.png"
    assert fifo.is_fifo() and (tmp_path / "notes").read_text() == "mine"


def test_atomic_writes_never_rename_over_a_fifo(tmp_path):
    from minitf.system.files import atomic_write_dir

    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(MinitfError, match="model.safetensors is a FIFO, not a regular file"):
        atomic_write(tmp_path / "model.safetensors", lambda tmp: Path(tmp).write_bytes(b"weights"))
    (tmp_path / "config.json").write_text("old")

    def export(tmp):
        (tmp / "config.json").write_text("new")
        (tmp / "model.safetensors").write_bytes(b"weights")

    with pytest.raises(MinitfError, match="model.safetensors is a FIFO, not a regular file"):
        atomic_write_dir(tmp_path, export)  # --force into a directory: checked before any file moves
    assert (tmp_path / "model.safetensors").is_fifo() and (tmp_path / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
