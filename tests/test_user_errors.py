"""Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...')."""

import subprocess
import sys

import pytest
import yaml

import minitf
from minitf.config import ConfigError, load_config, load_run_config
from minitf.errors import shown

from .helpers import ROOT


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
