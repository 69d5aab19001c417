"""config.json both ways: the transformers config that describes a minitf model (export), and the
minitf model an HF config.json describes (import), with every setting minitf cannot compute named.

    option set (minitf.export.architecture)          written as
    positions=learned|sinusoidal layernorm gelu tanh  GPT2LMHeadModel
    positions=rope rmsnorm swiglu (bias either way)   LlamaForCausalLM (attention_bias = mlp_bias = model.bias)
    the same with qk_norm=true bias=false             Qwen3ForCausalLM (q_norm/k_norm weights one)
    positions=rope layernorm gelu tanh                GPTNeoXForCausalLM (use_parallel_residual=false)

The tensors' names and layouts are minitf.export.weights'; this module reads and writes only the
settings.
"""

from __future__ import annotations

import re

from ..config import ModelConfig
from ..errors import ConfigError, MinitfError, shown
from ..system.memory import physical_memory, size_words
from ..system.sizes import ffn_hidden, model_floats, swiglu_hidden
from .architecture import FORMAT_NAMES
from .weights import TABLES

# HF model_type -> minitf format
MODEL_TYPES = {table.model_type: fmt for fmt, table in TABLES.items()}
# HF activation names -> model.gelu; gelu_new, gelu_fast and gelu_pytorch_tanh are one formula
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
# the config.json keys that fix a model's shape: without them a default (GPT-2 small, say) would not fit the weights
SHAPE_KEYS = {
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
    "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"),
}
# the type every other config.json key minitf reads must have: a downloaded file may hold anything
# (null: the key's default, where transformers reads null as unset)
KEY_TYPES = {
    **dict.fromkeys(("n_inner", "num_key_value_heads", "head_dim", "sliding_window"), "a positive integer or null"),
    **dict.fromkeys(("max_position_embeddings", "n_positions"), "a positive integer"),
    **dict.fromkeys(
        ("rope_theta", "rotary_emb_base", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"), "a positive number"
    ),
    **dict.fromkeys(("partial_rotary_factor", "rotary_pct"), "a number in (0, 1]"),
    **dict.fromkeys(
        (
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "use_parallel_residual",
            "use_sliding_window",
            "scale_attn_weights",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "add_cross_attention",
        ),
        "true or false",
    ),  # fmt: skip
    **dict.fromkeys(("hidden_act", "activation_function", "hidden_activation"), "a string"),
    **dict.fromkeys(("query_pre_attn_scalar", "rope_local_base_freq"), "a positive number"),
    **dict.fromkeys(("final_logit_softcapping", "attn_logit_softcapping"), "a positive number or null"),
    "sliding_window_pattern": "a positive integer or null",
    **dict.fromkeys(("rope_scaling", "rope_parameters"), "an object or null"),
    "layer_types": "a list of strings or null",
}
# minitf's ModelConfig key -> the config.json key it comes from, to name a refused value by the file's name
HF_KEYS = {
    "gpt2": dict(block_size="n_positions", ffn_hidden="n_inner", norm_eps="layer_norm_epsilon"),
    "llama": dict(block_size="max_position_embeddings", ffn_hidden="intermediate_size", norm_eps="rms_norm_eps"),
    "gptneox": dict(block_size="max_position_embeddings", ffn_hidden="intermediate_size", norm_eps="layer_norm_eps"),
}
ROTARY_KEYS = dict(
    n_layer="num_hidden_layers", n_head="num_attention_heads", n_kv_head="num_key_value_heads", n_embd="hidden_size"
)


# ---------------------------------------------------------------------------------------------
# minitf -> Hugging Face


def hf_config(cfg: ModelConfig, fmt: str, eot_id: int) -> dict:
    """The keyword arguments of `fmt`'s transformers config class that describe `cfg`'s model."""
    common = dict(vocab_size=cfg.vocab_size, bos_token_id=eot_id, eos_token_id=eot_id)
    common["tie_word_embeddings"] = cfg.tie_embeddings
    if fmt == "gpt2":
        return dict(
            common,
            n_positions=cfg.block_size,
            n_embd=cfg.n_embd,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_inner=ffn_hidden(cfg),
            activation_function="gelu_new",
            layer_norm_epsilon=cfg.norm_eps,
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
        )
    rope = hf_rope(cfg)
    shape = dict(
        common,
        hidden_size=cfg.n_embd,
        intermediate_size=ffn_hidden(cfg),
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        max_position_embeddings=cfg.block_size,
        attention_dropout=cfg.dropout,
    )
    if fmt == "gptneox":
        return dict(
            shape,
            hidden_act="gelu_pytorch_tanh",  # F.gelu(approximate="tanh"), minitf's own op
            layer_norm_eps=cfg.norm_eps,
            use_parallel_residual=False,  # minitf runs attention, then the MLP on its result
            rope_parameters={**rope, "partial_rotary_factor": 1.0},  # every dimension rotates
            attention_bias=True,
            hidden_dropout=cfg.dropout,
        )
    if fmt == "gemma3":
        return _gemma3_config(cfg, shape, rope, eot_id)
    llama = dict(
        shape,
        num_key_value_heads=cfg.kv_heads,
        hidden_act="silu",
        rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope,
    )
    if fmt == "phi3":  # its embedding's padding_idx is pad_token_id, which must be a token of the model
        return dict(llama, sliding_window=cfg.sliding_window, pad_token_id=eot_id, resid_pdrop=cfg.dropout)
    if fmt == "qwen2":  # its q, k, v biases are always there; no head_dim key
        return dict(llama, use_sliding_window=False)
    llama["head_dim"] = cfg.head_size
    if fmt == "mistral":
        return dict(llama, sliding_window=cfg.sliding_window)
    return (
        dict(llama, attention_bias=cfg.bias)
        if fmt == "qwen3"
        else dict(llama, attention_bias=cfg.bias, mlp_bias=cfg.bias)
    )


def _gemma3_config(cfg: ModelConfig, shape: dict, rope: dict, eot_id: int) -> dict:
    """Gemma3TextConfig's keyword arguments: the layers' kinds, each kind's rotary settings, the scale."""
    kinds = ["sliding_attention" if cfg.slides(i) else "full_attention" for i in range(cfg.n_layer)]
    local = {"rope_type": "default", "rope_theta": cfg.rope_local_base or cfg.rope_base}
    return dict(
        shape,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_size,
        hidden_activation="gelu_pytorch_tanh",  # F.gelu(approximate="tanh"), GeGLU's gate
        rms_norm_eps=cfg.norm_eps,
        query_pre_attn_scalar=round(cfg.attn_scale**-2) if cfg.attn_scale else cfg.head_size,
        sliding_window=cfg.sliding_window,
        layer_types=kinds,
        rope_parameters={"full_attention": rope, "sliding_attention": local},
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        attention_bias=False,
        pad_token_id=eot_id,  # its embedding's padding_idx must be a token of the model
    )


def hf_rope(cfg: ModelConfig) -> dict:
    """config.json's rope_parameters for cfg's rotary positions, scaling included."""
    rope = {"rope_type": "default" if cfg.rope_scaling == "none" else cfg.rope_scaling, "rope_theta": cfg.rope_base}
    if cfg.rope_scaling != "none":
        rope["factor"] = cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        rope.update(
            low_freq_factor=cfg.rope_low_freq_factor,
            high_freq_factor=cfg.rope_high_freq_factor,
            original_max_position_embeddings=cfg.rope_original_context,
        )
    return rope


# ---------------------------------------------------------------------------------------------
# Hugging Face -> minitf

# rotary tables a downloaded config may ask for beyond its weights' own size: minitf builds one row
# per position of max_position_embeddings (a 128K context with 128-dimension heads takes 0.4 GB)
TABLE_ALLOWANCE = 1 << 30


def model_config(config: dict, vocab_size: int | None, where) -> tuple[str, ModelConfig]:
    """(the format, the ModelConfig) that config.json describes, dropout off; vocab_size: that
    many rows of the embedding and head (the tokenizer's), where the file may hold more. Every
    setting minitf cannot compute is named in one MinitfError."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise MinitfError(
            f"{where} holds a {model_type!r} model; minitf imports {', '.join(sorted(MODEL_TYPES))} "
            f"({', '.join(FORMAT_NAMES.values())})"
        )
    fmt = MODEL_TYPES[model_type]
    _check_shape_keys(config, fmt, where)
    _check_types(config, where)
    options, problems = _options(config, fmt)
    if problems:
        verb = "has" if len(problems) == 1 else "have"
        raise MinitfError(
            f"{where}: {FORMAT_NAMES[fmt]} config {', '.join(problems)} {verb} no minitf equivalent; "
            f"minitf imports the plain architecture only"
        )
    hf_vocab = config["vocab_size"]
    if vocab_size is not None and vocab_size > hf_vocab:
        raise MinitfError(f"{where}: the tokenizer has {vocab_size} tokens but the model only {hf_vocab} rows")
    try:
        return fmt, ModelConfig(vocab_size=vocab_size or hf_vocab, dropout=0.0, **options)
    except ConfigError as e:  # a value the checks above let through: named by its config.json key
        keys = {**ROTARY_KEYS, **HF_KEYS["gpt2" if fmt == "gpt2" else "gptneox" if fmt == "gptneox" else "llama"]}
        keys["rope_base"] = "rotary_emb_base" if fmt == "gptneox" else "rope_theta"
        text = re.sub(r"model\.(\w+)", lambda m: keys.get(m.group(1), m.group(1)), str(e))
        raise MinitfError(f"{where}: config.json: {text}; correct config.json or fetch the model again") from None


def _check_shape_keys(config: dict, fmt: str, where) -> None:
    """The config.json keys that fix the model's shape are there, as positive integers: a minimal
    config.json would otherwise give transformers' defaults, which do not fit the weights."""
    keys = SHAPE_KEYS["gpt2" if fmt == "gpt2" else "llama"]
    absent = [k for k in keys if k not in config]
    if absent:
        raise MinitfError(
            f"{where}: config.json lacks {', '.join(absent)}, which fix the model's shape; "
            f"use the config.json that save_pretrained wrote beside the weights"
        )
    wrong = [f"{k}={config[k]!r}" for k in keys if type(config[k]) is not int or config[k] < 1]
    if wrong:
        raise MinitfError(f"{where}: config.json has {', '.join(wrong)}; each must be a positive integer")


def _check_types(config: dict, where) -> None:
    """Every config.json key minitf reads holds the type transformers gives it (KEY_TYPES), so a
    downloaded file's "2" or "abc" is one line naming the key, never a traceback further on."""
    wrong = [f"{k}={shown(config[k])} ({KEY_TYPES[k]})" for k in KEY_TYPES if k in config and not _fits(config, k)]
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        for sub in value.values() if isinstance(value, dict) and _nested(config, value) else [value]:
            if isinstance(sub, dict):  # the rotary settings inside: the same types as at the top level
                wrong += [f"{key}.{k}={shown(sub[k])} ({KEY_TYPES[k]})" for k in KEY_TYPES if not _fits(sub, k)]
                kind = sub.get("rope_type", sub.get("type", ""))
                if not isinstance(kind, str):
                    wrong.append(f"{key}.rope_type={shown(kind)} (a string)")
            elif sub is not None and key in config and value is not sub:
                wrong.append(f"{key} entry {shown(sub)} (an object)")
    if wrong:
        raise MinitfError(f"{where}: config.json has {', '.join(wrong)}; correct config.json or fetch the model again")


def _fits(config: dict, key: str) -> bool:
    """Whether config[key] (if there) has KEY_TYPES[key]'s type and range. bool is no number here."""
    if key not in config:
        return True
    v, want = config[key], KEY_TYPES[key]
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if want.endswith("or null") and v is None:
        return True
    if want.startswith("a positive integer"):
        return type(v) is int and v > 0
    if want.startswith("a positive number"):
        return number and 0 < v < 1e300  # float() of a larger int overflows
    if want.startswith("a number in"):
        return number and 0 < v <= 1
    if want == "true or false":
        return isinstance(v, bool)
    if want == "a string":
        return isinstance(v, str)
    if want == "an object or null":
        return isinstance(v, dict)
    return isinstance(v, list) and all(isinstance(t, str) for t in v)  # layer_types


def _nested(config: dict, rope: dict) -> bool:
    """Whether rope_parameters holds one dict per layer type (transformers: its keys are layer_types' names)."""
    types = config.get("layer_types")
    return isinstance(types, list) and any(k in types for k in rope if isinstance(k, str))


def _options(c: dict, fmt: str) -> tuple[dict, list[str]]:
    """(ModelConfig keyword arguments, problems: the settings minitf cannot compute) of an HF config."""
    problems: list[str] = []

    def need(bad: bool, text: str) -> None:
        if bad:
            problems.append(text)

    if fmt == "gpt2":
        return _gpt2_options(c, need), problems
    rope, rope_problems, parts = _rope(_global_layers(c) if fmt == "gemma3" else c, fmt)
    problems += rope_problems
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    common = dict(
        block_size=c.get("max_position_embeddings", 2048),
        n_layer=c["num_hidden_layers"],
        n_head=heads,
        n_embd=hidden,
        positions="rope",
        tie_embeddings=c.get("tie_word_embeddings", False),
        family=fmt,
        **rope,
    )
    need(
        not c.get("head_dim") and hidden % heads != 0,
        f"hidden_size={hidden} not divisible by num_attention_heads={heads}",
    )
    need(head_dim % 2 == 1, f"a head width of {head_dim} (rotary needs it even)")
    if fmt == "gemma3":
        rest = _gemma3_options(c, need)
    else:
        rest = _gptneox_options(c, parts, need) if fmt == "gptneox" else _llama_options(c, fmt, parts, need)
    return dict(common, **rest), problems


def _gpt2_options(c: dict, need) -> dict:
    """GPT-2's ModelConfig keyword arguments; need(bad, text) collects what minitf cannot compute."""
    n_embd = c.get("n_embd", 768)
    act = c.get("activation_function", "gelu_new")
    need(act not in HF_GELU, f"activation_function={act!r}")
    need(not c.get("scale_attn_weights", True), "scale_attn_weights=False")
    need(c.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx=True")
    need(c.get("reorder_and_upcast_attn", False), "reorder_and_upcast_attn=True")
    need(c.get("add_cross_attention", False), "add_cross_attention=True")
    inner = c.get("n_inner") or 4 * n_embd
    return dict(
        block_size=c.get("n_positions", 1024),
        n_layer=c.get("n_layer", 12),
        n_head=c.get("n_head", 12),
        n_embd=n_embd,
        positions="learned",
        norm="layernorm",
        ffn="gelu",
        gelu=HF_GELU.get(act, "tanh"),
        ffn_hidden=None if inner == 4 * n_embd else inner,
        norm_eps=c.get("layer_norm_epsilon", 1e-5),
        bias=True,
        tie_embeddings=c.get("tie_word_embeddings", True),
    )


# HF rope_type -> the keys of rope_parameters minitf reads for it, and the model.* key each sets
ROPE_TYPES = {
    "default": {},
    "linear": {"factor": "rope_factor"},
    "llama3": {
        "factor": "rope_factor",
        "low_freq_factor": "rope_low_freq_factor",
        "high_freq_factor": "rope_high_freq_factor",
        "original_max_position_embeddings": "rope_original_context",
    },
}


def _rope(c: dict, fmt: str) -> tuple[dict, list[str], dict]:
    """(model.rope_* keyword arguments, problems, the rotary settings) read as transformers reads
    them: a non-empty rope_scaling replaces rope_parameters whole; the type is rope_type, else the
    older key type, else "default"; rope_theta is the dict's, else the top level's (GPT-NeoX:
    rotary_emb_base), else 10000. minitf computes plain, linear and llama3 rotary positions."""
    top = c.get("rotary_emb_base" if fmt == "gptneox" else "rope_theta", 10000.0)
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    parts = [v for v in rope.values() if v is not None] if _nested(c, rope) else [rope]
    problems, found = [], set()
    for part in parts:
        kind = part.get("rope_type", part.get("type", "default"))
        if kind not in ROPE_TYPES:
            problems.append(f"rope_scaling (rope_type={kind!r}; minitf computes {', '.join(ROPE_TYPES)})")
            continue
        wrong = [k for k in ROPE_TYPES[kind] if not _number(part.get(k))]
        problems += [f"rope_parameters.{k}={shown(part.get(k))} (a positive number)" for k in wrong]
        keys = {} if wrong else {m: part[k] for k, m in ROPE_TYPES[kind].items()}
        if "rope_original_context" in keys:
            keys["rope_original_context"] = int(keys["rope_original_context"])
        scaling = "none" if kind == "default" else kind
        found.add((float(part.get("rope_theta", top)), scaling, tuple(sorted(keys.items()))))
    if len(found) > 1:
        problems.append(f"rotary settings {sorted(found)} that differ by layer type")
    theta, scaling, keys = min(found) if found else (float(top), "none", ())
    return dict(rope_base=theta, rope_scaling=scaling, **dict(keys)), sorted(set(problems)), (parts[0] if parts else {})


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e300


def _gptneox_options(c: dict, rope: dict, need) -> dict:
    """GPT-NeoX's keyword arguments beyond the rotary models' common ones."""
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    act = c.get("hidden_act", "gelu")
    need(act not in HF_GELU, f"hidden_act={act!r}")
    need(c.get("use_parallel_residual", True), "use_parallel_residual=True (attention and MLP side by side)")
    factor = rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25))  # rope: _rope's settings
    need(factor != 1.0, f"partial_rotary_factor={factor} (minitf rotates every dimension)")
    return dict(
        norm="layernorm",
        ffn="gelu",
        gelu=HF_GELU.get(act, "tanh"),
        ffn_hidden=None if inter == 4 * hidden else inter,
        norm_eps=c.get("layer_norm_eps", 1e-5),
        bias=True,  # GPT-NeoX's norms and MLP always have biases (attention_bias=false: zeros)
    )


def _llama_options(c: dict, fmt: str, rope: dict, need) -> dict:
    """The keyword arguments of Llama and the families built on it (Qwen2, Qwen3, Mistral, Phi-3)
    beyond the rotary models' common ones. rope: _rope's settings."""
    hidden, heads, inter = c["hidden_size"], c["num_attention_heads"], c["intermediate_size"]
    act = c.get("hidden_act", "silu")
    need(act != "silu", f"hidden_act={act!r} (minitf's SwiGLU gates with silu)")
    head_dim = c.get("head_dim") or hidden // heads
    need(
        head_dim != hidden // heads and fmt not in ("llama", "qwen3", "mistral"),
        f"head_dim={head_dim} (a {FORMAT_NAMES[fmt]} head is hidden_size / num_attention_heads)",
    )
    kv = c.get("num_key_value_heads") or heads
    need(heads % kv != 0, f"num_key_value_heads={kv} not dividing num_attention_heads={heads}")
    factor = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    need(factor != 1.0, f"partial_rotary_factor={factor} (minitf rotates every dimension)")
    return dict(
        head_dim=None if head_dim == hidden // heads else head_dim,
        n_kv_head=None if kv == heads else kv,
        norm="rmsnorm",
        ffn="swiglu",
        ffn_hidden=None if inter == swiglu_hidden(hidden) else inter,
        norm_eps=c.get("rms_norm_eps", 1e-6),
        qk_norm=fmt == "qwen3",
        sliding_window=_sliding_window(c, fmt, need),
        **_biases(c, fmt),
    )


def _sliding_window(c: dict, fmt: str, need) -> int | None:
    """model.sliding_window from config.json: Mistral's and Phi-3's sliding_window, on every layer.
    Qwen2 and Qwen3 carry a sliding_window that only use_sliding_window=true switches on."""
    window = c.get("sliding_window") if fmt in ("mistral", "phi3") else None
    need(bool(c.get("use_sliding_window")), "use_sliding_window=True (sliding windows on some layers only)")
    need(c.get("sliding_window") is not None and fmt == "llama", f"sliding_window={c.get('sliding_window')}")
    kinds = set(c.get("layer_types") or ["sliding_attention" if window else "full_attention"])
    need(
        kinds != {"sliding_attention" if window else "full_attention"},
        f"layer_types={sorted(kinds)} (minitf gives every layer the same attention)",
    )
    return window


def _global_layers(c: dict) -> dict:
    """Gemma 3's config.json as _rope reads it: the rotary settings of its global (full-attention)
    layers, from transformers 5's rope_parameters by layer type, or the hub's older rope_theta and
    rope_scaling (the local layers' own base is _gemma3_options')."""
    rope = c.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        return {k: v for k, v in c.items() if k not in ("layer_types", "rope_scaling")} | {
            "rope_parameters": rope["full_attention"]
        }
    return {k: v for k, v in c.items() if k != "layer_types"}


def _gemma3_options(c: dict, need) -> dict:
    """Gemma 3's keyword arguments beyond the rotary models' common ones, from config.json as
    transformers 5 writes it (layer_types, rope_parameters by layer type) or as the hub holds it
    (sliding_window_pattern, rope_local_base_freq)."""
    hidden, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    act = c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh"))
    need(HF_GELU.get(act) != "tanh", f"hidden_activation={act!r} (minitf's GeGLU gates with tanh-GELU)")
    need(c.get("attn_logit_softcapping") is not None, f"attn_logit_softcapping={c.get('attn_logit_softcapping')}")
    need(bool(c.get("use_bidirectional_attention")), "use_bidirectional_attention=True")
    head_dim = c.get("head_dim") or hidden // heads
    kv = c.get("num_key_value_heads") or heads
    need(heads % kv != 0, f"num_key_value_heads={kv} not dividing num_attention_heads={heads}")
    window, every = c.get("sliding_window"), c.get("sliding_window_pattern", 6)
    kinds = c.get("layer_types") or [
        "full_attention" if window is None or (i + 1) % every == 0 else "sliding_attention" for i in range(layers)
    ]
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    every = full[0] + 1 if full else None  # the pattern minitf computes: every every-th layer global
    expected = ["full_attention" if every and (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
    need(kinds != expected and window is not None, f"layer_types={kinds} (minitf's global layers come evenly)")
    rope = c.get("rope_parameters")
    local = rope.get("sliding_attention") if isinstance(rope, dict) else None
    local_base = (local or {}).get("rope_theta", c.get("rope_local_base_freq", 10000.0))
    need(
        (local or {}).get("rope_type", "default") != "default",
        f"a scaled rotary of the sliding layers ({(local or {}).get('rope_type')})",
    )
    scalar = c.get("query_pre_attn_scalar", head_dim)
    return dict(
        head_dim=None if head_dim == hidden // heads else head_dim,
        n_kv_head=None if kv == heads else kv,
        norm="rmsnorm",
        ffn="geglu",
        ffn_hidden=c["intermediate_size"],
        norm_eps=c.get("rms_norm_eps", 1e-6),
        qk_norm=True,
        bias=False,
        embed_scale=True,
        sandwich_norm=True,
        sliding_window=window,
        global_every=every if window is not None and every and every <= layers else None,
        rope_local_base=float(local_base) if window is not None else None,
        attn_scale=None if scalar == head_dim else float(scalar) ** -0.5,
        logit_softcap=c.get("final_logit_softcapping"),
    )


def _biases(c: dict, fmt: str) -> dict:
    """model.bias and qkv_bias: Qwen2 has biases on q, k and v only; Mistral and Phi-3 none; a Llama
    or Qwen3 with only some biases is minitf's with every bias and the rest zero."""
    if fmt == "qwen2":
        return dict(bias=False, qkv_bias=True)
    if fmt in ("mistral", "phi3"):
        return dict(bias=False)
    return dict(bias=bool(c.get("attention_bias", False) or c.get("mlp_bias", False)))


def check_memory(cfg: ModelConfig, fmt: str, config: dict, file_bytes: int, where) -> None:
    """Refuse, before a byte is allocated, a config.json that asks for more memory than this
    machine has, or for rotary tables far beyond its weights: minitf builds them (cos and sin, one
    row per position, from float64 angles) for every position of max_position_embeddings, so a
    600 KB directory saying 2x10^7 would take gigabytes. file_bytes: what the weights' files hold."""
    pairs = cfg.block_size * (cfg.head_size // 2) if cfg.positions == "rope" else 0
    tables = 24 * pairs  # float64 angles, cos and sin, and their float32 copies, at their peak
    need = 4 * model_floats(cfg) + 16 * pairs + file_bytes
    have = physical_memory()
    if have is not None and need > have:
        keys = SHAPE_KEYS["gpt2" if fmt == "gpt2" else "llama"] + (
            () if fmt == "gpt2" else ("max_position_embeddings",)
        )
        shape = ", ".join(f"{k}={config[k]}" for k in keys if k in config)
        raise MinitfError(
            f"{where}: config.json ({shape}) asks for {size_words(need)} of memory, more than this machine's "
            f"{size_words(have)}; fine-tune a smaller model"
        )
    weights = 4 * model_floats(cfg) - 8 * pairs
    if tables > max(TABLE_ALLOWANCE, weights):
        raise MinitfError(
            f"{where}: config.json has max_position_embeddings={cfg.block_size}, for which minitf would build "
            f"{size_words(tables)} of rotary tables (one row per position) beside {size_words(weights)} of weights; "
            f"lower it to the context the model was trained with"
        )
