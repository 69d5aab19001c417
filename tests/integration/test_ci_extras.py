"""tests/support/extras.py: with MINITF_ALL_EXTRAS=1 a skip for a missing extra fails the run;
without it (the bare-venv pass) such a skip is a skip."""

import os
import subprocess
import sys

from tests.support import ROOT

SKIPS = """
import pytest

def test_needs_an_extra():
    pytest.skip("frobnicate is not installed (pip install -e '.[frob]')")

def test_skips_for_a_device():
    pytest.skip("needs a CUDA device")
"""


def run(tmp_path, all_extras: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {**os.environ, "MINITF_ALL_EXTRAS": "1" if all_extras else "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.extras", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skip_for_an_extra_fails_only_where_every_extra_is_installed(tmp_path):
    strict = run(tmp_path, all_extras=True)
    assert strict.returncode == 1, strict.stdout
    assert "MINITF_ALL_EXTRAS=1 but 1 test(s) skipped for a missing extra" in strict.stdout
    assert "test_needs_an_extra" in strict.stdout
    bare = run(tmp_path, all_extras=False)
    assert bare.returncode == 0 and "2 skipped" in bare.stdout, bare.stdout
