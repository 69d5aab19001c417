"""minitf.system.files: atomic_write never writes through a link, and a failed write is one line that leaves nothing."""

from pathlib import Path

import pytest
from safetensors import SafetensorError

import minitf
import minitf.system.files
from minitf.errors import MinitfError
from minitf.system.files import atomic_write
from tests.helpers import victim
from tests.helpers import writes_one_line as one_line

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
