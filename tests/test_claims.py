"""README claims and options that had no test, each checked against a value the code does not
compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set."""

import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.cli.common import newest_run
from minitf.config import TrainConfig
from minitf.optim import make_optimizer
from minitf.positions import Rotary
from minitf.run_dir import which_weights
from minitf.system import runtime
from minitf.trainer import forward_backward
from minitf.training import checkpoint as ckpt
from minitf.training.metrics import METRICS, read_rows

from .helpers import ROOT, make_play, step_session, tiny_config, two_at_a_time

QUIET = dict(log=lambda *a: None)


def script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


# ------------------------------------------------------------------ rotary against its formula


def test_rotary_equals_the_explicit_rotation_of_each_pair():
    D, base = 8, 500.0
    rope = Rotary(32, D, base=base)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    y = rope(x, offset=3)
    for t in range(5):
        pos = 3 + t
        for i in range(D // 2):  # rotate-half layout: dimension i pairs with i + D/2
            theta = pos * base ** (-2 * i / D)
            a, b = x[:, t, i], x[:, t, i + D // 2]
            torch.testing.assert_close(y[:, t, i], a * math.cos(theta) - b * math.sin(theta))
            torch.testing.assert_close(y[:, t, i + D // 2], a * math.sin(theta) + b * math.cos(theta))


def test_rope_base_reaches_the_model():
    cfg = dict(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, positions="rope")
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))

    def logits(base):
        torch.manual_seed(0)
        m = minitf.Transformer(minitf.ModelConfig(**cfg, rope_base=base))
        with torch.no_grad():  # weights larger than the init's, so attention is far from uniform
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        return m(idx)[0]

    assert (logits(10000.0) - logits(100.0)).abs().max() > 1e-2


# ------------------------------------------------------------------ the training step


def _model_and_batch(seed=0):
    torch.manual_seed(seed)
    model = minitf.Transformer(minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32))
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def _step_grads(tc: TrainConfig, x, y):
    model = _model_and_batch()[0]
    halves = iter(
        [
            (
                x[i * 4 // tc.grad_accum : (i + 1) * 4 // tc.grad_accum],
                y[i * 4 // tc.grad_accum : (i + 1) * 4 // tc.grad_accum],
            )
            for i in range(tc.grad_accum)
        ]
    )
    _, norm = forward_backward(step_session(model, halves, make_optimizer(model, tc, torch.device("cpu")), tc))
    return {n: p.grad.clone() for n, p in model.named_parameters()}, norm


def test_grad_accumulation_gives_the_full_batch_gradient_and_its_norm():
    model, x, y = _model_and_batch()
    model(x, y)[1].backward()  # plain autograd on all 4 sequences
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    global_norm = torch.sqrt(sum(g.double().square().sum() for g in plain.values())).item()
    grads, norm = _step_grads(TrainConfig(grad_accum=2, grad_clip=0.0), x, y)
    for n in plain:
        torch.testing.assert_close(grads[n], plain[n], atol=1e-6, rtol=1e-5)
    assert norm.item() == pytest.approx(global_norm, rel=1e-5)
    clipped, norm = _step_grads(TrainConfig(grad_accum=2, grad_clip=0.1), x, y)
    assert norm.item() == pytest.approx(global_norm, rel=1e-5)  # the norm before clipping is what is logged
    for n in plain:
        torch.testing.assert_close(clipped[n], plain[n] * (0.1 / global_norm), atol=1e-7, rtol=1e-4)


def test_betas_reach_the_optimizer():
    model = _model_and_batch()[0]
    opt = make_optimizer(model, TrainConfig(optimizer="adamw", beta1=0.8, beta2=0.99), torch.device("cpu"))
    assert {g["betas"] for g in opt.param_groups} == {(0.8, 0.99)}


# ------------------------------------------------------------------ a time budget, on a fake clock


def test_time_budget_stops_anneals_and_a_resume_does_not_step(tmp_path, corpus, monkeypatch):
    clock = iter(range(10**6))
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))  # one second per reading
    logs = []
    cfg = tiny_config(
        tmp_path / "run",
        corpus,
        "train.max_seconds=60",
        "train.max_steps=100000",
        "train.eval_every=100000",
        "train.ckpt_every=100000",
    )
    run = minitf.train(cfg, log=logs.append)
    assert any("(time budget)" in line for line in logs)
    last = read_rows(run / METRICS)[-1]
    tc = cfg.train
    assert tc.min_lr <= last["lr"] < tc.min_lr + 0.02 * (tc.lr - tc.min_lr)  # annealed to the end
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["elapsed"] >= 60
    logs.clear()
    minitf.train(cfg, resume=True, log=logs.append)
    assert any("already finished" in line for line in logs)
    assert torch.load(run / "state.pt", weights_only=True)["step"] == state["step"]


# ------------------------------------------------------------------ mixed precision on a CPU


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_and_resumes(tmp_path, corpus, monkeypatch, dtype):
    over = (f"train.dtype={dtype}",)
    run = minitf.train(tiny_config(tmp_path / "run", corpus, *over, "train.max_steps=4"), **QUIET)
    saved = torch.load(run / "state.pt", weights_only=True)["scaler"]
    loaded = []
    real = torch.amp.GradScaler.load_state_dict
    monkeypatch.setattr(torch.amp.GradScaler, "load_state_dict", lambda self, s: (loaded.append(s), real(self, s)))
    minitf.train(tiny_config(run, corpus, *over), resume=True, **QUIET)
    rows = read_rows(run / METRICS)
    assert [r["step"] for r in rows] == [4, 8]
    assert all(math.isfinite(r[k]) for r in rows for k in ("train_loss", "val_loss", "grad_norm"))
    assert loaded == [saved]
    if dtype == "float16":
        assert saved["scale"] > 0  # the grad scaler's scale is part of the checkpoint


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bf16_only_on_a_cpu_that_multiplies_it_natively(tmp_path, corpus, monkeypatch, native):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    assert runtime.resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert runtime.resolve_dtype("float32", torch.device("cpu")) == torch.float32
    logs = []
    minitf.train(tiny_config(tmp_path / "run", corpus, "train.dtype=auto", "train.max_steps=2"), log=logs.append)
    said = "bfloat16 (auto: native bf16 on this CPU)" if native else "float32 (auto: no native bf16 on this CPU)"
    assert any(f"| dtype {said} |" in line for line in logs)


# ------------------------------------------------------------------ sampling


def test_temperature_half_draws_follow_the_sharpened_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    draws = torch.cat(
        [minitf.sample_next_token(logits.expand(1000, 4), 0.5, top_k=None, generator=g) for _ in range(40)]
    )
    freq = torch.bincount(draws, minlength=4) / draws.numel()
    torch.testing.assert_close(freq, (logits[0] / 0.5).softmax(-1), atol=0.01, rtol=0)


def test_top_k_and_top_p_together_allow_the_set_worked_out_by_hand():
    # probabilities 0.5, 0.2, 0.15, 0.1, 0.05: top_k=4 keeps the first four (renormalised over 0.95:
    # 0.526, 0.211, 0.158, 0.105); top_p=0.7 then keeps the smallest prefix reaching 0.7:
    # 0.526 + 0.211 = 0.737, so tokens 0 and 1 only
    logits = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]).log()
    g = torch.Generator().manual_seed(0)
    seen = {minitf.sample_next_token(logits, 1.0, top_k=4, top_p=0.7, generator=g).item() for _ in range(400)}
    assert seen == {0, 1}


def test_repetition_penalty_changes_exactly_the_seen_tokens(monkeypatch):
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    captured = []
    real_argmax = torch.Tensor.argmax
    monkeypatch.setattr(
        torch.Tensor, "argmax", lambda self, *a, **k: (captured.append(self.clone()), real_argmax(self, *a, **k))[1]
    )
    minitf.sample_next_token(logits, 0, history=torch.tensor([[0, 1, 1]]), repetition_penalty=2.0)
    torch.testing.assert_close(captured[0], torch.tensor([[1.0, -2.0, 0.5, 3.0, -2.0]]))


def test_a_character_cut_across_tokens_streams_whole(monkeypatch, tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = tok.encode("a\U0001f389b") + [tok.eot_id, *tok.encode(" never")]
    assert len(ids) > 3  # the emoji's four bytes are spread over several byte-level tokens
    monkeypatch.setattr(
        sys.modules["minitf.generate"], "generate_tokens", lambda *a, **k: (torch.tensor([i]) for i in ids)
    )
    pieces = list(minitf.stream(model, tok, "x", max_new_tokens=len(ids)))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == "a\U0001f389b"  # and nothing after <|endoftext|>


# ------------------------------------------------------------------ checkpoints and run directories


def test_best_is_the_lowest_val_loss_and_generate_best_samples_it(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=12"), **QUIET)
    rows = read_rows(run / METRICS)
    assert ckpt.weights_step(run / "best.safetensors") == min(rows, key=lambda r: r["val_loss"])["step"]
    other = minitf.train(tiny_config(tmp_path / "other", corpus, "run.seed=7", "train.max_steps=4"), **QUIET)
    shutil.copy(other / "model.safetensors", run / "best.safetensors")  # best now holds other weights
    args = [
        "scripts/generate.py",
        "--run",
        str(run),
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        "--prompt",
        "ROMEO:",
    ]
    best, latest = two_at_a_time(lambda extra: script(*args, *extra), [["--best"], []])
    model, tok, _ = minitf.load_run(other)
    assert (
        best.stdout.strip()
        == ("ROMEO:" + minitf.generate(model, tok, "ROMEO:", max_new_tokens=12, temperature=0)).strip()
    )
    assert best.stdout != latest.stdout


def test_a_tokenizer_of_the_same_size_from_elsewhere_is_refused(tmp_path, corpus, tiny_run):
    run = tmp_path / "copy"
    shutil.copytree(tiny_run, run)
    other = minitf.Tokenizer.train([make_play(seed) for seed in range(10, 16)], vocab_size=300)
    assert other.vocab_size == 300 and other.hash != minitf.Tokenizer.load(run / "tokenizer.json").hash
    (run / "tokenizer.json").write_text(other.to_json())
    with pytest.raises(minitf.MinitfError, match="tokenizer.json is not the tokenizer this model was trained with"):
        minitf.load_run(run)


def test_newest_run_among_several(tmp_path, tiny_run):
    for i, name in enumerate(["b", "a", "c"]):
        shutil.copytree(tiny_run, tmp_path / name)
        os.utime(tmp_path / name / "model.safetensors", (1000 + i, 1000 + i))
    assert newest_run(tmp_path) == tmp_path / "c"
    os.utime(tmp_path / "a" / "model.safetensors", (5000, 5000))
    assert newest_run(tmp_path) == tmp_path / "a"


def test_train_leaves_the_callers_random_state_alone(tmp_path, corpus):
    import random

    import numpy as np

    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    expected = torch.rand(3), random.random(), np.random.rand()
    handler = signal.getsignal(signal.SIGINT)
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=4"), **QUIET)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert np.random.rand() == expected[2]
    assert signal.getsignal(signal.SIGINT) is handler  # the stop flag's handler is gone again


def test_run_name_names_the_directory_when_out_dir_is_not_set():
    cfg = minitf.load_config(None, ["run.name=novel"])
    assert cfg.run.out_dir == "runs/novel"
    assert minitf.load_config(None, ["run.name=novel", "run.out_dir=elsewhere"]).run.out_dir == "elsewhere"


# ------------------------------------------------------------------ options people touch


def test_compile_and_an_explicit_device_in_the_trainer(tmp_path, corpus):
    run = minitf.train(
        tiny_config(tmp_path / "run", corpus, "train.compile=true", "run.device=cpu", "train.max_steps=4"), **QUIET
    )
    keys = load_file(run / "model.safetensors").keys()
    assert keys and not any(k.startswith("_orig_mod.") for k in keys)  # the compiled wrapper is not saved
    assert not any(k.startswith("_orig_mod.") for k in torch.load(run / "state.pt", weights_only=True)["model"])
    minitf.load_run(run)


def test_sampling_settings_come_from_the_runs_config(tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    cfg = minitf.load_config(
        run / "config.yaml",
        [
            "sample.seed=5",
            "sample.top_p=0.9",
            "sample.top_k=0",
            "sample.repetition_penalty=1.3",
            "sample.max_new_tokens=15",
            "sample.prompt=JULIET:",
        ],
    )
    ckpt.write_config(run, cfg)
    model, tok, _ = minitf.load_run(run)
    expected = "JULIET:" + minitf.generate(model, tok, "JULIET:", cfg.sample)
    assert script("scripts/generate.py", "--run", str(run)).stdout.strip() == expected.strip()
    other = minitf.generate(model, tok, "JULIET:", cfg.sample, repetition_penalty=1.0)
    assert other != expected[len("JULIET:") :]  # the penalty is applied, not ignored


def test_generate_script_compile_stop_and_device(tiny_run):
    base = [
        "scripts/generate.py",
        "--run",
        str(tiny_run),
        "--temperature",
        "0",
        "--max-new-tokens",
        "40",
        "--prompt",
        "ROMEO:",
    ]
    plain, compiled = two_at_a_time(lambda extra: script(*base, extra), ["--device=cpu", "--compile"])
    assert plain.returncode == compiled.returncode == 0, compiled.stderr[-1500:]
    assert compiled.stdout == plain.stdout  # the compiled decode step gives the eager tokens
    text = plain.stdout[len("ROMEO:") :]
    stop = text.strip()[:2]
    cut = script(*base, "--stop", stop).stdout
    assert cut.rstrip("\n") == "ROMEO:" + text[: text.index(stop)]


def test_best_flags_of_attention_and_export(tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    model, tok, _ = minitf.load_run(run)
    with torch.no_grad():  # best.safetensors now holds other weights than model.safetensors
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ckpt.save_weights(model, run / "best.safetensors", 1, tok.hash)
    args = ["scripts/attention.py", "--run", str(run), "--text", "ROMEO: O", "--print", "--head", "1"]
    best, latest = two_at_a_time(lambda extra: script(*args, *extra), [["--best"], []])
    assert best.returncode == 0 and best.stdout.startswith("layer 0, head 1: attention weights")
    from minitf.inspection import format_weights

    assert best.stdout.strip() == format_weights(minitf.inspect(model, tok, "ROMEO: O"), 0, 1).strip()
    assert best.stdout != latest.stdout
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    r = script("scripts/export_hf.py", "--run", str(run), "--best", "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-1500:]
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    torch.testing.assert_close(exported["transformer.wte.weight"][:300], model.wte.weight.detach()[:300])


def test_run_main_handles_ctrl_c_and_a_closed_pipe(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(
        "import sys\nfrom minitf.cli.common import run_main\n"
        "def main():\n"
        "    if sys.argv[1] == 'int':\n        raise KeyboardInterrupt\n"
        "    for i in range(10**6):\n        print('line', i)\n"
        "run_main(main)\n"
    )
    r = script(str(prog), "int")
    assert r.returncode == 130 and r.stderr.strip() == "interrupted"
    p = subprocess.Popen(
        f"{sys.executable} {prog} pipe | head -n 2",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    out, err = p.communicate(timeout=60)
    assert out.splitlines() == ["line 0", "line 1"] and "Traceback" not in err and "Error" not in err


# ------------------------------------------------------------------ stronger versions of weak checks


def test_greedy_text_is_the_argmax_of_each_forward(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = tok.encode("ROMEO:")
    with torch.no_grad():
        for _ in range(15):  # the plain loop, no cache, no sampler
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    new = ids[len(tok.encode("ROMEO:")) :]
    new = new[: new.index(tok.eot_id)] if tok.eot_id in new else new
    assert minitf.generate(model, tok, "ROMEO:", max_new_tokens=15, temperature=0) == tok.decode(new)


def test_an_empty_prompt_continues_from_a_document_boundary(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    ids = [tok.eot_id]
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    new = ids[1:]
    new = new[: new.index(tok.eot_id)] if tok.eot_id in new else new
    assert minitf.generate(model, tok, "", max_new_tokens=20, temperature=0) == tok.decode(new)


def test_two_runs_are_drawn_as_their_own_curves(tmp_path, tiny_run, monkeypatch):
    import minitf.plots.figures as plotting

    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    rows = read_rows(other / METRICS)
    for r in rows:
        r["val_loss"] += 1.0  # another curve than the first run's
    (other / "metrics.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    plotting.plot_runs([tiny_run, other], tmp_path / "both.png")
    ax_loss, ax_bpb, ax_lr = figures[0].axes
    lines = {line.get_label(): line for line in ax_loss.get_lines()}
    assert set(lines) == {"tiny train", "tiny val", "other train", "other val"}
    assert list(lines["other val"].get_ydata()) == [r["val_loss"] for r in rows]
    assert list(lines["tiny val"].get_ydata()) == [r["val_loss"] for r in read_rows(tiny_run / METRICS)]
    assert [line.get_label() for line in ax_bpb.get_lines()] == ["tiny", "other"]
    assert [line.get_label() for line in ax_lr.get_lines()] == ["tiny", "other"]


def test_curves_against_seconds_and_a_single_evaluation(tmp_path, tiny_run, monkeypatch):
    import minitf.plots.figures as plotting

    one = tmp_path / "one"
    shutil.copytree(tiny_run, one)
    rows = read_rows(one / METRICS)[:1]
    (one / "metrics.jsonl").write_text(__import__("json").dumps(rows[0]) + "\n")
    (one / "steps.jsonl").unlink(missing_ok=True)
    figures = []
    monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: figures.append(fig) or path)
    plotting.plot_runs([one], tmp_path / "one.png", x="seconds")
    ax_loss, ax_bpb, ax_lr = figures[0].axes
    (bpb,) = ax_bpb.get_lines()
    assert list(bpb.get_xdata()) == [rows[0]["elapsed_s"]] and bpb.get_marker() == "o"  # a point, not nothing
    assert list(ax_lr.get_lines()[0].get_ydata()) == [rows[0]["lr"]]
    assert "seconds" in ax_bpb.get_xlabel()


def test_skipped_steps_are_not_applied(tmp_path, corpus, monkeypatch):
    real_forward = minitf.Transformer.forward
    calls = []

    def nan_on_steps_5_and_6(self, idx, targets=None, cache=None, logits=True):
        logits, loss = real_forward(self, idx, targets, cache, logits=logits)
        if targets is not None and self.training:
            calls.append(1)
            if len(calls) in (5, 6):
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(minitf.Transformer, "forward", nan_on_steps_5_and_6)
    logs = []
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_bad_steps=3"), log=logs.append)
    assert sum("step skipped" in line for line in logs) == 2
    # had a NaN gradient reached the weights, every later weight and loss would be NaN
    assert torch.load(run / "state.pt", weights_only=True)["step"] == 8
    assert all(torch.isfinite(t).all() for t in load_file(run / "model.safetensors").values())
    assert math.isfinite(read_rows(run / METRICS)[-1]["train_loss"])


def test_generate_script_says_what_it_loaded_and_reads_a_prompt_file(tmp_path, tiny_run):
    (tmp_path / "scene.txt").write_text("ROMEO:\nO night,\n", encoding="utf-8")
    r = script(
        "scripts/generate.py",
        "--run",
        str(tiny_run),
        "--prompt-file",
        str(tmp_path / "scene.txt"),
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
        "--best",
    )
    assert r.returncode == 0, r.stderr
    step = ckpt.weights_step(tiny_run / "best.safetensors")
    assert r.stderr.splitlines()[0] == f"[sampling from {tiny_run}: best.safetensors, step {step}]"
    model, tok, _ = minitf.load_run(tiny_run, best=True)
    assert (
        r.stdout
        == "ROMEO:\nO night,\n"
        + minitf.generate(model, tok, "ROMEO:\nO night,\n", max_new_tokens=8, temperature=0)
        + "\n"
    )
    r = script("scripts/generate.py", "--run", str(tiny_run), "--prompt-file", str(tmp_path / "none.txt"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: could not read --prompt-file {tmp_path / 'none.txt'}: No such file or directory"
    )


def test_the_tools_that_read_a_run_say_which_weights_and_that_best_exists(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    model, tok, _ = minitf.load_run(run)
    ckpt.save_weights(model, run / "best.safetensors", 3, tok.hash)  # the best, at another step
    latest = ckpt.weights_step(run / "model.safetensors")
    assert latest != 3
    r = script("scripts/generate.py", "--run", str(run), "--max-new-tokens", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        f"[sampling from {run}: model.safetensors, step {latest} (the latest; --best samples best.safetensors, "
        f"step 3, the lowest val loss)]"
    )
    assert which_weights(run, best=True, verb="serves") == "best.safetensors, step 3"
    shutil.copy(run / "model.safetensors", run / "best.safetensors")  # the latest are the best: no hint
    assert which_weights(run, best=False, verb="serves") == f"model.safetensors, step {latest}"


def test_export_gguf_says_which_weights_it_exported(tiny_run, tmp_path):
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[gguf]')")
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    model, tok, _ = minitf.load_run(run)
    ckpt.save_weights(model, run / "best.safetensors", 3, tok.hash)
    latest = ckpt.weights_step(run / "model.safetensors")
    r = script("scripts/export_gguf.py", "--run", str(run), "--out", str(tmp_path / "m.gguf"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"[exported {run}: model.safetensors, step {latest} (the latest; --best exports best.safetensors, "
        f"step 3, the lowest val loss)]"
    ]


# ------------------------------------------------------------------ evaluate a run on any text


def test_evaluate_predicts_every_token_once_with_the_models_own_loss(tiny_run, corpus):
    from minitf.evaluate import evaluate_text

    model, tok, cfg = minitf.load_run(tiny_run)
    res = evaluate_text(model, tok, cfg.data, batch_size=3, log=lambda *a: None)
    val_text = (corpus / "play3.txt").read_text()  # 4 documents, val_fraction 0.1: the last is val
    ids = tok.encode(val_text)
    block, total = cfg.model.block_size, 0.0
    for start in range(0, len(ids) - 1, block):  # the model's own mean loss, window by window
        w = torch.tensor([ids[start : start + block + 1]])
        total += model(w[:, :-1], w[:, 1:])[1].item() * (w.size(1) - 1)
    assert res["val"]["tokens"] == len(ids) - 1
    assert res["val"]["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)
    bytes_per_token = len(val_text.encode("utf-8")) / len(ids)  # counted from the file, not from the cache
    assert res["val"]["bits_per_byte"] == pytest.approx(res["val"]["loss"] / math.log(2) / bytes_per_token)
    assert res["val"]["perplexity"] == pytest.approx(math.exp(res["val"]["loss"]))
    assert res["all"]["tokens"] == res["train"]["tokens"] + res["val"]["tokens"]


def test_evaluate_script(tiny_run, corpus, tmp_path):
    (tmp_path / "other.txt").write_text("O Romeo, Romeo, wherefore art thou Romeo?\n" * 40)
    r = script("scripts/evaluate.py", "--run", str(tiny_run), "--data", f"file:{tmp_path / 'other.txt'}", "--best")
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"{tiny_run} (best weights) on file:{tmp_path / 'other.txt'}:" in r.stdout
    # a text the run never saw has no held-out split: one number, for all of it
    assert [line.split("  ")[1] for line in r.stdout.splitlines() if line.startswith("  ")] == ["the whole text"]
    r = script("scripts/evaluate.py", "--run", str(tiny_run), "--data", f"file:{tmp_path / 'none.txt'}")
    assert r.returncode == 2 and r.stderr.startswith("error: data.source=file:") and "Traceback" not in r.stderr


def test_evaluate_scores_the_held_out_split_unless_asked_for_the_train_split(tiny_run):
    r = script("scripts/evaluate.py", "--run", str(tiny_run))
    assert r.returncode == 0, r.stderr[-1500:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("  ")]  # after the data's own lines
    assert [line.split("  ")[1] for line in rows] == ["val (held out)"]
    model, tok, cfg = minitf.load_run(tiny_run)
    from minitf.evaluate import evaluate_text

    val = evaluate_text(model, tok, cfg.data, log=lambda *a: None, splits=("val",))["val"]
    assert f"{val['tokens']:,} tokens  loss {val['loss']:.4f}" in r.stdout
    r = script("scripts/evaluate.py", "--run", str(tiny_run), "--with-train")
    rows = [line.split("  ")[1] for line in r.stdout.splitlines() if line.startswith("  ")]
    assert rows == ["val (held out)", "train split", "both"]


def test_interactive_on_a_terminal_prompts_and_does_not_echo(tiny_run):
    import pty
    import select

    model, tok, _ = minitf.load_run(tiny_run)
    expected = minitf.generate(model, tok, "ROMEO:\nO", max_new_tokens=6, temperature=0)
    pid, fd = pty.fork()
    if pid == 0:  # the child: generate.py with a terminal for its standard input and output
        os.chdir(ROOT)
        os.execv(
            sys.executable,
            [
                sys.executable,
                "scripts/generate.py",
                "--run",
                str(tiny_run),
                "--interactive",
                "--temperature",
                "0",
                "--max-new-tokens",
                "6",
            ],
        )
    out = b""

    def read_until(done, seconds=90):
        nonlocal out
        deadline = time.time() + seconds
        while not done(out):
            assert time.time() < deadline, out
            if select.select([fd], [], [], 1.0)[0]:  # never block on a child that hangs
                out += os.read(fd, 4096)

    read_until(lambda o: o.endswith(b"> "))
    assert b"Ctrl-D quits" in out
    os.write(fd, b"ROMEO:\\\n")  # a backslash at the end: the prompt goes on
    read_until(lambda o: o.endswith(b". "))
    os.write(fd, b"O\n")
    read_until(lambda o: o.count(b"> ") == 2)
    os.write(fd, b"\x04")  # Ctrl-D
    _, status = os.waitpid(pid, 0)
    text = out.decode().replace("\r\n", "\n")
    answer = text.split(". O\n", 1)[1].rsplit("> ", 1)[0]
    assert answer == expected + "\n"  # the continuation only: what was typed is on the screen already
    assert os.waitstatus_to_exitcode(status) == 0
