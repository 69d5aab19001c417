"""Where and how a computation runs: device, dtype and autocast, eval mode for a block, torchrun's
processes, the host RNGs, and two process-wide switches that only an explicit call changes (the C
allocator, TF32 matmuls).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..errors import ConfigError


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
    if dist.is_initialized():
        return d
    if device_kind == "cuda":  # this rank's GPU first, and named: NCCL binds the group to it, not to cuda:0
        gpu = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(gpu)
        dist.init_process_group(backend="nccl", device_id=gpu)
    else:
        dist.init_process_group(backend="gloo")
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


# the dtypes a setting or an option names (train.dtype, --dtype), by torch's names
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device, sharded: bool = False) -> torch.dtype:
    """A train.dtype name as a torch dtype. "auto" is bfloat16 where the hardware multiplies it
    natively (native_bf16: a CPU with AVX512-BF16 or AMX, where the default recipe trains ~1.7x
    faster at the same quality per step, docs/performance.md), float16 on a CUDA GPU without it
    (T4, V100: its tensor cores multiply float16, and the gradient scaler guards its range) unless
    `sharded` (train.parallel=fsdp, whose scaler would see one shard), and float32 elsewhere."""
    if name == "auto":
        if native_bf16(device):
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" and not sharded else torch.float32
    return DTYPES[name]


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 in hardware: a CUDA GPU from Ampere on (not one that
    only emulates it, which torch.cuda.is_bf16_supported() counts by default), or a CPU with
    AVX512-BF16 or AMX (cpu_has_native_bf16)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and cpu_has_native_bf16()


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
    """The datasheet's dense bf16 FLOP/s of a known GPU (PEAK_BF16_FLOPS), for MFU; None for a
    CPU and for any GPU not in the table (unknown device: no MFU rather than a wrong one)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if re.search(r"\bMIG\b", name):  # a slice of the GPU, whose share of the peak is not known here
        return None
    return next((flops for pattern, flops in PEAK_BF16_FLOPS if re.search(pattern, name)), None)


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
    does the rest), and the caller's setting back after it.

    PyTorch keeps TF32 twice, in the legacy flags (allow_tf32, set_float32_matmul_precision) and
    in the per-backend fp32_precision, and a legacy read raises once the two disagree (a caller who
    set only the new API). So this reads the new one, which never raises, and writes through
    set_float32_matmul_precision, which sets both alike: the compiler's legacy reads inside the
    block agree. Already TF32 (by either API): nothing to do. cuDNN's TF32 (convolutions, RNNs)
    is on by default and a transformer has neither, so it is left as the caller has it.
    """
    cuda, onednn = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    if device.type != "cuda" or cuda.fp32_precision == "tf32":
        yield
        return
    before = cuda.fp32_precision, onednn.fp32_precision  # "high" also sets oneDNN's matmuls
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision("highest")  # TF32 was off: the legacy flags can only say so as highest
        cuda.fp32_precision, onednn.fp32_precision = before


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


def give_back_freed_memory() -> None:
    """Hand freed pages back to the OS (glibc's malloc_trim): after BPE training or tokenizing, and
    after a weights file's merged copy is written.

    Without it they stay with the process: forked workers start with them, and a training that
    follows keeps them resident for its whole run (scripts/train.py even turns trimming off, for
    speed), so a big corpus would cost memory long after it was prepared. A no-op elsewhere."""
    malloc_trim = getattr(libc(), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)


def libc() -> ctypes.CDLL | None:
    """The C library's functions as this process has them (Python itself links the C library), or
    None where ctypes cannot open the process (Windows). glibc's own functions (malloc_trim,
    mallopt, prctl) are missing elsewhere: look them up with getattr(libc(), name, None)."""
    try:
        return ctypes.CDLL(None)
    except (OSError, TypeError):
        return None


def host_rng_state(device: torch.device | None = None) -> dict:
    """The RNGs shared by all ranks (python, numpy, and the CUDA generator of `device`, the GPU this
    rank trains on: every rank seeds its own alike and draws from it alike); per-rank ones are saved
    beside them. One GPU's state, not every visible GPU's, so that a checkpoint resumes on
    any number of GPUs. Not on a GPU: no CUDA state ([])."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]),
        "cuda": torch.cuda.get_rng_state(device) if _on_cuda(device) else [],
    }


@contextlib.contextmanager
def kept_rng_state():
    """Run a block, then put every RNG (torch CPU and CUDA, python, numpy) back as it was."""
    host, cpu = host_rng_state(), torch.get_rng_state()
    gpus = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []  # the same process: the same GPUs
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        set_host_rng_state(host)
        if gpus:
            torch.cuda.set_rng_state_all(gpus)


def set_host_rng_state(s: dict, device: torch.device | None = None, log=print) -> None:
    """host_rng_state's RNGs back; its CUDA state onto `device`, the GPU this rank trains on. A
    checkpoint written before holds every visible GPU's state: this device's index is taken, and
    where it has none, the stream starts afresh with one warning line."""
    random.setstate(s["python"])
    np.random.set_state((s["numpy"][0], s["numpy"][1].numpy(), *s["numpy"][2:]))
    state = s["cuda"]
    if not _on_cuda(device) or (isinstance(state, list) and not state):
        return
    if isinstance(state, list):  # one state per GPU that the saving process saw
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(state):
            log(
                f"warning: the checkpoint holds the CUDA random state of {len(state)} GPUs, none for "
                f"cuda:{index}; its dropout draws start afresh, so this resume is not bit-exact"
            )
            return
        state = state[index]
    torch.cuda.set_rng_state(state, device)


def _on_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda" and torch.cuda.is_available()


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


# Dense (no 2:4 sparsity) 16-bit tensor-core peaks by torch.cuda.get_device_name, first match
# wins, from NVIDIA's datasheets (their headline numbers are with sparsity: half of them):
# H100 and H100 NVL, H200 and H200 NVL, A100, L4, T4 and V100 product datasheets; the Ampere
# GA102 (RTX 3090) and Ada (RTX 4090) architecture whitepapers (bf16 with fp32 accumulate).
# NVIDIA publishes none for AWS's A10G: its figure is the one AWS-based comparisons quote
# (baseten.co, "NVIDIA A10 vs A10G"). T4 and V100 have no bf16: their fp16 peak, which
# train.dtype=auto trains them in. A name not here, and a variant such as an RTX 3090 Ti or a
# GH200, gets None: no MFU rather than another chip's.
PEAK_BF16_FLOPS = (
    (r"\bH100 PCIe\b", 756e12),
    (r"\bH100 NVL\b", 835e12),
    (r"\bH100 (SXM|80GB HBM3\b)", 989e12),
    (r"\bH200 NVL\b", 835e12),
    (r"\bH200( SXM)?( \d+GB( HBM3e)?)?$", 989e12),
    (r"\bA100\b", 312e12),  # SXM4 and PCIe alike
    (r"\bL4$", 121e12),
    (r"\bA10G$", 70e12),
    (r"\bT4$", 65e12),
    (r"\bV100-SXM2\b", 125e12),
    (r"\bV100-PCIE\b", 112e12),
    (r"\bRTX 4090$", 165e12),
    (r"\bRTX 3090$", 71e12),
)
