"""Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...')."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import minitf
from minitf.config import DataConfig, load_config, load_run_config
from minitf.corpus.prepare import prepare_data
from minitf.corpus.sources import _text_files, cache_dir
from minitf.errors import ConfigError, MinitfError, shown
from minitf.evaluate import evaluate_text
from minitf.sizes import model_floats
from minitf.system.memory import physical_memory
from minitf.system.runtime import resolve_device

from .helpers import ROOT, tiny_config, two_at_a_time


def script(*args, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def one_line(r: subprocess.CompletedProcess) -> str:
    """A script's whole stderr, which must be one 'error: ...' line and exit code 2."""
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr[-2000:]
    return r.stderr.strip()


# ------------------------------------------------------------------ config files


@pytest.mark.parametrize(
    "body, message",
    [
        ("1: 2\n", "a config section is named 1, a number, not a word; the sections are run, data, model"),
        ("~: x\n", "a config section is named null (~, or nothing before the colon), not a word"),
        ("model:\n  1: 2\n", "a key of section 'model' is 1, a number, not a word; keys are words"),
        ("model:\n  ~: 2\n", "a key of section 'model' is null (~, or nothing before the colon), not a word"),
        ("train:\n  true: 2\n", "a key of section 'train' is True, true/false, not a word"),
    ],
)
def test_keys_that_are_not_words(tmp_path, body, message):
    path = tmp_path / "c.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: {message}" or str(e.value).startswith(f"{path}: {message}")
    with pytest.raises(ConfigError, match="not a word"):  # the same from a dict
        load_config(yaml.safe_load(body))


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    # 9**40 'lol's if expanded: only refusing the aliases while parsing can answer at once
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 40)]
    lines += ["run:", "  name: *a39"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (
        f"{path}: line 2 repeats a value with the alias *a0; config files take no aliases: write the value out"
    )


def test_values_nested_too_deep_to_build(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("model:\n  n_layer: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (
        f"{path}: line 2 nests lists or mappings more than 20 deep; a config holds sections of plain settings"
    )


def test_error_messages_never_echo_a_huge_value(tmp_path):
    nested = ["lol"]
    for _ in range(40):  # 2**40 strings if expanded: repr would never end
        nested = [nested, nested]
    cases = [
        ({"run": {"name": ["x" * 10**6]}}, "run.name must be str, got ['xxxx"),
        ({"model": {"n_layer": "9" * 10**6}}, "model.n_layer must be int, got '9999"),
        ({"train": {"lr": nested}}, "train.lr must be float, got [[[[...]"),
        ({"run": "y" * 10**6}, "config section 'run' must be a mapping, got 'yyyy"),
        ({"model": {"z" * 10**6: 1}}, "unknown config key 'model.zzzz"),
        ({"model": {"n_layer": 10**5000}}, "model.n_layer must be an integer in [-2**63, 2**63 - 1], got <an integer"),
    ]
    for d, start in cases:
        with pytest.raises(ConfigError) as e:
            load_config(d)
        assert str(e.value).startswith(start) and len(str(e.value)) < 400, str(e.value)[:500]
    assert shown("x" * 1000) == "'" + "x" * 79 + "…"
    assert shown(10**5000) == "<an integer of 16,610 bits>"


def test_huge_numbers_in_a_file_or_an_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  n_layer: 1" + "0" * 5000 + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: line 2 holds a number of 5,001 digits, too long to be any setting"
    with pytest.raises(ConfigError, match="override model.n_layer= holds a number of 5,001 digits, too long"):
        load_config(None, ["model.n_layer=1" + "0" * 5000])


def test_config_that_is_a_directory_or_huge(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError) as e:
        load_config(run)
    assert str(e.value) == f"config {str(run)!r} is a directory; pass a YAML file"
    (run / "config.yaml").write_text("model: {n_layer: 2}\n")
    with pytest.raises(ConfigError, match=r"is a directory; pass a YAML file \(e.g. its config.yaml\)"):
        load_config(run)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(huge)
    assert (
        str(e.value)
        == f"{huge} is larger than 1,048,576 bytes, far more than any config (a few KB); is it the right file?"
    )
    with pytest.raises(ConfigError, match="/dev/zero is larger than 1,048,576 bytes"):  # endless: read no further
        load_config("/dev/zero")


def test_config_mistakes_through_the_script(tmp_path):
    (tmp_path / "keys.yaml").write_text("model:\n  1: 2\n")
    line = one_line(script("scripts/train.py", "--config", str(tmp_path / "keys.yaml")))
    assert line == (
        f"error: {tmp_path / 'keys.yaml'}: a key of section 'model' is 1, a number, not a word; "
        f"keys are words, e.g. model.attention"
    )
    line = one_line(script("scripts/train.py", "--config", str(tmp_path)))
    assert line == f"error: config {str(tmp_path)!r} is a directory; pass a YAML file"
    line = one_line(script("scripts/train.py", "--config", "tiny", "run.seed=18446744073709551616"))
    assert line == "error: run.seed must be an integer in [0, 2**63 - 1], got 18446744073709551616"


@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_seeds_outside_the_range(seed):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"run.seed={seed}"])
    assert str(e.value) == f"run.seed must be an integer in [0, 2**63 - 1], got {seed}"
    with pytest.raises(ConfigError, match=r"sample.seed must be an integer in \[0, 2\*\*63 - 1\]"):
        minitf.SampleConfig(seed=seed)
    assert load_config(None, [f"run.seed={2**63 - 1}"]).run.seed == 2**63 - 1


def test_a_run_directory_longer_than_the_path_limit(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["run.name=" + "n" * 300])
    assert str(e.value) == (
        "run.name gives the run directory a name of 300 bytes ('nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn…), longer "
        "than the 255 this file system allows; choose a shorter run.name"
    )
    deep = str(tmp_path / ("d/" * 2100))
    with pytest.raises(
        ConfigError, match=r"run.out_dir makes the run directory's path [\d,]+ bytes long; with the run's"
    ):
        load_config(None, [f"run.out_dir={deep}"])


# ------------------------------------------------------------------ a run written by another version


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


def test_a_run_with_unknown_training_keys_still_reads(tiny_run, tmp_path):
    run = _run_copy(tiny_run, tmp_path, train={"newer_schedule": "wsd"}, data={"dedupe": True}, future={"x": 1})
    with pytest.warns(UserWarning) as w:
        cfg = load_run_config(run / "config.yaml")
    assert str(w[0].message) == (
        f"{run / 'config.yaml'}: leaving out 'data.dedupe', 'train.newer_schedule', 'future', unknown to this "
        f"minitf (not needed to read the model)"
    )
    assert cfg.model == load_config(tiny_run / "config.yaml").model
    # training it on is another matter: a resume or a --config reads it strictly, naming the file and the key
    with pytest.raises(ConfigError) as e:
        load_config(run / "config.yaml")
    assert str(e.value) == (
        f"{run / 'config.yaml'}: unknown config key 'data.dedupe' (valid: max_documents, num_proc, source, "
        f"streaming, text_field, val_fraction, vocab_size)"
    )


def test_a_run_with_an_unknown_model_key_is_refused(tiny_run, tmp_path):
    run = _run_copy(tiny_run, tmp_path, model={"moe_experts": 8})
    with pytest.raises(ConfigError) as e:
        load_run_config(run / "config.yaml")
    assert str(e.value).startswith(f"{run / 'config.yaml'}: unknown config key 'model.moe_experts' (valid: ")
    assert str(e.value).endswith(
        "; this minitf cannot build that model: upgrade minitf to the version that wrote the run"
    )


def test_generate_reads_a_run_with_unknown_training_keys(tiny_run, tmp_path):
    run = _run_copy(tiny_run, tmp_path, train={"newer_schedule": "wsd"})
    r = subprocess.run(
        [sys.executable, "scripts/generate.py", "--run", str(run), "--max-new-tokens", "5", "--seed", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-800:]
    assert f"warning: {run / 'config.yaml'}: leaving out 'train.newer_schedule', unknown to this minitf" in r.stderr
    assert "UserWarning" not in r.stderr and "Traceback" not in r.stderr  # one line, minitf's own form


# ------------------------------------------------------------------ the commands' options


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: cuda:0 is fine")
def test_a_device_this_machine_lacks_is_one_line_in_every_command(tiny_run):
    without = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
    want = {
        "cuda:0": f"error: --device cuda:0 but {without}; use --device cpu (or auto)",
        "vulkan:0": "error: --device 'vulkan:0' is not one of auto, cpu, cuda, cuda:N, mps",
    }
    runs = [(c, d) for c in ("generate.py", "evaluate.py", "explore.py", "serve.py") for d in want]
    lines = two_at_a_time(
        lambda c_d: one_line(script(f"scripts/{c_d[0]}", "--run", str(tiny_run), "--device", c_d[1])), runs
    )
    for (command, device), line in zip(runs, lines):
        assert line == want[device], command
    with pytest.raises(ConfigError, match="^run.device=cuda but "):
        resolve_device("cuda")


@pytest.mark.parametrize("size", ["0", "-1"])
def test_evaluate_batch_size_below_one(tiny_run, size):
    line = one_line(script("scripts/evaluate.py", "--run", str(tiny_run), "--batch-size", size))
    assert line == f"error: --batch-size must be a whole number of at least 1 (windows per forward pass), got {size}"
    model, tok, cfg = minitf.load_run(tiny_run)
    with pytest.raises(ConfigError, match=f"^batch_size must be a whole number of at least 1 .*, got {size}$"):
        evaluate_text(model, tok, cfg.data, batch_size=int(size))


def test_plot_draws_rows_without_val_bpb(tmp_path, tiny_run):
    import json

    run = tmp_path / "old"
    run.mkdir()
    rows = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "val_bpb"}) + "\n" for r in rows)
    )
    r = script("scripts/plot.py", "--run", str(run), "--out", str(tmp_path / "loss.png"))
    assert r.returncode == 0, r.stderr[-1500:]
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ data


def test_a_cache_directory_that_is_a_file(tmp_path, monkeypatch, corpus):
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(source=f"file:{corpus}", vocab_size=300), log=lambda *a: None)
    assert str(e.value) == (
        f"MINITF_CACHE={tmp_path / 'cache'} is a file, not a directory; point MINITF_CACHE at a directory "
        f"(made if missing), or unset it"
    )
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache" / "sub"))
    with pytest.raises(MinitfError, match="lies under .*cache, which is a file, not a directory"):
        cache_dir()


def test_a_cache_directory_on_a_read_only_file_system(tmp_path, monkeypatch, corpus):
    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(MinitfError) as e:
        prepare_data(DataConfig(source=f"file:{corpus}", vocab_size=300), log=lambda *a: None)
    assert str(e.value) == (
        f"MINITF_CACHE={tmp_path / 'cache'} cannot be made (Read-only file system); "
        "point MINITF_CACHE at a writable directory"
    )
    monkeypatch.undo()
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("MINITF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a read-only mount answers, even to root
    with pytest.raises(MinitfError, match=r"^MINITF_CACHE=.*cache is not writable; point MINITF_CACHE at a writable"):
        cache_dir()


def test_an_hf_text_column_of_integers(tmp_path):
    datasets = pytest.importorskip("datasets", reason="needs the hf extra: pip install -e '.[hf]'")
    rows = {"text": list(range(40)), "story": ["once upon a time"] * 40}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "ds" / "data.parquet"))
    for streaming in (False, True):
        with pytest.raises(MinitfError) as e:
            prepare_data(DataConfig(source=f"hf:{tmp_path / 'ds'}", vocab_size=300, streaming=streaming), log=print)
        assert str(e.value) == (
            f"dataset '{tmp_path / 'ds'}' column 'text' holds int64 values, not text; set data.text_field to the "
            f"column with the text (its text columns: story)"
        )


def test_file_names_with_glob_characters(tmp_path):
    (tmp_path / "notes[1].txt").write_text("the first note\n")
    (tmp_path / "notes1.txt").write_text("a file the pattern notes[1].txt would match instead\n")
    (tmp_path / "dir[x]").mkdir()
    (tmp_path / "dir[x]" / "a.txt").write_text("inside a directory with brackets\n")
    assert _text_files(str(tmp_path / "notes[1].txt"))[0] == [tmp_path / "notes[1].txt"]
    assert _text_files(str(tmp_path / "dir[x]"))[0] == [tmp_path / "dir[x]" / "a.txt"]
    # a path that is not there is still a pattern
    assert _text_files(str(tmp_path / "notes[0-9].txt"))[0] == [tmp_path / "notes1.txt"]


def test_a_val_split_too_small_is_refused_before_training(tmp_path, corpus):
    cfg = tiny_config(tmp_path / "run", corpus / "play0.txt", "data.val_fraction=0.0001")
    with pytest.raises(MinitfError) as e:
        minitf.train(cfg, log=lambda *a: None)
    assert str(e.value) == (
        "the val split has only 2 tokens, fewer than block_size+1=33; use a bigger corpus, a smaller "
        "model.block_size or a larger data.val_fraction"
    )
    assert not (tmp_path / "run").exists()  # no step, no run files, and the directory it made is gone


def test_a_file_named_tensorboard_in_the_run_directory(tmp_path, corpus):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("my notes")
    with pytest.raises(MinitfError) as e:
        minitf.train(tiny_config(tmp_path / "run", corpus, "train.logger=tensorboard"), log=lambda *a: None)
    assert str(e.value) == (
        f"{tmp_path / 'run' / 'tensorboard'} is a file; train.logger=tensorboard writes its event files in a "
        f"directory of that name: move the file away, or use train.logger=jsonl"
    )
    assert (tmp_path / "run" / "tensorboard").read_text() == "my notes"
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the data was prepared


# ------------------------------------------------------------------ models too big to build


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positions="learned"),
        dict(positions="sinusoidal", tie_embeddings=False, ffn="swiglu", norm="rmsnorm"),
        dict(positions="rope", bias=False, n_kv_head=2, ffn="relu2", ffn_hidden=48),
    ],
)
def test_the_size_counted_from_the_config_is_the_models(overrides):
    cfg = minitf.ModelConfig(vocab_size=300, n_layer=2, n_embd=32, n_head=4, block_size=16, **overrides)
    model = minitf.Transformer(cfg)
    held = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert model_floats(cfg) == held


@pytest.mark.parametrize(
    "overrides, size",
    [(dict(block_size=10**15), "128.0 PB"), (dict(n_layer=10**7), "7.9 TB")],
)
def test_a_model_too_big_for_memory_is_refused_before_allocating(overrides, size):
    cfg = minitf.ModelConfig(vocab_size=4096, **overrides)  # the default shape otherwise
    assert physical_memory() is not None
    with pytest.raises(ConfigError) as e:
        minitf.Transformer(cfg)  # at once: neither 10**15 rows nor 10**7 layers are built
    assert str(e.value).startswith(
        f"this model (n_layer={cfg.n_layer}, n_embd=128, block_size={cfg.block_size}, vocabulary 4096) needs "
        f"{size} for its float32 weights alone, more than this machine's "
    )
    assert str(e.value).endswith(" of memory; choose smaller model.* values")


# ------------------------------------------------------------------ the library called with the wrong types


def test_generate_called_with_the_wrong_types(tiny_run):
    model, tok, _ = minitf.load_run(tiny_run)
    usage = "(model, tokenizer, prompt, settings=None, **settings)"
    cases = [
        (
            lambda: minitf.generate(model, tok, 123),
            f"generate(): prompt must be text (a str), got int 123; generate{usage}",
        ),
        (
            lambda: minitf.generate(model, tok, b"Romeo"),
            f"generate(): prompt must be text (a str), got bytes b'Romeo' (decode bytes first); generate{usage}",
        ),
        (
            lambda: minitf.generate(tok, model, "Romeo"),
            f"generate(): model must be a minitf Transformer (from minitf.load_run), got Tokenizer; generate{usage}",
        ),
        (
            lambda: minitf.generate(model, "Romeo", tok),
            "generate(): tokenizer must be a minitf Tokenizer (from minitf.load_run), got str 'Romeo'; "
            f"generate{usage}",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", {"temperature": 0}),
            "settings must be a minitf SampleConfig or None, got dict (SampleConfig(**d), or the settings as "
            "keyword arguments)",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", stop=5),
            "generate(): stop must be a str or a list of str, got int 5",
        ),
        (
            lambda: minitf.generate(model, tok, "Romeo", num_samples="2"),
            "generate(): num_samples must be an int, got str '2'",
        ),
        (
            lambda: list(minitf.stream(model, tok, 123)),
            f"stream(): prompt must be text (a str), got int 123; stream{usage}",
        ),
        (
            lambda: list(minitf.stream_tokens(tok, model, "Romeo")),
            "stream_tokens(): model must be a minitf Transformer (from minitf.load_run), got Tokenizer; "
            f"stream_tokens{usage}",
        ),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == message
    assert minitf.generate(model, tok, "Romeo", minitf.SampleConfig(max_new_tokens=3, seed=0)) == minitf.generate(
        model, tok, "Romeo", max_new_tokens=3, seed=0
    )


def test_script_mistakes_after_training(tiny_run, tmp_path):
    line = one_line(script("scripts/generate.py", "--run", str(tiny_run), "--seed", str(2**64)))
    assert line == f"error: sample.seed must be an integer in [0, 2**63 - 1], got {2**64}"
    line = one_line(script("scripts/generate.py", "--run", str(tiny_run), "--seed", "-1"))
    assert line == "error: sample.seed must be an integer in [0, 2**63 - 1], got -1"
    (tmp_path / "notes.txt").write_text("mine")
    line = one_line(script("scripts/export_hf.py", "--run", str(tiny_run), "--out", str(tmp_path / "notes.txt")))
    assert line == f"error: --out {tmp_path / 'notes.txt'} is a file; --out names a directory to create"
    assert (tmp_path / "notes.txt").read_text() == "mine"
