"""minitf.training.checkpoint: the run directory's lock refuses a symbolic link and keeps its target."""

import re

import pytest
import torch

from minitf.errors import MinitfError
from minitf.training.checkpoint import lock_run_dir
from tests.support.errors import victim
from tests.support.errors import writes_one_line as one_line

# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


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


def test_a_full_disk_while_writing_state_is_one_line_and_keeps_the_last_state(tmp_path):
    """The file system refuses the bytes midway (here a file-size limit the kernel enforces, as a
    full disk's ENOSPC would): one line with the system's reason, not torch's "unexpected pos",
    and the previous state.pt as it was."""
    import resource
    import signal

    from minitf.errors import MinitfError
    from minitf.training.checkpoint import STATE, write_state

    write_state(tmp_path, {"w": torch.zeros(4)}, step=1)
    before = (tmp_path / STATE).read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
        with pytest.raises(MinitfError) as e:
            write_state(tmp_path, {"w": torch.zeros(1 << 20)}, step=2)  # 4 MB
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert str(e.value) == f"could not write {tmp_path / STATE}: File too large; the previous file there is intact"
    assert (tmp_path / STATE).read_bytes() == before and not list(tmp_path.glob(".*.tmp"))
