"""minitf.cli.export, called in process: --out never replaces a run directory's weights."""

import pytest

from minitf.cli import export
from minitf.errors import MinitfError
from tests.support.errors import writes_one_line as one_line

# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


def test_export_refuses_a_run_directory_and_keeps_its_weights(tiny_run, capsys):
    before = {p.name: p.read_bytes() for p in tiny_run.iterdir() if p.is_file()}
    for force in ([], ["--force"]):
        with pytest.raises(MinitfError) as e:
            export.main(["--run", str(tiny_run), "--out", str(tiny_run), *force])
        assert one_line(e) == (
            f"--out {tiny_run} is a minitf run directory; exporting there would replace its weights: "
            f"choose a new directory"
        )
    after = {p.name: p.read_bytes() for p in tiny_run.iterdir() if p.is_file()}
    assert after == before
