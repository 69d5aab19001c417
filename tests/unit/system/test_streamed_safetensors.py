"""A safetensors file written one tensor at a time reads back through safetensors itself: the same
tensors (float32, bfloat16, int64, any shape), the same metadata, each tensor made exactly once."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from minitf.system.streamed_safetensors import Entry, write_streamed


def test_the_file_reads_back_as_written(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "blocks.0.attn.c_attn.weight": torch.randn(96, 32, generator=g).bfloat16(),
        "blocks.0.ln_1.weight": torch.randn(32, generator=g),
        "lm_head.weight": torch.randn(7, 5, generator=g),  # 35 floats: the data after it is not 8-aligned
        "steps": torch.arange(3, dtype=torch.int64),
        "half": torch.randn(2, 3, 4, generator=g).half(),
    }
    made = []

    def maker(name):
        def make():
            made.append(name)
            return tensors[name].clone()

        return make

    entries = [Entry(n, tuple(t.shape), t.dtype, maker(n)) for n, t in tensors.items()]
    write_streamed(tmp_path / "w.safetensors", entries, {"step": "7", "wte.weight": "lm_head.weight"})
    back = load_file(tmp_path / "w.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in tensors.items())
    with safe_open(tmp_path / "w.safetensors", "pt") as f:
        assert f.metadata() == {"step": "7", "wte.weight": "lm_head.weight"}
    assert made == list(tensors)  # each made once, in the file's order


def test_a_tensor_made_other_than_announced_is_refused(tmp_path):
    entry = Entry("w", (2, 2), torch.float32, lambda: torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match=r"w was made \(2, 3\) torch.float32, announced \(2, 2\)"):
        write_streamed(tmp_path / "w.safetensors", [entry], {})
