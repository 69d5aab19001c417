"""minitf.training.metrics: the logger never appends to a linked metrics file or writes into a
linked TensorBoard directory."""

import pytest

from minitf.errors import MinitfError
from minitf.training.metrics import METRICS, Logger, append_row
from tests.support.errors import victim
from tests.support.errors import writes_one_line as one_line

# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


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
