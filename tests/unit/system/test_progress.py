"""minitf.system.progress: into a log, a progress line every few seconds, never a carriage return."""

from minitf.system import progress
from tests.support.runs import fake_monotonic

# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def test_a_log_gets_a_progress_line_every_few_seconds_never_a_carriage_return(monkeypatch, capsys):
    fake_monotonic(monkeypatch, 4.0)  # every update() reads the clock once: a line every 3rd update
    with progress.progress_bar(1_000_000, "tokenizing", unit="B", every=10.0, unit_scale=True) as bar:
        for _ in range(7):
            bar.update(100_000)
    out, err = capsys.readouterr()
    assert out == "" and "\r" not in err
    assert err.splitlines() == [
        "tokenizing: 30% 300k/1.00M [00:12<00:28, 25.0kB/s]",
        "tokenizing: 60% 600k/1.00M [00:24<00:16, 25.0kB/s]",
        "tokenizing: 70% 700k/1.00M [00:32<00:13, 21.9kB/s]",  # close(): where it ended
    ]
    with progress.progress_bar(None, "reading", unit="B", every=10.0) as bar:  # nothing printed: no line at close
        bar.update(5)
    assert capsys.readouterr().err == ""
