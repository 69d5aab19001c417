"""The CUDA branches of runtime, checked on a CPU: torch.cuda's functions are replaced by fakes
that behave as N GPUs would (the RNG states, bf16 support, the device's name), and the TF32
switches, which a CPU build keeps too, are read and written for a cuda device that is never
allocated on."""

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

import minitf
from minitf.cli import evaluate, explore, generate, serve
from minitf.config import TrainConfig
from minitf.optim import make_optimizer
from minitf.system import runtime
from minitf.training.setup import _dtype_words

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


class FakeGPUs:
    """torch.cuda's RNG functions as `n` visible GPUs answer them: one generator state per GPU, and
    an IndexError for a GPU that is not there (as torch.cuda.default_generators[i] raises)."""

    def __init__(self, n: int):
        self.states = [torch.full((16,), 10 * i + 1, dtype=torch.uint8) for i in range(n)]

    def install(self, monkeypatch) -> "FakeGPUs":
        fakes = {
            "is_available": lambda: True,
            "device_count": lambda: len(self.states),
            "current_device": lambda: 0,
            "get_rng_state": lambda device="cuda": self.states[self._index(device)].clone(),
            "set_rng_state": self._set,
            "get_rng_state_all": lambda: [s.clone() for s in self.states],
            "set_rng_state_all": lambda states: [self._set(s, i) for i, s in enumerate(states)],
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        return self

    def _set(self, state, device="cuda"):
        i = self._index(device)
        if i >= len(self.states):
            raise IndexError("tuple index out of range")
        self.states[i] = state.clone()

    @staticmethod
    def _index(device) -> int:
        if isinstance(device, int):
            return device
        return torch.device(device).index or 0


def test_a_checkpoint_from_two_gpus_resumes_on_one(monkeypatch):
    """A single process saved on a 2-GPU machine (training on cuda:0) resumes on a 1-GPU one
    (it raised IndexError: tuple index out of range), with cuda:0's stream where it was."""
    saved_on = FakeGPUs(2).install(monkeypatch)
    saved_on.states[0] = torch.full((16,), 7, dtype=torch.uint8)  # cuda:0 after some dropout
    state = runtime.host_rng_state(CUDA0)
    resumed_on, lines = FakeGPUs(1).install(monkeypatch), []
    runtime.set_host_rng_state(state, CUDA0, lines.append)
    assert torch.equal(resumed_on.states[0], torch.full((16,), 7, dtype=torch.uint8))
    assert lines == []


def test_each_rank_saves_and_restores_its_own_gpu(monkeypatch):
    gpus = FakeGPUs(2).install(monkeypatch)
    state = runtime.host_rng_state(CUDA1)  # rank 1 trains on cuda:1
    assert torch.equal(state["cuda"], gpus.states[1])
    gpus.states[1] = torch.zeros(16, dtype=torch.uint8)
    runtime.set_host_rng_state(state, CUDA1)
    assert torch.equal(gpus.states[1], state["cuda"]) and torch.equal(gpus.states[0], state["cuda"] - 10)


def test_an_old_checkpoint_with_every_gpus_state_still_resumes(monkeypatch):
    """A checkpoint written before (one state per visible GPU): this rank's GPU's state is taken;
    where it has none, one warning line, and the stream starts afresh."""
    old = runtime.host_rng_state() | {
        "cuda": [torch.full((16,), 5, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]
    }
    one = FakeGPUs(1).install(monkeypatch)
    runtime.set_host_rng_state(old, CUDA0, print)
    assert torch.equal(one.states[0], old["cuda"][0])
    three, lines = FakeGPUs(3).install(monkeypatch), []
    runtime.set_host_rng_state(old, torch.device("cuda", 2), lines.append)
    assert torch.equal(three.states[2], torch.full((16,), 21, dtype=torch.uint8))  # untouched
    assert lines == [
        "warning: the checkpoint holds the CUDA random state of 2 GPUs, none for cuda:2; its dropout draws "
        "start afresh, so this resume is not bit-exact"
    ]


def test_a_cuda_state_is_skipped_on_a_cpu(monkeypatch):
    FakeGPUs(1).install(monkeypatch)
    state = runtime.host_rng_state(CUDA0)
    assert runtime.host_rng_state(torch.device("cpu"))["cuda"] == []  # a CPU run saves none, as before
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a, **k: pytest.fail("set on a CPU run"))
    runtime.set_host_rng_state(state, torch.device("cpu"))


def test_kept_rng_state_puts_every_gpu_back(monkeypatch):
    gpus = FakeGPUs(2).install(monkeypatch)
    before = [s.clone() for s in gpus.states]
    with runtime.kept_rng_state():
        gpus.states = [torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8)]
        random.random(), np.random.rand()
    assert all(torch.equal(a, b) for a, b in zip(gpus.states, before))


# ---------------------------------------------------------------- TF32


def _tf32_readings() -> dict:
    """What a caller reads through each API: a value, or "raises"."""
    reads = {
        "matmul.fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
        "mkldnn.matmul.fp32_precision": lambda: torch.backends.mkldnn.matmul.fp32_precision,
        "matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
    }
    out = {}
    for name, read in reads.items():
        try:
            out[name] = read()
        except RuntimeError:
            out[name] = "raises"
    return out


@pytest.fixture
def default_tf32():
    """Every test here starts from, and leaves, torch's own TF32 settings."""
    yield
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"


CALLERS = {
    "nothing": lambda: None,
    "new API, tf32": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),
    "new API, ieee": lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "ieee"),
    "legacy flag, on": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
    "legacy flag, off": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", False),
    "set_float32_matmul_precision high": lambda: torch.set_float32_matmul_precision("high"),
    "oneDNN bf16 by the new API": lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),
}


@pytest.mark.parametrize("caller", CALLERS)
def test_tf32_matmuls_never_mixes_the_apis(caller, default_tf32):
    """Whichever API the caller set TF32 with (PyTorch raises "mix of the legacy and new APIs" on a
    legacy read after the new one), the block runs TF32 matmuls that both APIs read, and the
    caller's setting is back after it."""
    CALLERS[caller]()
    before = _tf32_readings()
    with runtime.tf32_matmuls(torch.device("cuda")):
        inside = _tf32_readings()
    assert inside["matmul.fp32_precision"] == "tf32"
    if before["matmul.allow_tf32"] != "raises":  # the caller's legacy reads work, and agree, inside too
        assert inside["matmul.allow_tf32"] is True
        assert inside["float32_matmul_precision"] in ("high", "medium")
    assert _tf32_readings() == before


def test_tf32_matmuls_leaves_a_cpu_alone(default_tf32):
    before = _tf32_readings()
    with runtime.tf32_matmuls(torch.device("cpu")):
        assert _tf32_readings() == before


# ---------------------------------------------------------------- bf16 where the GPU has it


@pytest.fixture
def emulating_gpu(monkeypatch):
    """A GPU that emulates bf16 (T4, V100): supported only counting emulation."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)


def test_auto_dtype_is_float16_on_a_gpu_that_only_emulates_bf16(emulating_gpu):
    assert runtime.resolve_dtype("auto", CUDA0) == torch.float16
    assert not runtime.native_bf16(CUDA0)
    assert runtime.resolve_dtype("bfloat16", CUDA0) == torch.bfloat16  # asked for: as asked
    assert runtime.resolve_dtype("auto", CUDA0, sharded=True) == torch.float32  # fsdp: no float16 scaler


def test_auto_dtype_is_bfloat16_on_a_gpu_that_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert runtime.resolve_dtype("auto", CUDA0) == torch.bfloat16 and runtime.native_bf16(CUDA0)


def test_auto_dtype_on_a_cpu_is_unchanged(monkeypatch):
    for native, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        assert runtime.resolve_dtype("auto", torch.device("cpu")) == dtype
    assert runtime.resolve_dtype("auto", torch.device("mps")) == torch.float32


def _ns_dtype(device) -> str:
    model = minitf.Transformer(minitf.ModelConfig(vocab_size=32, n_layer=1, n_head=2, n_embd=8, block_size=8))
    return make_optimizer(model, TrainConfig(optimizer="muon"), device).named["muon"].param_groups[0]["ns_dtype"]


def test_newton_schulz_runs_in_float32_on_a_gpu_without_bf16(emulating_gpu):
    assert _ns_dtype(CUDA0) == "float32"


def test_newton_schulz_runs_in_bfloat16_on_a_gpu_with_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert _ns_dtype(CUDA0) == "bfloat16"


def test_the_startup_line_says_why_auto_chose_the_dtype():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert _dtype_words("auto", torch.float16, cuda) == "float16 (auto: no native bf16 on this GPU)"
    assert _dtype_words("auto", torch.bfloat16, cuda) == "bfloat16 (auto: native bf16 on this GPU)"
    assert _dtype_words("float16", torch.float16, cuda) == "float16"
    # a CPU's words, exactly as before
    assert _dtype_words("auto", torch.float32, cpu) == "float32 (auto: no native bf16 on this CPU)"
    assert _dtype_words("auto", torch.bfloat16, cpu) == "bfloat16 (auto: native bf16 on this CPU)"
    assert _dtype_words("auto", torch.float32, torch.device("mps")) == "float32"


def test_the_startup_line_says_when_bfloat16_asked_for_is_emulated_on_a_cpu(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert _dtype_words("bfloat16", torch.bfloat16, cpu) == (
        "bfloat16 (emulated on this CPU, which has no native bf16: float32, train.dtype=auto, is faster)"
    )
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert _dtype_words("bfloat16", torch.bfloat16, cpu) == "bfloat16"


# ---------------------------------------------------------------- torchrun's process group


def _torchrun(monkeypatch, local_rank: int) -> list:
    """torchrun's environment for rank `local_rank` of 2, with no group yet; the calls that follow."""
    calls = []
    for name, value in (("RANK", local_rank), ("WORLD_SIZE", 2), ("LOCAL_RANK", local_rank)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init_process_group", kw)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    return calls


def test_each_rank_sets_its_gpu_before_the_process_group(monkeypatch):
    calls = _torchrun(monkeypatch, local_rank=1)
    procs = runtime.setup_distributed("cuda")
    assert (procs.rank, procs.world, procs.local_rank) == (1, 2, 1)
    assert calls == [("set_device", CUDA1), ("init_process_group", {"backend": "nccl", "device_id": CUDA1})]


def test_the_cpu_process_group_is_unchanged(monkeypatch):
    calls = _torchrun(monkeypatch, local_rank=1)
    runtime.setup_distributed("cpu")
    assert calls == [("init_process_group", {"backend": "gloo"})]


# ---------------------------------------------------------------- MFU's peak


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-PCIE-40GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A10G", 70e12),
        ("Tesla T4", 65e12),
        ("Tesla V100-SXM2-16GB", 125e12),
        ("Tesla V100-PCIE-32GB", 112e12),
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("NVIDIA GeForce RTX 3090", 71e12),
        # unknown: no MFU rather than another chip's peak
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GeForce RTX 3090 Ti", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA L40S", None),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),
        ("NVIDIA B200", None),
    ],
)
def test_peak_flops_by_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert runtime.peak_flops(CUDA0) == peak


def test_no_peak_on_a_cpu():
    assert runtime.peak_flops(torch.device("cpu")) is None


# ---------------------------------------------------------------- the commands' --device


@pytest.mark.parametrize("command", [generate, serve, explore, evaluate])
def test_commands_default_to_the_auto_device(command, capsys):
    with pytest.raises(SystemExit):
        command.main(["--help"])
    assert "(default: auto)" in " ".join(capsys.readouterr().out.split())
    if command is generate:
        assert generate._parser(None).parse_args([]).device == "auto"
