"""Where and how a computation runs: device, dtype and autocast, eval mode for a block, torchrun's
processes, the host RNGs, and two process-wide switches that only an explicit call changes (the C
allocator, TF32 matmuls).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..errors import ConfigError

PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12}


@dataclass
class Dist:
    """This process's place among torchrun's processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device_kind: str) -> Dist:
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; without them this is a single process."""
    if "RANK" not in os.environ:
        return Dist()
    d = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return d


def resolve_device(name: str, local_rank: int = 0, what: str = "run.device") -> torch.device:
    """A device name (auto, cpu, cuda, cuda:N, mps) as a torch.device that is there; otherwise a
    ConfigError naming the setting `what` (run.device, --device) and what to use instead."""
    said, cpu = _setting(what, name), _setting(what, "cpu")
    kind, colon, index = str(name).partition(":")
    if kind not in ("auto", "cpu", "cuda", "mps") or (colon and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"{what} {str(name)[:40]!r} is not one of auto, cpu, cuda, cuda:N, mps")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"{said} but {why}; use {cpu} (or auto)")
    if kind == "cuda" and colon and int(index) >= torch.cuda.device_count():
        raise ConfigError(f"{said} but there are only {torch.cuda.device_count()} CUDA GPUs, from cuda:0")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{said} but MPS is not available; use {cpu} (or auto)")
    if kind == "cuda":
        return torch.device(f"cuda:{index if colon else local_rank}")
    return torch.device(kind)


def _setting(what: str, value: str) -> str:
    """How the user wrote a device setting: run.device=cuda in a config, --device cuda on a command line."""
    return f"{what}={value}" if what.startswith("run.") else f"{what} {value}"


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A train.dtype name as a torch dtype. "auto" is bfloat16 where the hardware multiplies it
    natively (a CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX, where the default recipe
    trains ~1.7x faster at the same quality per step, docs/performance.md) and float32 elsewhere."""
    if name == "auto":
        native = (
            torch.cuda.is_bf16_supported() if device.type == "cuda" else device.type == "cpu" and cpu_has_native_bf16()
        )
        return torch.bfloat16 if native else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX, from the kernel's
    flags); elsewhere bfloat16 is converted to float32 and back around every operation."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:  # not Linux: assume not
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_for(dtype: torch.dtype, device: torch.device):
    """Mixed precision for dtypes below float32; float32 runs as it is."""
    return torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()


def peak_flops(device: torch.device) -> float | None:
    """The datasheet's dense bf16 FLOP/s of a known GPU, for MFU; None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((f for key, f in PEAK_BF16_FLOPS.items() if key in name), None)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """The model in eval mode inside the block (no dropout: sampling, evaluation and inspection
    see the same network every time), and the caller's mode, train or eval, back after it."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextlib.contextmanager
def tf32_matmuls(device: torch.device):
    """TF32 for float32 matmuls on a CUDA device inside the block (about free speed; bf16 autocast
    does the rest), and the caller's setting back after it."""
    if device.type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def keep_freed_memory() -> None:
    """Have the C library keep freed memory for reuse instead of handing it back to the OS.

    glibc serves blocks of 32 MB and more (the default recipe's logits, 8 x 256 x 4096 floats, and
    their gradients) from fresh mmap pages and unmaps them when freed, so every training step
    faults in and zero-fills those pages again. Without mmap and trimming the pages stay with the
    process for the next step; peak memory is unchanged (docs/performance.md has the
    measured effect). Process-wide and permanent, so the library never calls it on its own:
    scripts/train.py does, and so can a program that trains. No-op where the C library has no
    mallopt (macOS).
    """
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def libc() -> ctypes.CDLL | None:
    """The C library's functions as this process has them (Python itself links the C library), or
    None where ctypes cannot open the process (Windows). glibc's own functions (malloc_trim,
    mallopt, prctl) are missing elsewhere: look them up with getattr(libc(), name, None)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


def host_rng_state() -> dict:
    """The RNGs shared by all ranks (python, numpy, CUDA); per-rank ones are saved beside them."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


@contextlib.contextmanager
def kept_rng_state():
    """Run a block, then put every RNG (torch CPU and CUDA, python, numpy) back as it was."""
    host, cpu = host_rng_state(), torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        set_host_rng_state(host)


def set_host_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state((s["numpy"][0], s["numpy"][1].numpy(), *s["numpy"][2:]))
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


class StopFlag:
    """SIGINT (Ctrl-C), SIGTERM (docker stop, Kubernetes, SLURM, spot preemption) and SIGUSR1
    (SLURM's advance warning) set `signal` to the signal's name; the training loop then finishes
    its step, saves a checkpoint and returns. A second signal aborts at once (KeyboardInterrupt).
    Handlers are installed only in the main thread (Python allows no other) and restored on exit.
    """

    NAMES = ("SIGINT", "SIGTERM", "SIGUSR1")

    def __init__(self, log=print):
        self.signal: str | None = None
        self.log, self.old = log, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                num = getattr(signal, name, None)  # SIGUSR1 does not exist on Windows
                if num is not None and signal.getsignal(num) is not None:
                    self.old[num] = signal.signal(num, self._handle)
        return self

    def _handle(self, num, _frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(num).name
        self.log(
            f"\nreceived {self.signal}: finishing this step, saving a checkpoint, then stopping "
            f"(send it again to abort now)"
        )

    def __exit__(self, *exc):
        for num, handler in self.old.items():
            signal.signal(num, handler)
