"""Config: YAML + overrides, and one clear message naming the key for each mistake."""

import dataclasses
import typing

import pytest
import yaml

import minitf
import minitf.system.files
import minitf.system.recipes
from minitf.config import ModelConfig, TrainConfig, load_config, load_run_config
from minitf.errors import ConfigError, shown
from tests.support import ROOT
from tests.support.errors import writes_one_line as one_line
from tests.support.runs import run_copy


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
        (["model.n_layers=2"], r"unknown config key 'model.n_layers' \(did you mean 'model.n_layer'\?\)"),
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
    assert ModelConfig(vocab_size=10).head_size == 32  # the default 128 wide, 4 heads


RECIPES = sorted(ROOT.glob("configs/*.yaml"))


def test_the_recipes_are_every_file_in_configs():
    assert minitf.system.recipes.recipes() == sorted(p.stem for p in RECIPES) and len(RECIPES) >= 7


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
    assert "\n" not in msg and "'tinny'" in msg and ", ".join(minitf.system.recipes.recipes()) in msg
    with pytest.raises(ConfigError, match="not found"):  # a path stays a path
        load_config("configs/tinny.yaml")
    (tmp_path / "tiny").mkdir()  # a folder named as a recipe (a run of it) beside: the name is the recipe's
    assert load_config("tiny").model.n_layer == 2
    (tmp_path / "mine").mkdir()  # a folder of no recipe's name is still the path given
    with pytest.raises(ConfigError, match="'mine' is a directory"):
        load_config("mine")


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
    from minitf.training.checkpoint import RESUMABLE

    with pytest.raises(SystemExit):
        train_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    words = text[text.index("--resume [RUN_DIR]") :].split(" may change")[0]
    assert [k for k in RESUMABLE if (k + "*" if k.endswith(".") else k) not in words] == []
    assert "train.fit_budget" in words and "sample.*" in words


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_run_name_names_the_directory_when_out_dir_is_not_set():
    cfg = minitf.load_config(None, ["run.name=novel"])
    assert cfg.run.out_dir == "runs/novel"
    assert minitf.load_config(None, ["run.name=novel", "run.out_dir=elsewhere"]).run.out_dir == "elsewhere"


# What goes wrong in real life: signals, kills between writes, two trainers, full disks, NaN
# settings, corrupt files and library misuse. Each gives the right behaviour or one clear line.


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


# Mistakes a user makes that used to end in a traceback or an unclear error: each is now one line
# naming the problem and the fix (a ConfigError or MinitfError; the scripts print it as 'error: ...').


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


def test_a_run_with_unknown_training_keys_still_reads(tiny_run, tmp_path):
    run = run_copy(tiny_run, tmp_path, train={"newer_schedule": "wsd"}, data={"dedupe": True}, future={"x": 1})
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
        f"{run / 'config.yaml'}: unknown config key 'data.dedupe' (valid: format, max_documents, num_proc, "
        f"skip_invalid, source, streaming, text_field, val_fraction, vocab_size)"
    )


def test_a_run_with_an_unknown_model_key_is_refused(tiny_run, tmp_path):
    run = run_copy(tiny_run, tmp_path, model={"moe_experts": 8})
    with pytest.raises(ConfigError) as e:
        load_run_config(run / "config.yaml")
    assert str(e.value).startswith(f"{run / 'config.yaml'}: unknown config key 'model.moe_experts' (valid: ")
    assert str(e.value).endswith(
        "; this minitf cannot build that model: upgrade minitf to the version that wrote the run"
    )


# Writes land only where minitf means them to: no symlink redirects a write out of the run
# directory, a fresh run never overwrites files it did not write, exports never replace a run's
# weights, and the run directory is never the current directory or a repository root.


@pytest.mark.parametrize(
    "override, message",
    [
        ("run.out_dir=", "run.out_dir is empty; name the run directory, e.g. run.out_dir=runs/mine"),
        ("run.name=", "run.name is empty; give the run a name, e.g. run.name=shakespeare"),
        (
            "run.out_dir=.",
            "run.out_dir '.' is the current directory; runs write config.yaml and weights there: "
            "choose a directory of its own, e.g. run.out_dir=runs/mine",
        ),
    ],
)
def test_an_empty_or_current_run_directory_is_refused(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert one_line(e) == message


def test_a_repository_root_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for repo, entry, text in (("git", ".git", None), ("clone", "pyproject.toml", '[project]\nname = "minitf"\n')):
        (tmp_path / repo).mkdir()
        if text is None:
            (tmp_path / repo / entry).mkdir()
        else:
            (tmp_path / repo / entry).write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"run.out_dir={repo}"])
        assert one_line(e) == (
            f"run.out_dir '{repo}' is a repository root; runs write config.yaml and weights there: "
            f"choose a directory of its own, e.g. run.out_dir=runs/mine"
        )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "someone-else"\n')
    assert load_config(None, ["run.out_dir=other"]).run.out_dir == "other"  # not a repository of its own


def test_lora_chooses_adamw_unless_muon_is_asked_for_by_name():
    cfg = minitf.load_config(None, ["train.lora_rank=8"])
    assert cfg.train.optimizer == "adamw" and "train.optimizer" not in cfg.given  # chosen, not given
    assert minitf.load_config(None, []).train.optimizer == "muon"  # without LoRA: the recipe's own
    with pytest.raises(ConfigError, match=r"train.lora_rank trains with AdamW .*; remove train.optimizer=muon"):
        minitf.load_config(None, ["train.lora_rank=8", "train.optimizer=muon"])


def test_fsdp_chooses_adamw_unless_muon_is_asked_for_by_name():
    """A fine-tune of a download with train.parallel=fsdp and no optimizer trains with AdamW (it was
    refused for the recipe's Muon, which the user never asked for); Muon by name is still refused."""
    cfg = minitf.load_config("chat", ["train.parallel=fsdp"])
    assert cfg.train.optimizer == "adamw" and "train.optimizer" not in cfg.given
    with pytest.raises(ConfigError, match=r"train.parallel=fsdp does not support train.optimizer=muon"):
        minitf.load_config(None, ["train.parallel=fsdp", "train.optimizer=muon"])


@pytest.mark.parametrize(
    "clash, why",
    [
        ("train.optimizer=muon", "its stochastic rounding is AdamW's"),
        ("train.dtype=float32", "a bfloat16 weight is read by bfloat16 products"),
        ("train.dtype=float16", "a bfloat16 weight is read by bfloat16 products"),
        ("train.lora_rank=8", "LoRA already holds its frozen weights in 16 bits"),
        ("train.parallel=fsdp", "FSDP keeps float32 shards of its own"),
    ],
)
def test_bfloat16_weights_choose_adamw_and_refuse_what_they_do_not_go_with(clash, why):
    cfg = minitf.load_config(None, ["train.param_dtype=bfloat16"])
    assert cfg.train.optimizer == "adamw" and "train.optimizer" not in cfg.given  # chosen, not given
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.param_dtype=bfloat16", clash])
    assert one_line(e) == (f"train.param_dtype=bfloat16 does not go with {clash} ({why}); remove one of them"), (
        one_line(e)
    )


@pytest.mark.parametrize(
    "missing, given, why",
    [
        (
            "train.param_dtype=bfloat16",
            "train.param_dtype=float32",
            "only the optimizer of bfloat16 weights updates in backward",
        ),
        ("train.grad_clip=0", "train.grad_clip=1.0", "clipping needs every gradient before the first update"),
        ("train.grad_accum=1", "train.grad_accum=2", "each micro-batch's gradient would update the weights"),
    ],
)
def test_optimizer_in_backward_names_what_it_needs(missing, given, why):
    meets = {"train.param_dtype=bfloat16", "train.grad_clip=0", "train.grad_accum=1"}
    cfg = load_config(None, ["train.optimizer_in_backward=true", *meets])
    assert cfg.train.optimizer == "adamw"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.optimizer_in_backward=true", *(meets - {missing}), given])
    assert one_line(e) == (
        f"train.optimizer_in_backward=true needs {missing} ({why}), not {given.split('=')[1]}; set {missing}, or "
        f"remove train.optimizer_in_backward"
    ), one_line(e)


@pytest.mark.parametrize(
    "setting", ["train.lora_alpha=32", "train.lora_targets=c_attn", "train.lora_dropout=0.1", "train.lora_lr_scale=3"]
)
def test_a_lora_setting_without_a_rank_says_it_does_nothing(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=f"{key}=.* does nothing without train.lora_rank"):
        load_config(None, [setting])
    load_config(None, [setting, "train.lora_rank=8"])  # with a rank: taken


def test_activation_checkpointing_is_on_by_default_from_300m_parameters():
    """auto: a downloaded model's size (Qwen3-0.6B) recomputes its blocks, GPT-2's 124M does not;
    true and false are what they say at any size."""
    auto = load_config(None, []).train
    assert auto.activation_checkpointing == "auto"
    assert not auto.checkpoints_blocks(124_000_000) and not auto.checkpoints_blocks(299_999_999)
    assert auto.checkpoints_blocks(300_000_000) and auto.checkpoints_blocks(596_000_000)
    assert load_config(None, ["train.activation_checkpointing=true"]).train.checkpoints_blocks(1_000)
    assert not load_config(None, ["train.activation_checkpointing=false"]).train.checkpoints_blocks(10**9)
    with pytest.raises(ConfigError, match="train.activation_checkpointing"):
        load_config(None, ["train.activation_checkpointing=sometimes"])
    # the start-up line says it where it is on, and why where auto chose it
    from minitf.training.setup import _checkpointing_words

    assert _checkpointing_words("auto", True) == " | activation checkpointing (auto: 300M parameters or more)"
    assert _checkpointing_words(True, True) == " | activation checkpointing"
    assert _checkpointing_words("auto", False) == _checkpointing_words(False, False) == ""
