"""Config: YAML + overrides, and one clear message naming the key for each mistake."""

from pathlib import Path

import pytest

import minitf
from minitf.config import ConfigError, ModelConfig, TrainConfig, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_load_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: {n_layer: 3, n_embd: 64}\ntrain: {lr: 3e-4}\n")
    cfg = minitf.load_config(
        p, overrides=["model.n_layer=2", "train.max_seconds=1.5", "sample.top_k=null", "run.name=hello world"]
    )
    assert cfg.model.n_layer == 2 and cfg.model.n_embd == 64
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)  # YAML reads 3e-4 as a string
    assert cfg.train.max_seconds == 1.5 and cfg.sample.top_k is None and cfg.run.name == "hello world"
    assert cfg.model.n_head == 4  # defaults fill the rest


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["model.n_layers=2"], r"unknown config key 'model.n_layers' \(did you mean 'n_layer'\?\)"),
        (["modle.n_layer=2"], r"unknown config section 'modle' \(did you mean 'model'\?\)"),
        (["model.n_layer=two"], r"model.n_layer must be int, got 'two'"),
        (["model.n_layer=0"], r"model.n_layer must be positive, got 0"),
        (["model.n_embd=100", "model.n_head=3"], r"model.n_embd \(100\) must be divisible by model.n_head \(3\)"),
        (["model.positions=rope", "model.n_embd=12", "model.n_head=4"], r"even head size"),
        (["model.dropout=1.0"], r"model.dropout must be in \[0, 1\)"),
        (["model.norm=batchnorm"], r"model.norm must be one of layernorm\|rmsnorm"),
        (["model.bias=yes please"], r"model.bias must be bool"),
        (["train.dtype=fp8"], r"train.dtype must be one of"),
        (["data.val_fraction=0.7"], r"data.val_fraction must be in \(0, 0.5\]"),
        (["data.vocab_size=100"], r"data.vocab_size must be at least 257"),
        (["sample.top_p=1.5"], r"sample.top_p must be in \(0, 1\]"),
        (["n_layer=2"], r"must look like section.key=value"),
    ],
)
def test_bad_values_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_dataclasses_validate_directly():
    with pytest.raises(ConfigError, match="model.n_head must be positive"):
        ModelConfig(vocab_size=10, n_head=-1)
    with pytest.raises(ConfigError, match="train.min_lr"):
        TrainConfig(lr=1e-4, min_lr=1e-3)
    assert ModelConfig(vocab_size=10).head_dim == 64


def test_shipped_configs_load():
    for name in ("shakespeare", "tiny", "gpt2-small", "tinystories"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        assert cfg.model.vocab_size is None  # always from the tokenizer
