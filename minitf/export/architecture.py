"""Which standard architecture computes a minitf model exactly: GPT-2, Llama and its kin, GPT-NeoX, or none.

Every exporter (Hugging Face directories, GGUF files for llama.cpp) asks `export_format` first, so
one table decides what leaves minitf and under which name. The facts behind each row:

- gpt2: additive positions, LayerNorm (eps 1e-5, minitf's and GPT-2's), GELU with the tanh
  approximation (HF `gelu_new`, llama.cpp's `ggml_gelu`), one fused q|k|v projection. Sinusoidal
  positions export too: the fixed table is written as the learned position embedding, which then
  holds exactly the values minitf adds. Without biases (model.bias=false) the biases are written
  as zeros, which is the same computation. An untied LM head is written as its own matrix.
- llama: rotary positions + RMSNorm (with a weight, eps 1e-5) + SwiGLU, no q/k norm. Biases are
  optional in both HF's Llama (attention_bias, mlp_bias) and llama.cpp's llama graph, so either
  model.bias exports. minitf's rotary layout pairs dimension i with i + D/2 (HF's rotate_half);
  llama.cpp's llama graph pairs consecutive dimensions, which the GGUF writer handles by
  permuting the q and k rows (as llama.cpp's own converter does for HF checkpoints).
- gptneox: rotary positions with GPT-2's LayerNorm and tanh GELU (the default recipe):
  GPT-NeoX with rotary_pct=1 and use_parallel_residual=false (sequential sublayers, as minitf),
  whose rotary pairing is rotate_half, minitf's own. Biases absent in minitf are written as zeros.
- llama, qwen3, mistral: model.head_dim (a head width apart from n_embd / n_head) and
  model.rope_scaling (linear, llama3) are config.json keys of all three.
- qwen3: llama plus a per-head RMS norm of q and k, with its learned gains, before the rotation
  (Qwen3's q_norm/k_norm). Qwen3 has no MLP biases and llama.cpp's qwen3 graph no
  output-projection bias, so only model.bias=false exports. Qwen3 uses one rms_norm_eps for every
  norm, q/k norm included, and so does minitf (model.norm_eps).
- qwen2 (Qwen2, Qwen2.5): llama with biases on q, k and v only (model.bias=false, qkv_bias=true).
- mistral, phi3: llama without biases, with or without a sliding window; Phi-3 stores q|k|v and
  gate|up fused, in minitf's own row order.
- gemma3 (the 270M and 1B text models): embeddings scaled by sqrt(n_embd), a norm before and after
  each sub-layer, tanh-GELU-gated MLP, q/k norms, sliding layers with their own rotary base between
  global ones (global_every), and query_pre_attn_scalar's scale. Its norms store w of (1 + w).

Not exportable anywhere: logit_softcap (Gemma 2 has it, but also norms after each sublayer that
minitf lacks), relu2, SwiGLU with LayerNorm, GELU with RMSNorm, RMSNorm with additive positions, exact (erf) GELU in
GPT-2 form (llama.cpp's GPT-2 graph computes the tanh form). dropout and model.attention
(sdpa/reference) do not change what a trained model computes, so they never block.
"""

from __future__ import annotations

import dataclasses

from ..config import ModelConfig
from ..errors import MinitfError

# in the order export tries them: a model that several compute exactly is written as the first,
# unless model.family (what it was imported as) names another that computes it
FORMATS = ("gpt2", "llama", "qwen3", "gptneox", "qwen2", "mistral", "phi3", "gemma3")
FORMAT_NAMES = {
    "gpt2": "GPT-2",
    "llama": "Llama",
    "qwen3": "Qwen3",
    "gptneox": "GPT-NeoX",
    "qwen2": "Qwen2",
    "mistral": "Mistral",
    "phi3": "Phi-3",
    "gemma3": "Gemma 3",
}


def _yaml(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# per format: key -> (the values it accepts, the value to suggest); the suggestion is the first
# accepted value, or for a yes/no key the one that keeps the model closest to what it is
_GEMMA_ONLY = {  # what only Gemma 3 computes
    "global_every": ((None,), None),
    "rope_local_base": ((None,), None),
    "attn_scale": ((None,), None),
    "embed_scale": ((False,), False),
    "sandwich_norm": ((False,), False),
}
_PLAIN = {  # what no format but the rotary Llama family computes
    **_GEMMA_ONLY,
    "head_dim": ((None,), None),
    "qkv_bias": ((None,), None),
    "rope_scaling": (("none",), "none"),
    "sliding_window": ((None,), None),
    "qk_norm": ((False,), False),
    "logit_softcap": ((None,), None),
}
_LLAMA = {
    **_GEMMA_ONLY,
    "positions": (("rope",), "rope"),
    "norm": (("rmsnorm",), "rmsnorm"),
    "ffn": (("swiglu",), "swiglu"),
    "qkv_bias": ((None,), None),
    "sliding_window": ((None,), None),
    "qk_norm": ((False,), False),
    "logit_softcap": ((None,), None),
}
_WINDOWED = {k: v for k, v in _LLAMA.items() if k != "sliding_window"}
_REQUIREMENTS: dict[str, dict[str, tuple[tuple, object]]] = {
    "gpt2": {
        **_PLAIN,
        "positions": (("learned", "sinusoidal"), "learned"),
        "norm": (("layernorm",), "layernorm"),
        "ffn": (("gelu",), "gelu"),
        "gelu": (("tanh",), "tanh"),
    },
    "llama": _LLAMA,
    "gptneox": {
        **_PLAIN,
        "positions": (("rope",), "rope"),
        "norm": (("layernorm",), "layernorm"),
        "ffn": (("gelu",), "gelu"),
        "gelu": (("tanh",), "tanh"),
    },
    "qwen3": {**_LLAMA, "qk_norm": ((True,), True), "bias": ((False,), False)},
    "qwen2": {**_LLAMA, "bias": ((False,), False), "qkv_bias": ((True,), True), "head_dim": ((None,), None)},
    # both take any sliding window
    "mistral": {**_WINDOWED, "bias": ((False,), False)},
    "phi3": {**_WINDOWED, "bias": ((False,), False), "head_dim": ((None,), None)},
    # any window, layer pattern, local rotary base and scale
    "gemma3": {
        "positions": (("rope",), "rope"),
        "norm": (("rmsnorm",), "rmsnorm"),
        "ffn": (("geglu",), "geglu"),
        "qk_norm": ((True,), True),
        "bias": ((False,), False),
        "qkv_bias": ((None,), None),
        "embed_scale": ((True,), True),
        "sandwich_norm": ((True,), True),
        "logit_softcap": ((None,), None),
    },
}


def blocking_keys(cfg: ModelConfig, fmt: str) -> dict[str, tuple[object, object]]:
    """{key: (the model's value, the value `fmt` needs)} for every setting `fmt` cannot express."""
    if fmt not in _REQUIREMENTS:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
    needs = _REQUIREMENTS[fmt]
    blocked = {  # in ModelConfig's order, as --help lists the keys
        f.name: (getattr(cfg, f.name), needs[f.name][1])
        for f in dataclasses.fields(cfg)
        if f.name in needs and getattr(cfg, f.name) not in needs[f.name][0]
    }
    if fmt in ("gpt2", "gptneox") and cfg.kv_heads != cfg.n_head:  # one key/value head per query head
        blocked["n_kv_head"] = (cfg.kv_heads, cfg.n_head)
    return blocked


def export_format(cfg: ModelConfig, formats: tuple[str, ...] = FORMATS) -> str:
    """The standard architecture among `formats` ("gpt2", "llama", "qwen3", "gptneox") that computes
    `cfg`'s model exactly. An exporter that writes only some of them passes those.

    Raises MinitfError naming every setting that blocks the nearest format (the one that needs the
    fewest changes; all of them when several tie) and the values that would make the model exportable.
    """
    blocked = {fmt: blocking_keys(cfg, fmt) for fmt in formats}
    if cfg.family in formats and not blocked[cfg.family]:
        return cfg.family  # what the model was imported as: written back as itself
    for fmt in formats:
        if not blocked[fmt]:
            return fmt
    fewest = min(len(b) for b in blocked.values())
    nearest = [f for f in formats if len(blocked[f]) == fewest]  # several when they tie
    have = {k: v[0] for f in nearest for k, v in blocked[f].items()}  # every key that blocks one of them
    want = " or ".join(
        " ".join(f"model.{k}={_yaml(v[1])}" for k, v in blocked[f].items()) + f" ({FORMAT_NAMES[f]})" for f in nearest
    )
    blocks = ", ".join(f"model.{k}={_yaml(v)}" for k, v in have.items())
    verb = "blocks" if len(have) == 1 else "block"
    raise MinitfError(
        f"no standard architecture computes this model exactly ({blocks} {verb} it); the nearest exportable "
        f"setting is {want}; exportable: {describe_formats(formats)}"
    )


def describe_formats(formats: tuple[str, ...] = FORMATS) -> str:
    """The option sets that export, in one line (for refusals and --help)."""
    sets = {
        "gpt2": "GPT-2 = positions=learned|sinusoidal norm=layernorm ffn=gelu gelu=tanh",
        "llama": "Llama = positions=rope norm=rmsnorm ffn=swiglu (bias either way)",
        "qwen3": "Qwen3 = Llama with qk_norm=true bias=false",
        "gptneox": "GPT-NeoX = positions=rope norm=layernorm ffn=gelu gelu=tanh",
        "qwen2": "Qwen2 = Llama with bias=false qkv_bias=true",
        "mistral": "Mistral = Llama with bias=false (sliding_window either way)",
        "phi3": "Phi-3 = Llama with bias=false (sliding_window either way)",
        "gemma3": "Gemma 3 = positions=rope norm=rmsnorm ffn=geglu qk_norm=true bias=false embed_scale=true "
        "sandwich_norm=true",
    }
    return "; ".join(sets[f] for f in formats) + "; none with logit_softcap"


def format_or_none(cfg: ModelConfig, formats: tuple[str, ...] = FORMATS) -> str | None:
    """export_format, or None where no architecture computes the model (for start-up lines)."""
    try:
        return export_format(cfg, formats)
    except MinitfError:
        return None


def export_words(model: ModelConfig) -> str:
    """Where the trained model can go (minitf export / export-gguf), for the start-up line."""
    fmt = format_or_none(model)
    if fmt is None:
        return "exports to no standard architecture (minitf export names the settings that block it)"
    return f"exports as {FORMAT_NAMES[fmt]}"
