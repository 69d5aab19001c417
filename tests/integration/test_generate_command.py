"""scripts/generate.py as a user runs it: defaults, options, and one-line errors for bad input."""

import shutil
import subprocess
import sys

import pytest

import minitf
from minitf.generate import stream_tokens

from .helpers import ROOT


def gen(*args, cwd=ROOT, stdin=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        input=stdin,
    )


def test_library_generate_and_stream_agree(tiny_run):
    model, tok, cfg = minitf.load_run(tiny_run)
    text = minitf.generate(model, tok, "ROMEO:", max_new_tokens=40, temperature=0)
    pieces = list(minitf.stream(model, tok, "ROMEO:", max_new_tokens=40, temperature=0))
    assert "".join(pieces) == text and len(text) > 0
    uncached = minitf.generate(model, tok, "ROMEO:", max_new_tokens=40, temperature=0, use_cache=False)
    assert uncached == text
    many = minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=1, num_samples=3, temperature=1.0)
    assert isinstance(many, list) and len(many) == 3
    assert many == minitf.generate(model, tok, "ROMEO:", max_new_tokens=20, seed=1, num_samples=3, temperature=1.0)


def test_stop_strings_and_empty_prompt(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    full = minitf.generate(model, tok, "", max_new_tokens=60, temperature=0)
    assert len(full) > 10
    stop = full[5:8]
    cut = minitf.generate(model, tok, "", max_new_tokens=60, temperature=0, stop=[stop])
    assert cut == full[: full.find(stop)]
    assert "".join(minitf.stream(model, tok, "", max_new_tokens=60, temperature=0, stop=stop)) == cut


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
    r = gen(*same, "--prompt-file", str(prompt))
    assert r.returncode == 0 and r.stdout == gen(*same, "--prompt", "ROMEO:\nO gentle").stdout
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
    def fails(run, match):
        r = gen("--run", str(run), "--max-new-tokens", "3")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert match in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    fails(tmp_path / "nope", "does not exist")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_run, broken)
    (broken / "tokenizer.json").unlink()
    fails(broken, "has no tokenizer.json")
    shutil.copy(tiny_run / "tokenizer.json", broken / "tokenizer.json")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    fails(broken, "truncated or corrupted")
    (broken / "model.safetensors").write_bytes(b"\0" * 1000)
    fails(broken, "truncated or corrupted")
    shutil.copy(tiny_run / "model.safetensors", broken / "model.safetensors")
    other = minitf.Tokenizer.train(["a different corpus entirely"] * 5, vocab_size=260)
    other.save(broken / "tokenizer.json")
    fails(broken, "does not belong to this run")
    r = gen(cwd=tmp_path)  # no runs/ here
    assert r.returncode == 2 and "no trained run under runs/" in r.stderr


def test_long_prompt_keeps_its_tail(tiny_run):
    model, tok, cfg = minitf.load_run(tiny_run)
    prompt = "ROMEO: O love, sweet night! " * 40  # far more than block_size tokens
    with pytest.warns(UserWarning, match="keeping its last 32"):
        text = minitf.generate(model, tok, prompt, max_new_tokens=10, temperature=0)
    tail_prompt = tok.decode(tok.encode(prompt)[-32:])
    assert text == minitf.generate(model, tok, tail_prompt, max_new_tokens=10, temperature=0)
