"""Typed configuration: one dataclass per YAML section, loaded from a file plus dotted overrides.

Every mistake (unknown key, wrong type, bad value) raises ConfigError with one line that names
the key and what is allowed, so it never surfaces later as a traceback from inside torch.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from .errors import ConfigError, MinitfError  # noqa: F401  (MinitfError: re-exported)
from .io import read_yaml


def _suggest(name: str, allowed) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(sorted(allowed))})"


def _coerce(where: str, value: Any, typ: Any) -> Any:
    """Check `value` against a field's annotation (int, float, bool, str, or X | None)."""
    args = typing.get_args(typ)
    if args:  # X | None
        if value is None:
            return None
        typ = next(a for a in args if a is not type(None))
    if typ is float and isinstance(value, str):
        try:  # YAML reads '1e-3' as a string
            value = float(value)
        except ValueError:
            pass
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is int and isinstance(value, float) and value.is_integer():
        return int(value)
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(f"{where} must be {typ.__name__}{' or null' if args else ''}, got {value!r}")
    if typ is float and not math.isfinite(value):  # nan slips through every < and > check below
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return value


class _Section:
    """Shared checks for the config dataclasses: types first, then each section's own rules."""

    _section: ClassVar[str] = ""
    _choices: ClassVar[dict[str, tuple[str, ...]]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            where = f"{self._section}.{f.name}"
            setattr(self, f.name, _coerce(where, getattr(self, f.name), hints[f.name]))
            if f.name in self._choices and getattr(self, f.name) not in self._choices[f.name]:
                raise ConfigError(
                    f"{where} must be one of {'|'.join(self._choices[f.name])}, got {getattr(self, f.name)!r}"
                )
        self.validate()

    def validate(self) -> None:
        pass

    def _positive(self, *names: str) -> None:
        for n in names:
            v = getattr(self, n)
            if v is not None and v <= 0:
                raise ConfigError(f"{self._section}.{n} must be positive, got {v}")


@dataclass
class RunConfig(_Section):
    """Where the run is written (out_dir, by default runs/<name>), its seed, and the device."""

    _section = "run"
    _choices = {"device": ("auto", "cpu", "cuda", "mps")}
    name: str = "shakespeare"
    out_dir: str | None = None  # None: runs/<name>
    seed: int = 1337
    device: str = "auto"
    init_from: str | None = None  # a local Hugging Face GPT-2 directory to fine-tune (model.* from it)

    def validate(self) -> None:
        if self.out_dir is None:
            self.out_dir = f"runs/{self.name}"


@dataclass
class DataConfig(_Section):
    _section = "data"
    source: str = "shakespeare"  # a corpus source: the kinds are listed in minitf/corpus.py
    vocab_size: int = 4096
    val_fraction: float = 0.1
    text_field: str = "text"  # column holding the text in hf: datasets
    streaming: bool = False  # stream hf: datasets instead of downloading them whole
    max_documents: int | None = None  # cap on documents read from a source
    num_proc: int | None = None  # tokenizer processes; None = one per core

    def validate(self) -> None:
        if self.vocab_size < 257:
            raise ConfigError(
                f"data.vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}"
            )
        if not 0 < self.val_fraction <= 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}")
        self._positive("max_documents", "num_proc")


@dataclass
class ModelConfig(_Section):
    _section = "model"
    _choices = {
        "positions": ("learned", "sinusoidal", "rope"),
        "attention": ("sdpa", "reference"),
        "norm": ("layernorm", "rmsnorm"),
        "ffn": ("gelu", "swiglu", "relu2"),
        "gelu": ("tanh", "exact"),
    }
    vocab_size: int | None = None  # set from the tokenizer, not from the file
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    positions: str = "learned"
    attention: str = "sdpa"
    norm: str = "layernorm"
    ffn: str = "gelu"
    gelu: str = "tanh"  # tanh approximation, as GPT-2
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True  # false: a separate LM head, initialised to zero
    rope_base: float = 10000.0
    qk_norm: bool = False  # RMS-normalise each head's queries and keys before q @ k^T
    logit_softcap: float | None = None  # logits -> cap * tanh(logits / cap); None = off

    def validate(self) -> None:
        self._positive("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "rope_base", "logit_softcap")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        if self.positions == "rope" and (self.n_embd // self.n_head) % 2:
            raise ConfigError(
                f"model.positions=rope needs an even head size, got n_embd/n_head = {self.n_embd // self.n_head}"
            )
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class TrainConfig(_Section):
    _section = "train"
    _choices = {
        "dtype": ("auto", "float32", "bfloat16", "float16"),
        "optimizer": ("adamw", "muon"),
        "parallel": ("ddp", "fsdp"),
        "logger": ("jsonl", "tensorboard"),
    }
    batch_size: int = 32
    grad_accum: int = 1
    max_steps: int = 2000
    max_seconds: float | None = None  # wall-clock budget; the LR schedule then follows elapsed time
    optimizer: str = "adamw"  # muon: Muon for the blocks' matrices, AdamW (lr) for the rest
    lr: float = 1e-3
    min_lr: float = 1e-4  # the schedule's floor; Muon's follows in proportion
    muon_lr: float = 0.02  # Muon's peak LR (train.optimizer=muon)
    muon_momentum: float = 0.95
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    eval_every: int = 200
    eval_batches: int = 20
    ckpt_every: int = 200
    log_every: int = 10  # steps between steps.jsonl rows (loss, LR) and progress-bar updates
    logger: str = "jsonl"  # tensorboard: event files in <run>/tensorboard too
    typical_steps: int | None = None  # steps the budget gives on a typical 2-core CPU; far fewer get a warning
    dtype: str = "auto"  # auto: bfloat16 autocast on CUDA and on CPUs with native bf16, else float32
    compile: bool = False
    max_bad_steps: int = 10  # non-finite steps in a row before training stops
    parallel: str = "ddp"  # under torchrun: ddp copies the model to every process, fsdp shards it
    activation_checkpointing: bool = False  # recompute each block in backward: less memory, ~1/3 more compute

    def validate(self) -> None:
        self._positive(
            "batch_size",
            "grad_accum",
            "max_steps",
            "max_seconds",
            "lr",
            "muon_lr",
            "eval_every",
            "eval_batches",
            "ckpt_every",
            "log_every",
            "max_bad_steps",
        )
        if self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr must be in [0, train.lr={self.lr}], got {self.min_lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("train.warmup_steps, train.weight_decay and train.grad_clip must be >= 0")
        for n in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, n) < 1:
                raise ConfigError(f"train.{n} must be in [0, 1), got {getattr(self, n)}")
        if self.parallel == "fsdp" and self.dtype == "float16":  # its GradScaler does not see the other shards
            raise ConfigError("train.parallel=fsdp does not support train.dtype=float16; use bfloat16 or float32")
        if self.parallel == "fsdp" and self.optimizer == "muon":  # Newton-Schulz needs whole matrices, not shards
            raise ConfigError("train.parallel=fsdp does not support train.optimizer=muon; use adamw or parallel=ddp")


@dataclass
class SampleConfig(_Section):
    _section = "sample"
    prompt: str = "Romeo.\n"  # how this corpus writes a speaker: the name, a full stop, a new line
    max_new_tokens: int = 300
    temperature: float = 0.8  # 0 = greedy
    top_k: int | None = 50
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Checked here once, for the config file, the command line and generate() alike."""
        if self.max_new_tokens <= 0:
            raise ConfigError(f"sample.max_new_tokens must be positive, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"sample.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"sample.top_k must be >= 0 (0 or null = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"sample.top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"sample.repetition_penalty must be positive (1 = off), got {self.repetition_penalty}")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        if not isinstance(d, dict):
            raise ConfigError(f"a config must be a mapping of sections, got {type(d).__name__}")
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        built = {}
        for name, body in d.items():
            if name not in sections:
                raise ConfigError(f"unknown config section '{name}'{_suggest(name, sections)}")
            body = body or {}
            if not isinstance(body, dict):
                raise ConfigError(f"config section '{name}' must be a mapping, got {body!r}")
            keys = {f.name for f in dataclasses.fields(hints[name])}
            for key in body:
                if key not in keys:
                    raise ConfigError(f"unknown config key '{name}.{key}'{_suggest(key, keys)}")
            built[name] = hints[name](**body)
        return cls(**built)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def apply_overrides(d: dict, overrides) -> dict:
    """Apply 'section.key=value' strings to a nested dict; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"override {item!r} must look like section.key=value, e.g. model.n_layer=2")
        dotted, raw = item.split("=", 1)
        section, key = dotted.strip().split(".", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (dict, list)):  # every key holds a scalar: 'sample.prompt=ROMEO:' means the text
            value = raw
        d.setdefault(section, {})
        if not isinstance(d[section], dict):
            raise ConfigError(f"config section '{section}' must be a mapping")
        d[section][key] = value
    return d


def load_config(path: str | Path | dict | None = None, overrides=()) -> Config:
    """A Config from a YAML file (or a dict of sections; None = all defaults), with dotted
    overrides like 'model.n_layer=2' applied on top."""
    if isinstance(path, dict):
        d = copy.deepcopy(path)
    elif path is None:
        d = {}
    elif isinstance(path, (str, Path)):
        d = read_yaml(Path(path))
    else:
        raise ConfigError(f"load_config takes a YAML path or a dict of sections, got {type(path).__name__}")
    if isinstance(overrides, str):
        overrides = [overrides]
    return Config.from_dict(apply_overrides(d, overrides))


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
