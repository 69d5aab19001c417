"""minitf.training.snapshots: snapshots of a large model or history are refused in one line."""

import pytest
import torch.nn as nn

import minitf
from minitf.errors import ConfigError
from minitf.training.snapshots import MAX_BYTES, plan

# train.snapshot_every: the weights every N steps, kept through a resume, refused for large
# models; and minitf heads, which scores and draws them.


def test_snapshots_of_a_large_model_or_history_are_refused_in_one_line():
    small = nn.Linear(100, 100)  # 10,100 float32 parameters: 39.5 KB a snapshot
    assert plan(10, small, 0, 100) == "snapshots: every 10 steps, up to 10 x 0.0 MB = 0.4 MB in snapshots/"
    assert plan(10, small, 50, 100).startswith("snapshots: every 10 steps, up to 5 x")  # a resume keeps fewer
    big = nn.Linear(8000, 8000, device="meta")  # 64 million parameters, never allocated
    with pytest.raises(
        ConfigError, match=r"^train.snapshot_every keeps the weights of small models only: .*64,008,000"
    ):
        plan(10, big, 0, 100)
    steps = MAX_BYTES // (4 * 10_100) * 10 + 10  # one snapshot more than the disk allowance
    with pytest.raises(ConfigError, match=r"raise train.snapshot_every or lower train.max_steps$") as e:
        plan(10, small, 0, steps)
    assert "\n" not in str(e.value) and "GB" in str(e.value)
    with pytest.raises(ConfigError, match="train.snapshot_every must be >= 0"):
        minitf.load_config("tiny", ["train.snapshot_every=-1"])
    with pytest.raises(ConfigError, match="train.snapshot_every is for small models, not train.parallel=fsdp"):
        minitf.load_config("tiny", ["train.snapshot_every=10", "train.parallel=fsdp", "train.optimizer=adamw"])
    assert minitf.load_config("tiny").train.snapshot_every == 0  # off unless asked
