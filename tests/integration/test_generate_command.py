"""minitf generate as a user runs it: defaults, options, and one-line errors for bad input. In this
process (tests.support.processes.command) unless the test needs a process: a terminal, the compiler."""

import os
import shutil
import sys
import time

import pytest
import torch

import minitf
import minitf.system.files
from minitf.generate import stream_tokens
from minitf.run_dir import which_weights
from minitf.training import checkpoint as ckpt
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.processes import command, script, two_at_a_time
from tests.support.runs import QUIET, refusal, run_copy, tiny_config


def gen(*args, cwd=ROOT, stdin=b""):
    return command("generate", *args, cwd=cwd, stdin=stdin)


def test_token_counts_are_the_sampled_tokens(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    for settings in (dict(temperature=0), dict(temperature=1.0, top_k=None, seed=3)):
        drawn = len(list(stream_tokens(model, tok, "ROMEO:", max_new_tokens=40, **settings)))
        info = {}
        text = minitf.generate(model, tok, "ROMEO:", max_new_tokens=40, info=info, **settings)
        assert info["tokens"] == [drawn] and 0 < drawn <= 40
        assert "".join(minitf.stream(model, tok, "ROMEO:", max_new_tokens=40, info=info, **settings)) == text
        assert info["tokens"] == [drawn]
    info = {}
    minitf.generate(model, tok, "ROMEO:", max_new_tokens=7, num_samples=3, seed=0, info=info)
    assert len(info["tokens"]) == 3 and all(0 < n <= 7 for n in info["tokens"])
    r = gen("--run", str(tiny_run), "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "40", "--verbose")
    drawn = len(list(stream_tokens(model, tok, "ROMEO:", max_new_tokens=40, temperature=0)))
    assert r.returncode == 0 and f"[{drawn} tokens in " in r.stderr, r.stderr


def test_script_defaults_to_newest_run(tiny_run, tmp_path):
    shutil.copytree(tiny_run, tmp_path / "runs" / "tiny")
    r = gen("--max-new-tokens", "20", "--seed", "0", "--verbose", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prompt = minitf.load_run(tiny_run)[2].sample.prompt  # a line of the run's own text (not Shakespeare's default)
    assert prompt != "Romeo.\n" and r.stdout.startswith(prompt) and "tokens/s" in r.stderr
    r = gen("--run", str(tiny_run), "--prompt", "JULIET:", "--stream", "--temperature", "0", "--max-new-tokens", "15")
    assert r.returncode == 0 and r.stdout.startswith("JULIET:")
    r = gen(
        "--run", str(tiny_run), "--interactive", "--max-new-tokens", "5", "--temperature", "0", stdin="ROMEO:\nNURSE:\n"
    )
    assert r.returncode == 0 and "ROMEO:" in r.stdout and "NURSE:" in r.stdout
    r = gen("--run", str(tiny_run), "--num-samples", "2", "--max-new-tokens", "5", "--best")
    assert r.returncode == 0 and r.stdout.count("sample ") == 2


def test_prompt_input_is_bounded(tiny_run, tmp_path):
    """--prompt-file reads at most 1 MB (so /dev/zero no longer reads for ever) and a piped line
    for --interactive too; a file within the bound is the prompt, as --prompt gives it."""
    from minitf.cli.common import MAX_PROMPT_BYTES

    prompt = tmp_path / "scene.txt"
    prompt.write_text("ROMEO:\nO gentle", encoding="utf-8")
    same = ["--run", str(tiny_run), "--temperature", "0", "--max-new-tokens", "10"]
    from_file, inline = ["--prompt-file", str(prompt)], ["--prompt", "ROMEO:\nO gentle"]
    r, as_prompt = gen(*same, *from_file), gen(*same, *inline)
    assert r.returncode == 0 and r.stdout == as_prompt.stdout
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (MAX_PROMPT_BYTES + 1))
    for path in ("/dev/zero", str(big)):
        r = gen("--run", str(tiny_run), "--prompt-file", path)
        assert r.returncode == 2 and r.stderr == (
            f"error: --prompt-file {path} is larger than 1,048,576 bytes; the model reads only its last "
            f"block_size tokens, so pass the end of it (e.g. tail -c 100000 {path} > prompt.txt)\n"
        )
    r = gen(*same, "--interactive", stdin="ROMEO:\n" + "a" * (MAX_PROMPT_BYTES + 1) + "\nNURSE:\n")
    assert r.returncode == 2 and "ROMEO:" in r.stdout and "NURSE:" not in r.stdout
    assert r.stderr.splitlines()[-1] == (
        "error: input line 2 is longer than 1,048,576 bytes; the model reads only its last block_size tokens, "
        "so pass the end of the text (e.g. tail -c 100000)"
    )
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, match",
    [
        (["--max-new-tokens", "0"], "max_new_tokens must be positive"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "1.5"], r"top_p must be in \(0, 1\]"),
        (["--top-k", "-3"], "top_k must be >= 0"),
    ],
)
def test_bad_sampling_options(tiny_run, args, match):
    r = gen("--run", str(tiny_run), *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    import re

    assert re.search(match, r.stderr), r.stderr


def test_bad_run_directories(tiny_run, tmp_path):
    def broken(name: str):
        """A copy of tiny_run with one thing broken (each case its own)."""
        run = tmp_path / name
        shutil.copytree(tiny_run, run)
        return run

    no_tokenizer = broken("no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    half = broken("half")
    data = (half / "model.safetensors").read_bytes()
    (half / "model.safetensors").write_bytes(data[: len(data) // 2])
    zeros = broken("zeros")
    (zeros / "model.safetensors").write_bytes(b"\0" * 1000)
    other_tokenizer = broken("other-tokenizer")
    other = minitf.Tokenizer.train(["a different corpus entirely"] * 5, vocab_size=260)
    other.save(other_tokenizer / "tokenizer.json")
    cases = [
        (tmp_path / "nope", "does not exist"),
        (no_tokenizer, "has no tokenizer.json"),
        (half, "truncated or corrupted"),
        (zeros, "truncated or corrupted"),
        (other_tokenizer, "does not belong to this run"),
    ]
    for run, match in cases:
        r = gen("--run", str(run), "--max-new-tokens", "3")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = gen(cwd=tmp_path)  # no runs/ here
    assert r.returncode == 2 and "no trained run under runs/" in r.stderr


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_best_is_the_lowest_val_loss_and_generate_best_samples_it(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.max_steps=12"), **QUIET)
    rows = read_rows(run / METRICS)
    assert ckpt.weights_step(run / "best.safetensors") == min(rows, key=lambda r: r["val_loss"])["step"]
    other = minitf.train(tiny_config(tmp_path / "other", corpus, "run.seed=7", "train.max_steps=4"), **QUIET)
    shutil.copy(other / "model.safetensors", run / "best.safetensors")  # best now holds other weights
    args = ["--run", str(run), "--temperature", "0", "--max-new-tokens", "12", "--prompt", "ROMEO:"]
    best, latest = gen(*args, "--best"), gen(*args)
    model, tok, _ = minitf.load_run(other)
    assert (
        best.stdout.strip()
        == ("ROMEO:" + minitf.generate(model, tok, "ROMEO:", max_new_tokens=12, temperature=0)).strip()
    )
    assert best.stdout != latest.stdout


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
    assert gen("--run", str(run)).stdout.strip() == expected.strip()
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


def test_generate_script_says_what_it_loaded_and_reads_a_prompt_file(tmp_path, tiny_run):
    (tmp_path / "scene.txt").write_text("ROMEO:\nO night,\n", encoding="utf-8")
    scene = ["--prompt-file", tmp_path / "scene.txt"]
    r = gen("--run", tiny_run, *scene, "--temperature", "0", "--max-new-tokens", "8", "--best")
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
    r = gen("--run", str(tiny_run), "--prompt-file", str(tmp_path / "none.txt"))
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
    r = gen("--run", str(run), "--max-new-tokens", "2")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        f"[sampling from {run}: model.safetensors, step {latest} (the latest; --best samples best.safetensors, "
        f"step 3, the lowest val loss)]"
    )
    assert which_weights(run, best=True, verb="serves") == "best.safetensors, step 3"
    shutil.copy(run / "model.safetensors", run / "best.safetensors")  # the latest are the best: no hint
    assert which_weights(run, best=False, verb="serves") == f"model.safetensors, step {latest}"


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


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


def test_generate_script_mistakes_are_one_line(tiny_run):
    cases = [
        (["--num-samples", "0"], "--num-samples must be at least 1, got 0"),
        (["--device", "bogus"], "--device 'bogus' is not one of auto, cpu, cuda, cuda:N, mps"),
        (["--prompt", b"caf\xe9".decode("utf-8", "surrogateescape")], "the prompt is not valid UTF-8"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device cuda but "))
    for args, message in cases:
        r = gen("--run", str(tiny_run), "--max-new-tokens", "3", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().startswith("error: ") and message in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_interactive_input_survives_a_line_that_is_not_utf8(tiny_run):
    piped = b"ROMEO:\n\xff\xfe\nJULIET:\n"
    r = gen("--run", tiny_run, "--interactive", "--max-new-tokens", "3", "--temperature", "0", stdin=piped)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[1:] == ["error: input line 2 is not valid UTF-8 (byte 0); skipped"]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ROMEO:") and any(line.startswith("JULIET:") for line in lines)


# Nothing broken that minitf reads is used silently: weights holding NaN or infinity are refused
# wherever a run is loaded (generate, evaluate, both exports, the explorer, resume, the sharded
# checkpoint), a run.init_from directory that does not describe one complete model is refused in
# one line naming what is wrong (never random layers), and a resume without the run's tokenizer
# says what is missing.


def test_the_generate_script_says_it_in_one_line(nan_run):
    r = gen("--run", str(nan_run), "--max-new-tokens", "3")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: " + refusal(nan_run)) and len(r.stderr.strip().splitlines()) == 1


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


def test_generate_reads_a_run_with_unknown_training_keys(tiny_run, tmp_path):
    run = run_copy(tiny_run, tmp_path, train={"newer_schedule": "wsd"})
    r = gen("--run", str(run), "--max-new-tokens", "5", "--seed", "0")
    assert r.returncode == 0, r.stderr[-800:]
    assert f"warning: {run / 'config.yaml'}: leaving out 'train.newer_schedule', unknown to this minitf" in r.stderr
    assert "UserWarning" not in r.stderr and "Traceback" not in r.stderr  # one line, minitf's own form


def test_control_characters_are_shown_on_a_terminal_and_exact_in_a_pipe(tiny_run):
    """The text (prompt and sample) reaches a terminal with ESC and its kind escaped, newlines as
    they are; piped, every character exactly as generated, streamed or not."""
    prompt = "ROMEO:\x1b]0;title\x07\n\u202eA\tB\r"
    for stream in ([], ["--stream"]):
        args = ["--run", str(tiny_run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "8", *stream]
        piped, shown = gen(*args), command("generate", *args, tty=True)
        assert piped.returncode == shown.returncode == 0, shown.stderr
        assert piped.stdout.startswith(prompt)
        assert shown.stdout.startswith("ROMEO:\\x1b]0;title\\x07\n\\u202eA\tB\\r")
        assert shown.stdout[len("ROMEO:\\x1b]0;title\\x07\n\\u202eA\tB\\r") :] == piped.stdout[len(prompt) :]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_samples_from_16_bit_weights(tiny_run, dtype):
    """--dtype bfloat16/float16: the run's weights in that dtype (half the bytes a token reads),
    the start-up line says so, and the logits are the float32 model's up to the 16-bit rounding;
    the greedy text is the text of those weights, as the library gives it."""
    from minitf.export.hf import load_model

    model32, tok, _ = minitf.load_run(tiny_run)
    model, _, _ = load_model(tiny_run, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    ids = torch.tensor([tok.encode("ROMEO: my lord, the")])
    with torch.no_grad():
        want, got = model32(ids)[0][0, -1], model(ids)[0][0, -1].float()  # (V,)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert not torch.equal(got, want)  # rounded: these are not the float32 weights
    greedy = ("--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "12")
    r = gen("--run", str(tiny_run), *greedy, "--dtype", dtype)
    assert r.returncode == 0 and f", in {dtype}]" in r.stderr, r.stderr
    assert r.stdout.rstrip("\n") == "ROMEO:" + minitf.generate(model, tok, "ROMEO:", max_new_tokens=12, temperature=0)
    assert gen("--run", str(tiny_run), "--dtype", "int8").returncode == 2  # argparse names the choices
