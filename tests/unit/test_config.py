"""Config: YAML + overrides, and one clear message naming the key for each mistake."""

import dataclasses
import typing
from pathlib import Path

import pytest

import minitf
from minitf.config import ModelConfig, TrainConfig, load_config
from minitf.errors import ConfigError

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
        (
            ["model.n_head=4", "model.n_kv_head=3"],
            r"model.n_head \(4\) must be divisible by model.n_kv_head \(3\): each key/value head serves",
        ),
        (["model.n_kv_head=0"], r"model.n_kv_head must be positive, got 0"),
        (["model.norm_eps=0"], r"model.norm_eps must be positive, got 0.0"),
        (["model.ffn_hidden=-5"], r"model.ffn_hidden must be positive, got -5"),
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
    assert ModelConfig(vocab_size=10).head_dim == 32  # the default 128 wide, 4 heads


RECIPES = sorted(ROOT.glob("configs/*.yaml"))


def test_the_recipes_are_every_file_in_configs():
    assert minitf.config.recipes() == sorted(p.stem for p in RECIPES) and len(RECIPES) >= 7


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_loads_by_path_and_by_name(path):
    cfg = load_config(path)
    assert cfg == load_config(path.stem) == load_config(f"{path.stem}.yaml")
    assert cfg.run.name == path.stem and cfg.run.out_dir == f"runs/{path.stem}"
    assert cfg.model.vocab_size is None  # always from the tokenizer
    text = path.read_text()
    assert text.startswith("# ") and len(text.splitlines()) <= 10  # says what it is for; only what differs


def test_the_default_recipe_is_the_code_default():
    assert load_config() == load_config("shakespeare") == load_config(ROOT / "configs" / "shakespeare.yaml")
    assert load_config() == minitf.Config()
    cfg = load_config()  # the values the README's first run promises
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.batch_size) == ("muon", 4e-3, 8)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.positions) == (3, 128, "rope")
    assert cfg.train.max_seconds == 210 and cfg.train.min_lr == pytest.approx(4e-4)


def test_recipes_state_only_what_differs():
    v1 = load_config("shakespeare-v1")
    changed = {
        f"{s}.{k}" for s, body in v1.to_dict().items() for k, v in body.items() if load_config().to_dict()[s][k] != v
    }
    assert changed == {
        "run.name",
        "run.out_dir",
        "model.n_layer",
        "model.positions",
        "train.optimizer",
        "train.lr",
        "train.min_lr",
        "train.typical_steps",
        "train.eval_every",
        "train.ckpt_every",
    }
    learned = load_config("shakespeare-learned")  # the default with a learned position table
    assert learned.model.positions == "learned" and learned.train == load_config().train
    assert load_config(None, ["train.lr=1e-3"]).train.min_lr == pytest.approx(1e-4)  # the floor follows lr


def test_unknown_recipe_lists_the_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # names resolve without the clone's configs/ in the working directory
    assert load_config("tiny").model.n_layer == 2
    with pytest.raises(ConfigError) as e:
        load_config("tinny")
    msg = str(e.value)
    assert "\n" not in msg and "'tinny'" in msg and ", ".join(minitf.config.recipes()) in msg
    with pytest.raises(ConfigError, match="not found"):  # a path stays a path
        load_config("configs/tinny.yaml")


def test_every_key_has_a_meaning_and_choices_are_literals():
    lines = minitf.config.describe_keys().splitlines()
    for name, section in typing.get_type_hints(minitf.Config).items():
        for f in dataclasses.fields(section):
            doc = f.metadata.get("doc", "")
            assert len(doc) > 10 and "\n" not in doc, f"{name}.{f.name} has no one-line meaning"
            row = next(line for line in lines if line.strip().startswith(f"{name}.{f.name} = "))
            assert row.endswith(doc)
    norm = typing.get_type_hints(ModelConfig)["norm"]
    assert typing.get_origin(norm) is typing.Literal and typing.get_args(norm) == ("layernorm", "rmsnorm")
    assert "[layernorm|rmsnorm]" in minitf.config.describe_keys()
    with pytest.raises(ConfigError, match=r"train.optimizer must be one of adamw\|muon, got 'sgd'"):
        TrainConfig(optimizer="sgd")


def test_train_help_names_every_key_a_resume_may_change(capsys):
    """--resume's help is written from RESUMABLE, so a key added there is named there too."""
    from minitf.cli.train import main as train_main
    from minitf.config import RESUMABLE

    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    words = text[text.index("--resume [RUN_DIR]") :].split(" may change")[0]
    assert [k for k in RESUMABLE if (k + "*" if k.endswith(".") else k) not in words] == []
    assert "train.fit_budget" in words and "sample.*" in words
