"""Typed configuration: one dataclass per YAML section, recipes by name, dotted overrides.

The dataclass defaults ARE the default recipe (Shakespeare on a laptop CPU, about 4 minutes on 2
cores), so `load_config()` gives the model `python scripts/train.py` trains. Every key carries
its one-line meaning (shown by --help); choice keys are Literal types, and the validation reads
the choices from them. A recipe in configs/ states only what differs from the defaults, and is
loaded by name (`load_config("tiny")`) or by path.

Every mistake (unknown key, wrong type, bad value) raises ConfigError with one line that names
the key and what is allowed, so it never surfaces later as a traceback from inside torch.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml

from .errors import ConfigError, shown
from .system.files import read_yaml
from .system.paths import check_run_dir_path
from .system.recipes import recipe_path

# every integer key fits a signed 64-bit integer, what torch and numpy take (and a number of
# thousands of digits is never carried along to fail later, or formatted into a message)
INT_RANGE = (-(2**63), 2**63 - 1)
# a seed: what torch.manual_seed takes, less the offsets added to it (per rank, per step, for
# evaluation), which must not carry it past 2**64 - 1
SEED_RANGE = (0, 2**63 - 1)


def key(default: Any, doc: str, int_range: tuple[int, int] = INT_RANGE) -> Any:
    """A config key: its default and its one-line meaning (for --help and describe_keys); an
    integer key's allowed range when it is narrower than INT_RANGE."""
    return field(default=default, metadata={"doc": doc, "int_range": int_range})


def _suggest(name: str, allowed, section: str = "") -> str:
    """The hint after an unknown name: the closest allowed one as the user types it (the dotted
    key, model.n_layer, for a key of a section), else the allowed names."""
    close = difflib.get_close_matches(name, list(allowed), n=1) if len(name) <= 100 else []
    dotted = f"{section}." if section else ""
    if close:
        return f" (did you mean '{dotted}{close[0]}'?)"
    names = sorted(allowed)
    more = f" and {len(names) - 16} more: --help lists them all" if len(names) > 16 else ""
    return f" (valid: {', '.join(names[:16])}{more})"


def _range_words(low: int, high: int) -> str:
    words = {2**63 - 1: "2**63 - 1", -(2**63): "-2**63"}
    return f"[{words.get(low, low)}, {words.get(high, high)}]"


def _coerce(where: str, value: Any, typ: Any, int_range: tuple[int, int] = INT_RANGE) -> Any:
    """Check `value` against a field's annotation (int, float, bool, str, or X | None); an int
    must lie in int_range."""
    if typing.get_origin(typ) is Literal:  # a choice: one of the listed strings (or true|false)
        if not any(value == c and type(value) is type(c) for c in typing.get_args(typ)):
            raise ConfigError(f"{where} must be one of {_choices(typ)}, got {shown(value)}")
        return value
    args = typing.get_args(typ)
    words = [w for a in args if typing.get_origin(a) is Literal for w in typing.get_args(a)]
    if args:  # X | None, or X | a word | None (int | Literal["auto"] | None)
        if value is None or (isinstance(value, str) and value in words):
            return value
        typ = next(a for a in args if a is not type(None) and typing.get_origin(a) is not Literal)
    if typ is float and isinstance(value, str):
        try:  # YAML reads '1e-3' as a string
            value = float(value)
        except ValueError:
            pass
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool))
    if not ok:
        raise ConfigError(
            f"{where} must be {', '.join([typ.__name__, *words])}{' or null' if args else ''}, got {shown(value)}"
        )
    if typ is float and not math.isfinite(value):  # nan slips through every < and > check below
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if typ is int and not int_range[0] <= value <= int_range[1]:
        raise ConfigError(f"{where} must be an integer in {_range_words(*int_range)}, got {shown(value)}")
    return value


def _choices(typ: Any) -> str:
    """A Literal's choices as written in YAML: auto|true|false."""
    return "|".join(str(c).lower() if isinstance(c, bool) else c for c in typing.get_args(typ))


class _Section:
    """Shared checks for the config dataclasses: types first, then each section's own rules."""

    _section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            where = f"{self._section}.{f.name}"
            setattr(self, f.name, _coerce(where, getattr(self, f.name), hints[f.name], f.metadata["int_range"]))
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
    name: str = key("shakespeare", "the run's name; its directory is runs/<name> unless run.out_dir is set")
    out_dir: str | None = key(None, "the run directory (null: runs/<name>)")
    seed: int = key(1337, "seed for the weights' initialisation and the batches' order", SEED_RANGE)
    device: Literal["auto", "cpu", "cuda", "mps"] = key("auto", "where to train; auto: cuda, else mps, else cpu")
    init_from: str | None = key(
        None,
        "a minitf run, a Hugging Face model directory or a hub id (Qwen/Qwen3-0.6B) to fine-tune (model.* from it)",
    )
    weights_dtype: Literal["auto", "float32", "bfloat16", "float16"] = key(
        "auto",
        "the dtype of the weights files the run writes (model.safetensors, best, snapshots) and its exports; "
        "auto: init_from's own (a downloaded model's, bfloat16 for most), else float32",
    )

    def validate(self) -> None:
        if not str(self.name).strip():
            raise ConfigError("run.name is empty; give the run a name, e.g. run.name=shakespeare")
        named = "run.name" if self.out_dir is None else "run.out_dir"
        if self.out_dir is None:
            self.out_dir = f"runs/{self.name}"
        if not str(self.out_dir).strip():
            raise ConfigError("run.out_dir is empty; name the run directory, e.g. run.out_dir=runs/mine")
        check_run_dir_path(Path(self.out_dir), named)


@dataclass
class DataConfig(_Section):
    """The text to train on and its tokenizer."""

    _section = "data"
    source: str = key(
        "shakespeare",
        "the corpus: shakespeare, file:PATH (a file or directory), hf:DATASET, repeats or chat (generated)",
    )
    format: Literal["text", "chat", "rl"] = key(
        "text",
        "text: documents to continue; chat: conversations (JSONL messages) to fine-tune on (docs/chat.md); "
        "rl: their questions, answered by the model and rewarded (docs/rl.md)",
    )
    skip_invalid: bool = key(False, "chat: skip (and count) malformed conversations instead of stopping")
    vocab_size: int = key(4096, "byte-level BPE vocabulary trained on the corpus (at least 257)")
    val_fraction: float = key(
        0.1, "share of the text held out for validation, in (0, 0.5]; conversations may take 0 (none held out)"
    )
    text_field: str = key("text", "column holding the text in hf: datasets")
    streaming: bool = key(False, "stream hf: datasets instead of downloading them whole")
    max_documents: int | None = key(None, "cap on documents read from a source (null: all)")
    num_proc: int | None = key(None, "tokenizer processes (null: one per core)")

    def validate(self) -> None:
        if self.vocab_size < 257:
            raise ConfigError(
                f"data.vocab_size must be at least 257 (256 bytes + <|endoftext|>), got {self.vocab_size}"
            )
        if not (0 < self.val_fraction <= 0.5 or (self.val_fraction == 0 and self.format != "text")):
            zero = " (0, nothing held out, is for conversations: data.format=chat)" if self.val_fraction == 0 else ""
            raise ConfigError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction}{zero}")
        self._positive("max_documents", "num_proc")
        if (self.source == "chat") != (self.format != "text") and self.source in ("chat", "shakespeare", "repeats"):
            raise ConfigError(
                f"data.source={self.source} is {'conversations' if self.source == 'chat' else 'text'} but "
                f"data.format={self.format}; fine-tune on conversations with --config chat"
            )


@dataclass
class ModelConfig(_Section):
    """The transformer's shape and its parts."""

    _section = "model"
    vocab_size: int | None = key(None, "set from the tokenizer, not from the file")
    block_size: int = key(256, "context length: the most tokens the model sees at once")
    n_layer: int = key(3, "transformer blocks")
    n_head: int = key(4, "attention heads per block")
    n_kv_head: int | None = key(
        None, "key/value heads, each shared by n_head / n_kv_head query heads (grouped-query attention; null: n_head)"
    )
    n_embd: int = key(128, "width of the residual stream (divisible by n_head)")
    head_dim: int | None = key(None, "each head's width (null: n_embd / n_head; Qwen3-0.6B sets it apart)")
    positions: Literal["learned", "sinusoidal", "rope"] = key(
        "rope", "how token positions enter the model: rope rotates q and k; learned and sinusoidal add a table"
    )
    attention: Literal["sdpa", "reference"] = key(
        "sdpa", "sdpa: torch's fused kernel; reference: the textbook softmax(q k^T / sqrt(d)) v"
    )
    norm: Literal["layernorm", "rmsnorm"] = key("layernorm", "the normalisation before each sub-layer")
    ffn: Literal["gelu", "swiglu", "relu2", "geglu"] = key(
        "gelu", "the feed-forward block's activation (swiglu, geglu: gated by silu or tanh-GELU)"
    )
    gelu: Literal["tanh", "exact"] = key("tanh", "GELU's form: tanh approximation (as GPT-2) or exact erf")
    dropout: float = key(0.0, "dropout probability in [0, 1)")
    ffn_hidden: int | None = key(None, "the feed-forward block's hidden width (null: 4 x n_embd, swiglu about 8/3 x)")
    norm_eps: float = key(1e-5, "epsilon of every norm (and of the q/k norm)")
    bias: bool = key(True, "biases in the linear layers and norms")
    qkv_bias: bool | None = key(None, "biases on the q, k, v projection (null: as model.bias; Qwen2 has only these)")
    tie_embeddings: bool = key(True, "the LM head shares the token embedding (false: its own, initialised to zero)")
    rope_base: float = key(10000.0, "rotary positions' base (positions=rope)")
    rope_scaling: Literal["none", "linear", "llama3"] = key(
        "none",
        "stretch rotary positions for a longer context: linear divides every frequency by rope_factor, "
        "llama3 only the slow ones (Llama 3.1+)",
    )
    rope_factor: float = key(1.0, "rope_scaling's factor (Llama 3.2: 32)")
    rope_low_freq_factor: float = key(1.0, "rope_scaling=llama3: wavelengths above original_context / this are scaled")
    rope_high_freq_factor: float = key(4.0, "rope_scaling=llama3: wavelengths below original_context / this are kept")
    rope_original_context: int = key(8192, "rope_scaling=llama3: the context the model was first trained with")
    qk_norm: bool = key(False, "RMS-normalise each head's queries and keys before q @ k^T (with a learned gain)")
    sliding_window: int | None = key(None, "each query sees only the last this many keys, itself included (null: all)")
    global_every: int | None = key(
        None, "with sliding_window: every this many layers, the last one sees all keys (Gemma 3: 6; null: none does)"
    )
    rope_local_base: float | None = key(None, "the sliding layers' rotary base, with global_every (Gemma 3: 10000)")
    attn_scale: float | None = key(None, "the scores' scale (null: 1/sqrt(head width); Gemma 3: 1/sqrt(256))")
    embed_scale: bool = key(False, "multiply the token embeddings by sqrt(n_embd) (Gemma)")
    sandwich_norm: bool = key(False, "also normalise each sub-layer's output before it is added (Gemma 2 and 3)")
    family: Literal["auto", "gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3", "gptneox"] = key(
        "auto", "the standard architecture export writes (set by an import; auto: the first that computes the model)"
    )
    logit_softcap: float | None = key(None, "logits -> cap * tanh(logits / cap) (null: off)")

    def validate(self) -> None:
        self._positive(
            "vocab_size",
            "block_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "head_dim",
            "ffn_hidden",
            "norm_eps",
            "rope_base",
            "rope_factor",
            "rope_low_freq_factor",
            "rope_high_freq_factor",
            "rope_original_context",
            "sliding_window",
            "global_every",
            "rope_local_base",
            "attn_scale",
            "logit_softcap",
        )
        if self.head_dim is None and self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        if self.n_head % self.kv_heads:
            raise ConfigError(
                f"model.n_head ({self.n_head}) must be divisible by model.n_kv_head ({self.n_kv_head}): "
                f"each key/value head serves the same number of query heads"
            )
        if self.positions == "rope" and self.head_size % 2:
            raise ConfigError(f"model.positions=rope needs an even head size, got {self.head_size}")
        self._check_rope_scaling()
        if (self.global_every is not None or self.rope_local_base is not None) and self.sliding_window is None:
            raise ConfigError(
                "model.global_every and model.rope_local_base set the sliding layers apart: set model.sliding_window"
            )
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")

    def _check_rope_scaling(self) -> None:
        """The rope_* keys say something only with rope positions and a scaling that reads them."""
        moved = [k for k in ROPE_SCALING_KEYS if getattr(self, k) != ROPE_SCALING_DEFAULTS[k]]
        reads = {"none": (), "linear": ("rope_factor",), "llama3": ROPE_SCALING_KEYS}[self.rope_scaling]
        idle = [k for k in moved if k not in reads]
        if self.rope_scaling != "none" and self.positions != "rope":
            raise ConfigError(f"model.rope_scaling={self.rope_scaling} needs model.positions=rope")
        if idle:
            raise ConfigError(
                f"model.{idle[0]}={getattr(self, idle[0])} does nothing with model.rope_scaling={self.rope_scaling}; "
                f"remove it, or set model.rope_scaling={'llama3' if idle[0] != 'rope_factor' else 'linear'}"
            )
        if self.rope_scaling == "llama3" and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ConfigError(
                f"model.rope_high_freq_factor ({self.rope_high_freq_factor}) must be above "
                f"model.rope_low_freq_factor ({self.rope_low_freq_factor})"
            )

    def slides(self, layer: int) -> bool:
        """Whether block `layer` sees only the last sliding_window keys (else all of them)."""
        if self.sliding_window is None:
            return False
        return self.global_every is None or (layer + 1) % self.global_every != 0

    @property
    def head_size(self) -> int:
        """Each head's width: model.head_dim, or n_embd / n_head."""
        return self.head_dim or self.n_embd // self.n_head

    @property
    def attn_width(self) -> int:
        """The query heads side by side, n_head x head_size: n_embd unless model.head_dim sets it apart."""
        return self.n_head * self.head_size

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the q, k, v projection has biases: model.qkv_bias, or model.bias."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or one per query head."""
        return self.n_kv_head or self.n_head


# LoRA's settings beside its rank: set without a rank, they would do nothing
# train.activation_checkpointing=auto turns it on from this size: the downloaded models people
# fine-tune on a laptop (Qwen3-0.6B, Llama-3.2-1B) keep their activations out of its memory, while
# GPT-2's 124M (the GPU benchmark) and the recipes' small models keep the third of compute it costs
CHECKPOINT_ABOVE = 300 * 10**6
LORA_KEYS = ("lora_alpha", "lora_targets", "lora_dropout", "lora_lr_scale")

# the keys that shape rope_scaling, and the values that mean "not set"
ROPE_SCALING_KEYS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context")
ROPE_SCALING_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in ROPE_SCALING_KEYS}

# the steps the default recipe's 210 s buy on a typical 2-core CPU (Muon, the default model): what
# train.typical_steps=auto means for a run with Muon. The AdamW recipes were not measured.
TYPICAL_STEPS = 1100


@dataclass
class TrainConfig(_Section):
    """The optimisation: batch, budget, optimizer and schedule, evaluation, checkpoints, logging.

    The default budget is wall-clock (max_seconds) and the LR schedule follows it, so the run
    anneals properly on any machine. Muon trains the blocks' matrices (muon_lr), AdamW the
    embeddings, head, norms and biases (lr): both chosen by measurement (configs/shakespeare-v1.yaml
    is the AdamW-only recipe they were measured against)."""

    _section = "train"
    batch_size: int = key(8, "sequences per micro-batch")
    grad_accum: int = key(1, "micro-batches per optimizer step")
    max_steps: int = key(100000, "optimizer steps (a cap when max_seconds is set)")
    max_seconds: float | None = key(210.0, "wall-clock budget; the LR schedule then follows elapsed time (null: off)")
    optimizer: Literal["adamw", "muon"] = key(
        "muon",
        "muon: Muon for the blocks' matrices, AdamW (lr) for the rest; adamw: AdamW for all (the default "
        "with lora_rank, param_dtype=bfloat16, parallel=fsdp or a downloaded init_from)",
    )
    lr: float = key(4e-3, "AdamW's peak learning rate")
    min_lr: float | None = key(None, "the schedule's floor (null: lr / 10); Muon's follows in proportion")
    muon_lr: float = key(0.02, "Muon's peak learning rate (optimizer=muon)")
    muon_momentum: float = key(0.95, "Muon's momentum, in [0, 1)")
    warmup_steps: int = key(50, "steps of linear LR warm-up")
    weight_decay: float = key(0.1, "decoupled weight decay on the matrices")
    beta1: float = key(0.9, "AdamW's beta1, in [0, 1)")
    beta2: float = key(0.95, "AdamW's beta2, in [0, 1)")
    grad_clip: float = key(1.0, "clip the gradient's global norm to this (0: off; the norm is still logged)")
    eval_every: int = key(250, "steps between evaluations (val loss, bits per byte, a sample)")
    eval_batches: int = key(10, "batches per evaluation")
    eval_metric: Literal["exact_answers", "rewards"] | None = key(
        None,
        "a metric each evaluation adds to the loss: exact_answers, held-out questions answered exactly "
        '(the generated chat corpus\'s, or conversations that give an "answer"; the chat recipe sets it); '
        "rewards: those and the rewards since the last evaluation (data.format=rl)",
    )
    ckpt_every: int = key(250, "steps between checkpoints (and at the end, and on Ctrl-C or SIGTERM)")
    log_every: int = key(10, "steps between steps.jsonl rows (loss, LR) and progress-bar updates")
    snapshot_every: int = key(
        0, "keep the weights every N steps in <run>/snapshots/, for minitf heads (0: off; small models only)"
    )
    logger: Literal["jsonl", "tensorboard"] = key("jsonl", "tensorboard: event files in <run>/tensorboard too")
    typical_steps: int | Literal["auto"] | None = key(
        "auto",
        "steps the budget gives on a typical 2-core CPU; far fewer get a warning (auto: the default recipe's "
        f"{TYPICAL_STEPS} with optimizer=muon, no check with adamw; null: no check)",
    )
    fit_budget: bool = key(
        True,
        "a new run of the default model under max_seconds times a few steps first; if the budget buys under "
        "1,300, it trains 2 layers at 1.5x the learning rates, which learn more in a short budget (docs/training.md)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = key(
        "auto", "auto: bfloat16 autocast on CUDA and on CPUs with native bf16, else float32"
    )
    param_dtype: Literal["float32", "bfloat16"] = key(
        "float32",
        "the trained weights' dtype: bfloat16 holds them, their gradients and AdamW's moments in 2 bytes each "
        "(8 a parameter, not 16: a full fine-tune in half the memory), updated with stochastic rounding so that "
        "small steps still move them; needs bfloat16 compute and AdamW (docs/training.md)",
    )
    optimizer_in_backward: bool = key(
        False,
        "with train.param_dtype=bfloat16: update each weight the moment backward finishes its gradient and let the "
        "gradient go, so a step never holds them all (2 bytes a parameter less at the peak); gives up clipping, so "
        "it needs train.grad_clip=0, and train.grad_accum=1 on one process (docs/training.md)",
    )
    compile: bool = key(
        False,
        "torch.compile each block and the head with its loss (seconds of the budget to compile; "
        "measured no faster on a CPU, docs/performance.md)",
    )
    max_bad_steps: int = key(10, "non-finite steps in a row before training stops")
    parallel: Literal["ddp", "fsdp"] = key(
        "ddp", "under torchrun: ddp copies the model to every process, fsdp shards it"
    )
    activation_checkpointing: Literal["auto", True, False] = key(
        "auto",
        "recompute each block in backward: less memory, ~1/3 more compute (auto: on for a model of "
        f"{CHECKPOINT_ABOVE // 10**6}M parameters or more, a downloaded one such as Qwen3-0.6B)",
    )
    lora_rank: int = key(0, "LoRA through peft: the adapters' rank; the model is frozen, only they train (0: off)")
    lora_alpha: float = key(16.0, "LoRA's alpha: the adapters' update is scaled by lora_alpha / lora_rank")
    lora_targets: str = key(
        "c_attn,c_proj,c_fc", "the linear layers LoRA adapts, by name (c_proj: attn.c_proj and mlp.c_proj)"
    )
    lora_dropout: float = key(0.0, "dropout on LoRA's input, in [0, 1)")
    lora_lr_scale: float = key(
        5.0,
        "a LoRA run's rates are train.lr and train.min_lr times this: low-rank factors learn slower than whole "
        "matrices at one rate (docs/chat.md)",
    )

    def checkpoints_blocks(self, params: int) -> bool:
        """Whether the blocks recompute their activations in backward, for a model of `params` parameters."""
        return params >= CHECKPOINT_ABOVE if self.activation_checkpointing == "auto" else self.activation_checkpointing

    @property
    def rate_scale(self) -> float:
        """What the schedule's rates are multiplied by: lora_lr_scale in a LoRA run, else 1."""
        return self.lora_lr_scale if self.lora_rank else 1.0

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
        if self.typical_steps == "auto":
            self.typical_steps = TYPICAL_STEPS if self.optimizer == "muon" else None
        if self.min_lr is None:  # a tenth of the peak, whatever lr a recipe or override sets
            self.min_lr = self.lr / 10
        if self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr must be in [0, train.lr={self.lr}], got {self.min_lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ConfigError("train.warmup_steps, train.weight_decay and train.grad_clip must be >= 0")
        if self.snapshot_every < 0:
            raise ConfigError(f"train.snapshot_every must be >= 0 (0: off), got {self.snapshot_every}")
        for n in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, n) < 1:
                raise ConfigError(f"train.{n} must be in [0, 1), got {getattr(self, n)}")
        if self.parallel == "fsdp" and self.dtype == "float16":  # its GradScaler does not see the other shards
            raise ConfigError("train.parallel=fsdp does not support train.dtype=float16; use bfloat16 or float32")
        if self.parallel == "fsdp" and self.optimizer == "muon":  # Newton-Schulz needs whole matrices, not shards
            raise ConfigError("train.parallel=fsdp does not support train.optimizer=muon; use adamw or parallel=ddp")
        if self.lora_rank < 0 or self.lora_alpha <= 0 or self.lora_lr_scale <= 0 or not 0 <= self.lora_dropout < 1:
            raise ConfigError(
                "train.lora_rank must be >= 0 (0: off), train.lora_alpha and train.lora_lr_scale > 0, and "
                "train.lora_dropout in [0, 1)"
            )
        if self.lora_rank and self.optimizer == "muon":  # Newton-Schulz would orthogonalise each low-rank factor
            raise ConfigError(
                "train.lora_rank trains with AdamW (Muon is for whole matrices, not low-rank factors); "
                "remove train.optimizer=muon"
            )
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        idle = [k for k in LORA_KEYS if getattr(self, k) != defaults[k]] if not self.lora_rank else []
        if idle:  # a setting that does nothing says so
            raise ConfigError(
                f"train.{idle[0]}={getattr(self, idle[0])} does nothing without train.lora_rank; set train.lora_rank "
                f"(e.g. 16) to fine-tune with LoRA, or remove it"
            )
        if self.param_dtype == "bfloat16":
            self._check_bfloat16_weights()
        if self.optimizer_in_backward:
            self._check_in_backward()
        if self.lora_rank and self.parallel == "fsdp":  # a frozen model needs no shards of optimizer state
            raise ConfigError("train.lora_rank does not support train.parallel=fsdp; use parallel=ddp")
        if self.parallel == "fsdp" and self.snapshot_every:  # snapshots are for small models, which need no shards
            raise ConfigError("train.snapshot_every is for small models, not train.parallel=fsdp; use parallel=ddp")

    def _check_bfloat16_weights(self) -> None:
        """train.param_dtype=bfloat16 goes with bfloat16 compute, AdamW, a full model and one copy per process."""
        clash = {
            "optimizer": (self.optimizer == "muon", "its stochastic rounding is AdamW's"),
            "dtype": (self.dtype in ("float32", "float16"), "a bfloat16 weight is read by bfloat16 products"),
            "lora_rank": (self.lora_rank > 0, "LoRA already holds its frozen weights in 16 bits"),
            "parallel": (self.parallel == "fsdp", "FSDP keeps float32 shards of its own"),
        }
        for name, (clashes, why) in clash.items():
            if clashes:
                raise ConfigError(
                    f"train.param_dtype=bfloat16 does not go with train.{name}={getattr(self, name)} ({why}); "
                    f"remove one of them"
                )

    def _check_in_backward(self) -> None:
        """train.optimizer_in_backward updates each bfloat16 weight from its own gradient as it comes."""
        needs = {
            "param_dtype": (
                "bfloat16",
                self.param_dtype == "bfloat16",
                "only the optimizer of bfloat16 weights updates in backward",
            ),
            "grad_clip": (0, not self.grad_clip, "clipping needs every gradient before the first update"),
            "grad_accum": (1, self.grad_accum == 1, "each micro-batch's gradient would update the weights"),
        }
        for name, (value, met, why) in needs.items():
            if not met:
                raise ConfigError(
                    f"train.optimizer_in_backward=true needs train.{name}={value} ({why}), not "
                    f"{getattr(self, name)}; set train.{name}={value}, or remove train.optimizer_in_backward"
                )


# The sampler computes in float32 (largest 3.4e38; below 1.4e-45 a number is 0). A repetition
# penalty in this range, or a temperature up to its top, divides or multiplies a logit of up to
# +-1e4 into at most +-1e34, finite with room to spare; outside it float32 makes the value 0 or
# inf, and the logits nan (0 / 0, inf - inf, 0 * inf): garbage text and null logprobs. A tiny
# temperature needs no floor here: the sampler divides by float32's smallest number at least.
SCALE_RANGE = (1e-30, 1e30)
SCALE_WORDS = "[1e-30, 1e30]"


def check_sampling(temperature: float, top_k, top_p, repetition_penalty: float, where: str = "") -> None:
    """The sampling settings' ranges, one ConfigError line each; where: "sample." for the config's
    keys, "" for sample_next_token's arguments. Also refuses nan (no comparison holds for it)."""
    lo, hi = SCALE_RANGE
    if not temperature >= 0:
        raise ConfigError(f"{where}temperature must be >= 0 (0 = greedy), got {temperature}")
    if not temperature <= hi:  # a tiny one is fine: the sampler divides by float32's smallest at least
        raise ConfigError(
            f"{where}temperature must be at most {hi:g} (0 = greedy), where float32 sampling stays finite; "
            f"got {temperature}"
        )
    if top_k is not None and (isinstance(top_k, bool) or not hasattr(type(top_k), "__index__")):
        raise ConfigError(f"{where}top_k must be a whole number >= 0 (0 or null = off), got {top_k!r}")
    if top_k is not None and top_k < 0:
        raise ConfigError(f"{where}top_k must be >= 0 (0 or null = off), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"{where}top_p must be in (0, 1], got {top_p}")
    if not lo <= repetition_penalty <= hi:
        raise ConfigError(
            f"{where}repetition_penalty must be in {SCALE_WORDS} (1 = off), where float32 logits divided or "
            f"multiplied by it stay finite; got {repetition_penalty}"
        )


@dataclass
class SampleConfig(_Section):
    """Sampling: the defaults of generate, the explorer and the samples shown while training."""

    _section = "sample"
    prompt: str = key(
        "Romeo.\n", "text to continue (how this corpus writes a speaker: the name, a full stop, a new line)"
    )
    max_new_tokens: int = key(300, "tokens to generate")
    temperature: float = key(0.8, "softmax temperature (0: greedy; at most 1e30)")
    top_k: int | None = key(50, "sample among the k likeliest tokens (0 or null: all)")
    top_p: float | None = key(None, "nucleus: sample within the smallest set reaching p, in (0, 1] (null: off)")
    repetition_penalty: float = key(
        1.0, "penalise tokens already in the text (CTRL: positive logits / it, negative * it; 1: off), in [1e-30, 1e30]"
    )
    seed: int | None = key(None, "a seed makes the text repeatable (null: random)", SEED_RANGE)

    def validate(self) -> None:
        """Checked here once, for the config file, the command line and generate() alike."""
        if self.max_new_tokens <= 0:
            raise ConfigError(f"sample.max_new_tokens must be positive, got {self.max_new_tokens}")
        check_sampling(self.temperature, self.top_k, self.top_p, self.repetition_penalty, "sample.")


@dataclass
class RLConfig(_Section):
    """Reinforcement learning (data.format=rl, docs/rl.md): answers sampled in groups and rewarded."""

    _section = "rl"
    group_size: int = key(8, "answers sampled per prompt; train.batch_size (answers per micro-batch) is a multiple")
    answer_tokens: int = key(16, "the most tokens a sampled answer may take")
    reward: str = key("exact", "exact (the answer is the prompt's expected answer) or module:function (docs/rl.md)")

    def validate(self) -> None:
        self._positive("answer_tokens")
        if self.group_size < 2:  # one answer has nothing to be compared with: its advantage is always 0
            raise ConfigError(f"rl.group_size must be at least 2 (answers compared in a group), got {self.group_size}")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    # the dotted keys a recipe, a dict or an override set ("model.n_layer"), as opposed to the
    # defaults: a value the user chose is kept where minitf would otherwise choose one (the
    # budget's depth, a fine-tune's rates). Not a field, nor annotated (code that reads the
    # sections from the type hints would take it for one): config.yaml and equality ignore it.
    given = frozenset()

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        check_names(d)
        hints = typing.get_type_hints(cls)
        cfg = cls(**{name: hints[name](**(body or {})) for name, body in _adamw_by_default(d).items()})
        cfg.given = frozenset(f"{name}.{key}" for name, body in d.items() for key in body or {})
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _adamw_by_default(d: dict) -> dict:
    """d, with train.optimizer=adamw where train.lora_rank > 0, train.param_dtype=bfloat16 or
    train.parallel=fsdp and no optimizer is given: Muon would orthogonalise each low-rank factor,
    bfloat16 weights are AdamW's, and Newton-Schulz needs whole matrices where FSDP holds shards, so
    AdamW is their default (a Muon asked for by name is refused by TrainConfig)."""
    train = d.get("train") or {}
    rank = train.get("lora_rank")
    lora = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
    adamw_only = lora or train.get("param_dtype") == "bfloat16" or train.get("parallel") == "fsdp"
    if adamw_only and "optimizer" not in train:
        return {**d, "train": {**train, "optimizer": "adamw"}}
    return d


def _sections() -> dict[str, set[str]]:
    """{section: its keys}, from the dataclasses."""
    hints = typing.get_type_hints(Config)
    return {f.name: {k.name for k in dataclasses.fields(hints[f.name])} for f in dataclasses.fields(Config)}


def _unknown_names(d: dict) -> list[tuple[str, str | None]]:
    """(section, key) for every section (key None) and key of d that this version has no field
    for, in file order. A section or key that is not a word (YAML reads `1:` as a number and
    `~:` as null), or a section that is not a mapping, is a ConfigError at once."""
    if not isinstance(d, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(d).__name__}")
    known, found = _sections(), []
    for name, body in d.items():
        if not isinstance(name, str):
            raise ConfigError(f"a config section is named {_not_a_word(name)}; the sections are {', '.join(known)}")
        if name not in known:
            found.append((name, None))
            continue
        if body is not None and not isinstance(body, dict):
            raise ConfigError(f"config section '{name}' must be a mapping, got {shown(body)}")
        for key in body or {}:
            if not isinstance(key, str):
                raise ConfigError(
                    f"a key of section '{name}' is {_not_a_word(key)}; keys are words, e.g. {name}.{min(known[name])}"
                )
            if key not in known[name]:
                found.append((name, key))
    return found


def _not_a_word(name) -> str:
    """How a section or key YAML read as something else than text is named: `1:` is a number, `~:` null."""
    if name is None:
        return "null (~, or nothing before the colon), not a word"
    kind = "true/false" if isinstance(name, bool) else "a number" if isinstance(name, (int, float)) else "not text"
    return f"{shown(name)}, {kind}, not a word"


def _unknown_message(section: str, key: str | None) -> str:
    known = _sections()
    if key is None:
        return f"unknown config section {shown(section)}{_suggest(section, known)}"
    return f"unknown config key {shown(f'{section}.{key}')}{_suggest(key, known[section], section)}"


def check_names(d: dict, origin: str | Path | None = None) -> None:
    """Every section and key of d is one this version has, or a ConfigError naming the first
    that is not (after origin, the file it came from, when given)."""
    prefix = f"{origin}: " if origin is not None else ""
    try:
        unknown = _unknown_names(d)
    except ConfigError as e:
        raise ConfigError(f"{prefix}{e}") from None
    if unknown:
        raise ConfigError(f"{prefix}{_unknown_message(*unknown[0])}")


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
        except ValueError:  # an integer of more digits than Python turns into a number (4300)
            raise ConfigError(
                f"override {dotted.strip()}= holds a number of {len(raw.strip()):,} digits, too long to be "
                f"any setting; give a smaller value"
            ) from None
        if isinstance(value, (dict, list)):  # every key holds a scalar: 'sample.prompt=ROMEO:' means the text
            value = raw
        d.setdefault(section, {})
        if not isinstance(d[section], dict):
            raise ConfigError(f"config section '{section}' must be a mapping")
        d[section][key] = value
    return d


def read_config_file(name_or_path: str | Path) -> dict:
    """A recipe (by name) or YAML file (by path) as a dict of sections, each section and key one
    this version knows (else a ConfigError naming the file)."""
    path = recipe_path(name_or_path)
    d = read_yaml(path)
    check_names(d, path)
    return d


def load_run_config(path: str | Path) -> Config:
    """A trained run's config.yaml as a reader of the run needs it (generate, evaluate, export).

    A key this version does not know (the run was written by a newer minitf, or edited) is an
    error when it is a model key: the weights mean what the model keys say, so a model built
    without one would be another model. Elsewhere (how the run was trained, sampled, where it
    ran) it is left out with a warning naming the file and the keys: reading the weights does
    not need it. Resuming the run reads it strictly (read_config_file): training does."""
    path = Path(path)
    d = read_yaml(path)
    try:
        unknown = _unknown_names(d)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    model = [(s, k) for s, k in unknown if s == "model"]
    if model:
        raise ConfigError(
            f"{path}: {_unknown_message(*model[0])}; this minitf cannot build that model: "
            f"upgrade minitf to the version that wrote the run"
        )
    if unknown:
        names = [s if k is None else f"{s}.{k}" for s, k in unknown]
        warnings.warn(
            f"{path}: leaving out {', '.join(shown(n, 40) for n in names[:5])}{' ...' if len(names) > 5 else ''}, "
            f"unknown to this minitf (not needed to read the model)",
            stacklevel=2,
        )
        for section, key in unknown:
            if key is None:
                d.pop(section)
            else:
                d[section].pop(key)
    return Config.from_dict(d)


def load_config(path: str | Path | dict | None = None, overrides=()) -> Config:
    """A Config from a recipe name ("tiny"), a YAML file or a dict of sections (None: the defaults,
    which are the default recipe), with dotted overrides like 'model.n_layer=2' applied on top."""
    if isinstance(path, dict):
        check_names(path)  # before the copy: a mapping that is not a config is never copied whole
        d = copy.deepcopy(path)
    elif path is None:
        d = {}
    elif isinstance(path, (str, Path)):
        d = read_config_file(path)
    else:
        raise ConfigError(
            f"load_config takes a recipe name, a YAML path or a dict of sections, got {type(path).__name__}"
        )
    if isinstance(overrides, str):
        overrides = [overrides]
    return Config.from_dict(apply_overrides(d, overrides))


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def describe_keys(cfg: Config | None = None) -> str:
    """Every key with the value cfg gives it (default: the defaults), its choices and its meaning, for --help."""
    cfg = cfg or Config()
    rows = []
    for sec in dataclasses.fields(Config):
        section = getattr(cfg, sec.name)
        hints = typing.get_type_hints(type(section))
        rows.append((f"  {sec.name}:", ""))
        for f in dataclasses.fields(section):
            choice = typing.get_origin(hints[f.name]) is Literal
            doc = (f"[{_choices(hints[f.name])}] " if choice else "") + f.metadata["doc"]
            rows.append((f"    {sec.name}.{f.name} = {getattr(section, f.name)!r}", doc))
    width = max(len(left) for left, _ in rows)
    return "\n".join(f"{left:<{width}}  {doc}".rstrip() for left, doc in rows)
