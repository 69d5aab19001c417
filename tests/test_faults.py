"""What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
settings, corrupt files and library misuse. Each gives the right behaviour or one clear line."""

import os
import select
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import minitf
import minitf.system.files
from minitf.budget import budget_steps
from minitf.config import load_config
from minitf.errors import ConfigError, MinitfError, first_line
from minitf.optim import lr_at
from minitf.training import checkpoint as ckpt
from minitf.training.metrics import METRICS, read_rows

from .helpers import ROOT, default_sigint, tiny_config, tiny_train_args, two_at_a_time

QUIET = dict(log=lambda *a: None)


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


def script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def same_weights(a, b):
    wa, wb = load_file(a), load_file(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------ resume means "continue this run"


def test_resume_needs_only_the_run_directory(tmp_path, corpus):
    run = tmp_path / "run"
    assert script(*tiny_args(run, corpus, "train.max_steps=4")).returncode == 0
    r = script("scripts/train.py", "--resume", f"run.out_dir={run}", "train.max_steps=8")
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"resuming {run} at step 4" in r.stdout
    assert "resume: train.max_steps 4 -> 8" in r.stdout
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8
    assert load_config(run / "config.yaml").train.max_steps == 8  # config.yaml states what produced the weights
    assert load_config(run / "config.yaml").data.source == f"file:{corpus}"


def test_resume_refuses_to_switch_the_corpus_or_the_model(tmp_path, corpus):
    run = tmp_path / "run"
    assert script(*tiny_args(run, corpus, "train.max_steps=4")).returncode == 0
    r = script("scripts/train.py", "--resume", f"run.out_dir={run}", "data.source=shakespeare", "model.n_layer=3")
    assert r.returncode == 2
    assert r.stderr.startswith(
        "error: --resume cannot change data.source, model.n_layer (the run was trained with "
        f"data.source='file:{corpus}', model.n_layer=2)"
    )
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_longer_budget_continues_on_the_new_schedule(tmp_path, corpus):
    logs = []
    short = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    minitf.train(tiny_config(short, corpus, "train.max_steps=8"), resume=True, log=logs.append)
    assert any("the LR follows the schedule of the new budget" in line for line in logs)
    straight = minitf.train(tiny_config(tmp_path / "straight", corpus), **QUIET)  # 8 steps planned from the start
    lrs = lambda run: [r["lr"] for r in read_rows(run / METRICS)]
    tc = load_config(short / "config.yaml").train
    assert lrs(short)[-1] == lrs(straight)[-1] == pytest.approx(lr_at(7, 7 / 8, tc, budget_steps(tc)))
    # the first 4 steps ran on the 4-step schedule
    assert lrs(short)[0] == pytest.approx(lr_at(3, 3 / 4, tc, budget_steps(tc)))


def test_the_library_resumes_from_the_run_directory_alone(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    minitf.train(run, resume=True, overrides=["train.max_steps=6"], **QUIET)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 6


def test_resuming_a_finished_run_does_not_step(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    before = (run / "state.pt").read_bytes()
    logs = []
    minitf.train(tiny_config(run, corpus, "train.max_steps=4"), resume=True, log=logs.append)
    assert any("already finished (step 4 of train.max_steps=4" in line for line in logs)
    assert (run / "state.pt").read_bytes() == before


# ------------------------------------------------------------------ signals: finish the step, save, exit 0


EVAL_EVERY = 20  # a long run's evaluations: the first one's line says the loop is running


def _start_long_run(run, corpus):
    proc = subprocess.Popen(
        [
            sys.executable,
            *tiny_args(
                run, corpus, "train.max_steps=100000", "train.ckpt_every=1000", f"train.eval_every={EVAL_EVERY}"
            ),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    # wait for the first evaluation's line: the loop, and its signal handlers, are running (the
    # progress line in a pipe comes only after 10 s)
    out, deadline = b"", time.time() + 120
    while f"step {EVAL_EVERY}:".encode() not in out:
        assert time.time() < deadline and proc.poll() is None, out[-500:]
        if select.select([proc.stdout], [], [], 0.5)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGUSR1"])
def test_stop_signals_save_and_exit_0_and_the_run_is_locked_meanwhile(tmp_path, corpus, sig):
    run = tmp_path / "run"
    proc = _start_long_run(run, corpus)
    second = script(*tiny_args(run, corpus, "train.max_steps=8"))
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f"error: {run} is in use by pid {proc.pid}; wait for that training to end or choose another run.out_dir"
    )
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-1500:]
    assert f"received {sig}: finishing this step, saving a checkpoint" in out
    assert f"(interrupted by {sig})" in out
    step = torch.load(run / "state.pt", weights_only=True)["step"]
    assert step > 0 and ckpt.weights_step(run / "model.safetensors") == step
    # the stop evaluates, unless the step before it was an evaluation step
    assert read_rows(run / METRICS)[-1]["step"] == (step - 1 if (step - 1) % EVAL_EVERY == 0 else step)


@pytest.mark.slow
def test_a_second_signal_aborts(tmp_path, corpus):
    proc = _start_long_run(tmp_path / "run", corpus)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two presses; sent together, Python would run the handler once for both
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    # a tiny run may finish its last step within the 0.1 s: the second signal then lands while the
    # interpreter shuts down, where Python has put SIGINT's default action back and the process
    # dies of it (-2, which a shell reports as 130, as for the 'interrupted' exit)
    assert ("interrupted" in err and proc.returncode == 130) or proc.returncode == -signal.SIGINT, (
        proc.returncode,
        err[-500:],
    )


# ------------------------------------------------------------------ one consistent checkpoint

KILL_AFTER_WRITES = """
import os, sys
import minitf, minitf.training.checkpoint, minitf.plots.figures
from tests.helpers import tiny_config

limit, count = int(sys.argv[3]), 0
real = minitf.system.files.atomic_write

def write_then_maybe_die(path, write):
    global count
    real(path, write)
    count += 1
    if count == limit:
        os._exit(9)  # as a kill -9 right after this file was moved into place

minitf.training.checkpoint.atomic_write = minitf.plots.figures.atomic_write = write_then_maybe_die
minitf.train(tiny_config(sys.argv[1], sys.argv[2]), log=lambda *a: None)
"""


@pytest.mark.slow
def test_a_kill_between_any_two_writes_resumes_bit_identically(tmp_path, corpus):
    # the writes of an 8-step run, checkpoints at 4 and 8: config.yaml, tokenizer.json, then per
    # checkpoint loss.png, best.safetensors, state.pt (the commit), model.safetensors
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    straight = minitf.train(tiny_config(tmp_path / "straight", corpus), **QUIET)

    def killed_after(n):
        return subprocess.run(
            [sys.executable, "-c", KILL_AFTER_WRITES, str(tmp_path / f"killed-after-{n}"), str(corpus), str(n)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for n, r in enumerate(two_at_a_time(killed_after, range(1, 11)), 1):
        run = tmp_path / f"killed-after-{n}"
        assert r.returncode == 9, r.stderr[-1500:]
        if not (run / "state.pt").is_file():  # killed before the first commit: nothing to resume, said clearly
            with pytest.raises(MinitfError, match="cannot be resumed|no checkpoint to resume"):
                minitf.train(tiny_config(run, corpus), resume=True, **QUIET)
            continue
        minitf.train(tiny_config(run, corpus), resume=True, **QUIET)
        assert same_weights(run / "model.safetensors", straight / "model.safetensors"), n
        assert [m["step"] for m in read_rows(run / METRICS)] == [4, 8], n


def test_a_stale_weights_file_is_repaired_from_the_commit(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus), **QUIET)
    (run / "model.safetensors").unlink()
    logs = []
    minitf.train(tiny_config(run, corpus), resume=True, log=logs.append)
    assert any("repairing" in line for line in logs)
    assert ckpt.weights_step(run / "model.safetensors") == 8
    minitf.load_run(run)


def test_no_checkpoint_after_non_finite_steps(tmp_path, corpus):
    with pytest.raises(MinitfError, match="no checkpoint was written in .*Lower train.lr"):
        minitf.train(
            tiny_config(tmp_path / "run", corpus, "train.lr=1e9", "train.min_lr=0", "train.max_steps=20"), **QUIET
        )
    assert not (tmp_path / "run" / "state.pt").exists() and not (tmp_path / "run" / "model.safetensors").exists()


def test_a_fresh_run_never_overwrites_weights(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    (run / "state.pt").unlink()
    with pytest.raises(MinitfError, match="already holds a run; .*model.safetensors, best.safetensors"):
        minitf.train(tiny_config(run, corpus), **QUIET)
    with pytest.raises(MinitfError, match="has weights but no training state"):
        minitf.train(tiny_config(run, corpus), resume=True, **QUIET)


# ------------------------------------------------------------------ write failures


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        OSError(30, "Read-only file system"),
        RuntimeError("PytorchStreamWriter failed writing file data/0"),
        SafetensorError("Error while serializing: IoError"),
    ],
)
def test_a_failed_write_is_one_line_and_leaves_nothing(tmp_path, error):
    def fail(tmp):
        tmp.write_bytes(b"half")
        raise error

    with pytest.raises(MinitfError, match=r"could not write .*new.bin: .+; nothing was written there$"):
        minitf.system.files.atomic_write(tmp_path / "new.bin", fail)
    (tmp_path / "old.bin").write_bytes(b"complete")
    with pytest.raises(MinitfError, match="the previous file there is intact"):
        minitf.system.files.atomic_write(tmp_path / "old.bin", fail)
    assert (tmp_path / "old.bin").read_bytes() == b"complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.bin"]


def test_a_full_disk_during_training_keeps_the_checkpoint(tmp_path, corpus, monkeypatch):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    before = (run / "state.pt").read_bytes()
    real_save = torch.save

    def full(obj, f, *a, **kw):
        real_save(obj, f, *a, **kw)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 64")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(
        MinitfError, match=r"could not write .*state.pt: .*unexpected pos.*previous file there is intact"
    ):
        minitf.train(tiny_config(run, corpus, "train.max_steps=8"), resume=True, **QUIET)
    assert (run / "state.pt").read_bytes() == before
    assert not list(run.glob(".*.tmp"))


def test_files_follow_the_umask(tmp_path, corpus):
    old = os.umask(0o027)
    try:
        run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    finally:
        os.umask(old)
    for name in ("model.safetensors", "best.safetensors", "state.pt", "config.yaml", "tokenizer.json", "loss.png"):
        assert (run / name).stat().st_mode & 0o777 == 0o640, name


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=.inf", "train.lr must be a finite number, got inf"),
        ("train.weight_decay=nan", "train.weight_decay must be a finite number"),
        ("model.rope_base=inf", "model.rope_base must be a finite number"),
        ("train.max_seconds=.nan", "train.max_seconds must be a finite number"),
        ("model.dropout=nan", "model.dropout must be a finite number"),
        ("train.beta2=nan", "train.beta2 must be a finite number"),
        ("sample.temperature=nan", "sample.temperature must be a finite number"),
        ("sample.top_p=nan", "sample.top_p must be a finite number"),
        ("sample.repetition_penalty=inf", "sample.repetition_penalty must be a finite number"),
    ],
)
def test_non_finite_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ROOT / "configs" / "tiny.yaml", [override])


def test_yaml_files_that_are_not_configs(tmp_path):
    cases = {
        "list.yaml": ("- 1\n- 2\n", "must hold a mapping of sections"),
        "binary.yaml": (b"\x89PNG\r\n\x1a\n\xff\xfe", "is not UTF-8 text"),
        "twice.yaml": ("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n", "the key 'lr' appears twice in one section"),
    }
    for name, (body, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    assert load_config({"model": {"n_layer": 3}}, ["train.lr=0.01"]).model.n_layer == 3


def test_a_tiny_temperature_samples_the_likeliest_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    for temperature in (1e-45, 1e-30, 1e-8):
        assert minitf.sample_next_token(logits, temperature, top_k=None).tolist() == [1]


# ------------------------------------------------------------------ no tracebacks in the scripts


def test_generate_script_mistakes_are_one_line(tiny_run):
    cases = [
        (["--num-samples", "0"], "--num-samples must be at least 1, got 0"),
        (["--device", "bogus"], "--device 'bogus' is not one of auto, cpu, cuda, cuda:N, mps"),
        (["--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")], "the prompt is not valid UTF-8"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda but "))
    for args, message in cases:
        r = script("scripts/generate.py", "--run", str(tiny_run), "--max-new-tokens", "3", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().startswith("error: ") and message in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_interactive_input_survives_a_line_that_is_not_utf8(tiny_run):
    r = subprocess.run(
        [
            sys.executable,
            "scripts/generate.py",
            "--run",
            str(tiny_run),
            "--interactive",
            "--max-new-tokens",
            "3",
            "--temperature",
            "0",
        ],
        input=b"ROMEO:\n\xff\xfe\nJULIET:\n",
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().strip().splitlines()[1:] == ["error: input line 2 is not valid UTF-8 (byte 0); skipped"]
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("ROMEO:") and any(line.startswith("JULIET:") for line in lines)


def test_damaged_run_directories_are_named(tmp_path, corpus, tiny_run):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(tiny_run, run)
    (run / "config.yaml").write_bytes(b"\x00\x01\xff binary")
    with pytest.raises(ConfigError, match="config.yaml is not UTF-8 text"):
        minitf.load_run(run)
    with pytest.raises(MinitfError, match="load_run takes the path of a run directory, got NoneType"):
        minitf.load_run(None)
    other = minitf.train(tiny_config(tmp_path / "other", corpus, "model.n_embd=64", "train.max_steps=4"), **QUIET)
    small = minitf.train(tiny_config(tmp_path / "small", corpus, "train.max_steps=4"), **QUIET)
    shutil.copy(other / "state.pt", small / "state.pt")  # another architecture's state
    with pytest.raises(MinitfError, match="state.pt holds a model of another shape"):
        minitf.train(tiny_config(small, corpus, "train.max_steps=8"), resume=True, **QUIET)


# ------------------------------------------------------------------ library semantics


def test_forward_refuses_ids_it_cannot_embed():
    m = minitf.Transformer(minitf.ModelConfig(vocab_size=100, block_size=8, n_layer=1, n_head=2, n_embd=16))
    ok = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"idx must be \(batch, time\) token ids, got shape \(3,\)"):
        m(ok[0])
    with pytest.raises(ValueError, match=r"idx holds ids outside 0..99 \(min -1"):
        m(torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match=r"idx holds ids outside 0..99 .*max 120"):
        m(torch.tensor([[1, 120]]))  # 120 < 128: a padding row, which would embed silently as zeros
    with pytest.raises(ValueError, match=r"targets holds ids outside 0..99 .*max 100"):
        m(ok, torch.tensor([[2, 3, 100]]))
    assert m(ok, torch.tensor([[2, -100, 4]]))[1].isfinite()  # -100: no loss here, as documented


def test_generate_samples_in_eval_mode_and_restores_the_callers_mode(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    model.config.dropout = 0.5
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    eval_text = minitf.generate(model.eval(), tok, "ROMEO:", max_new_tokens=20, seed=0)
    model.train()
    assert minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=0) == eval_text
    assert "".join(minitf.stream(model, tok, "ROMEO:", max_new_tokens=20, seed=0)) == eval_text
    assert model.training


def test_a_tokenizer_of_another_size_is_refused(tiny_run):
    model, _, _ = minitf.load_run(tiny_run)
    other = minitf.Tokenizer.train(["some other text entirely " * 50], vocab_size=280)
    with pytest.raises(
        MinitfError,
        match=f"the tokenizer has {other.vocab_size} tokens but the model was trained "
        f"with 300; use the tokenizer of the model's run",
    ):
        minitf.generate(model, other, "hello", max_new_tokens=3)


def test_another_librarys_error_fits_one_line():
    assert first_line(ValueError("  bad header\n  at byte 3\n")) == "bad header"
    assert first_line(RuntimeError("")) == "RuntimeError"  # no message: its type names it
    assert first_line(OSError("x" * 300), 160) == "x" * 160
