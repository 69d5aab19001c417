"""A safetensors file written one tensor at a time, each made only when its bytes are written.

A LoRA run's weights file holds every adapted matrix merged with its adapter (W + (alpha / r) B A),
a tensor the model does not hold: safetensors' own save_file takes every tensor at once, so a
Llama-3.2-1B's merge held a second copy of its 1.9 GB of adapted matrices for the length of each
save. The file's layout is fixed by its specification (huggingface.co/docs/safetensors: an 8-byte
little-endian header size, a JSON header naming each tensor's dtype, shape and byte range, then the
bytes): the header is known from shapes and dtypes alone, so each tensor here is made, written and
dropped in turn. What is written is read back by safetensors itself (the readers and the tests).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

# safetensors' names of the dtypes a model's weights come in
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


class Entry:
    """One tensor of the file: its name, shape and dtype, and `make`, which returns it when written."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, make: Callable[[], torch.Tensor]):
        self.name, self.shape, self.dtype, self.make = name, tuple(shape), dtype, make

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size()


def write_streamed(path: Path, entries: Iterable[Entry], metadata: dict[str, str]) -> None:
    """Write `path` as a safetensors file of `entries`, in their order, making one at a time."""
    entries = list(entries)
    header: dict = {"__metadata__": metadata}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the specification pads it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for e in entries:
            t = e.make().detach().contiguous()  # (shape): made now, dropped after its bytes are written
            if t.shape != e.shape or t.dtype != e.dtype:
                raise RuntimeError(f"{e.name} was made {tuple(t.shape)} {t.dtype}, announced {e.shape} {e.dtype}")
            f.write(memoryview(t.view(torch.uint8).reshape(-1).numpy()))  # little-endian, as torch holds it on CPU
            del t
