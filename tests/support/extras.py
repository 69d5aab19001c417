"""A pytest plugin: where every extra is installed (MINITF_ALL_EXTRAS=1, as .ci/run's main test run
sets it), a test that skips for a missing extra fails the run. CI then tests what it claims: an
all-extras install that lost one (peft, once) cannot pass with that extra's tests quietly skipped.
Only the bare-venv pass, which installs no extra, may skip for them, each naming its extra."""

import os

import pytest

# what every skip for an extra says: how to install it
EXTRA = "pip install -e '.["


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("MINITF_ALL_EXTRAS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    missing = [r for r in skipped if EXTRA in str(r.longrepr)]
    if missing:
        reporter.write_line(
            f"MINITF_ALL_EXTRAS=1 but {len(missing)} test(s) skipped for a missing extra, e.g. {missing[0].nodeid}: "
            f"{missing[0].longrepr[-1] if isinstance(missing[0].longrepr, tuple) else missing[0].longrepr}",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
