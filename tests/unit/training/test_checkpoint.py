"""minitf.training.checkpoint: the run directory's lock refuses a symbolic link and keeps its target."""

import re

import pytest

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
