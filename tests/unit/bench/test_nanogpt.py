"""The nanoGPT comparison's own arithmetic: reading train.py's log, and scoring a checkpoint on
the whole validation text in bits per byte (a stand-in clone: nanoGPT itself is not shipped)."""

import math

import numpy as np
import pytest
import torch

from bench import nanogpt
from minitf.errors import MinitfError

LOG = """step 0: train loss 4.2, val loss 4.2
iter 0: loss 4.2000, time 900.00ms, mfu -100.00%
iter 1: loss 4.1000, time 50.00ms, mfu 1.00%
iter 2: loss 4.0000, time 60.00ms, mfu 1.00%
iter 3: loss 3.9000, time 40.00ms, mfu 1.00%
step 4: train loss 3.8, val loss 3.8
iter 4: loss 3.8000, time 700.00ms, mfu 1.00%
iter 5: loss 3.7000, time 55.00ms, mfu 1.00%
"""


# a model.py with nanoGPT's interface whose logits are all zero: every character costs log(V) nats
UNIFORM_MODEL = """
import dataclasses, torch
@dataclasses.dataclass
class GPTConfig:
    block_size: int = 8
    vocab_size: int = 5
class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.w = torch.nn.Parameter(torch.zeros(1))
    def forward(self, idx, targets=None):
        B, T = idx.shape
        return torch.zeros(B, T, self.config.vocab_size) * self.w, None
"""


def test_iteration_times_leave_out_warmup_and_evaluations():
    assert nanogpt.iteration_ms(LOG, skip=1, eval_interval=4) == 52.5  # of 50, 60, 40, 55: not 900, 700
    assert nanogpt.iteration_ms(LOG, skip=0) == 57.5
    with pytest.raises(MinitfError, match="no iteration times"):
        nanogpt.iteration_ms("step 0: train loss 4.2\n")


def test_a_checkpoint_is_scored_on_every_character_of_val_in_bits_per_byte(tmp_path):
    (tmp_path / "model.py").write_text(UNIFORM_MODEL)
    (tmp_path / "train.py").write_text("")
    root = nanogpt.check_clone(tmp_path)
    data = tmp_path / "data" / "x"
    data.mkdir(parents=True)
    text = "abcé" * 25 + "abc"  # 103 characters, é two bytes in UTF-8
    (data / "input.txt").write_text(text, encoding="utf-8")
    val_text = text[int(len(text) * 0.9) :]
    np.array([ord(c) % 5 for c in val_text], dtype=np.uint16).tofile(data / "val.bin")  # 11 ids: 1 short window
    out = tmp_path / "out"
    out.mkdir()
    torch.save({"model": {"w": torch.zeros(1)}, "model_args": {"block_size": 4, "vocab_size": 5}}, out / "ckpt.pt")
    bpb = nanogpt.nanogpt_val_bpb(root, data, out)
    chars_per_byte = len(val_text) / len(val_text.encode("utf-8"))
    assert bpb == pytest.approx(math.log2(5) * chars_per_byte, rel=1e-6)


def test_a_directory_that_is_not_a_clone_is_named(tmp_path):
    with pytest.raises(MinitfError, match="not a nanoGPT clone"):
        nanogpt.check_clone(tmp_path)
