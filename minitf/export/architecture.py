"""Which standard architecture computes a minitf model exactly: GPT-2, Llama, Qwen3, or none.

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
- qwen3: llama plus a per-head RMS norm of q and k before the rotation (Qwen3's q_norm/k_norm,
  whose weights are written as ones: minitf's has none). Qwen3 has no MLP biases and llama.cpp's
  qwen3 graph no output-projection bias, so only model.bias=false exports. Qwen3 uses one
  rms_norm_eps for every norm, q/k norm included, and so does minitf (model.norm_eps).

Not exportable anywhere: logit_softcap (Gemma 2 has it, but also norms after each sublayer that
minitf lacks), relu2, SwiGLU with LayerNorm, GELU with RMSNorm, RMSNorm with additive positions, exact (erf) GELU in
GPT-2 form (llama.cpp's GPT-2 graph computes the tanh form). dropout and model.attention
(sdpa/reference) do not change what a trained model computes, so they never block.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..errors import MinitfError

FORMATS = ("gpt2", "llama", "qwen3", "gptneox")
FORMAT_NAMES = {"gpt2": "GPT-2", "llama": "Llama", "qwen3": "Qwen3", "gptneox": "GPT-NeoX"}


def _yaml(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# per format: key -> (the values it accepts, the value to suggest); the suggestion is the first
# accepted value, or for a yes/no key the one that keeps the model closest to what it is
_REQUIREMENTS: dict[str, dict[str, tuple[tuple, object]]] = {
    "gpt2": {
        "positions": (("learned", "sinusoidal"), "learned"),
        "norm": (("layernorm",), "layernorm"),
        "ffn": (("gelu",), "gelu"),
        "gelu": (("tanh",), "tanh"),
        "qk_norm": ((False,), False),
        "logit_softcap": ((None,), None),
    },
    "llama": {
        "positions": (("rope",), "rope"),
        "norm": (("rmsnorm",), "rmsnorm"),
        "ffn": (("swiglu",), "swiglu"),
        "qk_norm": ((False,), False),
        "logit_softcap": ((None,), None),
    },
    "gptneox": {
        "positions": (("rope",), "rope"),
        "norm": (("layernorm",), "layernorm"),
        "ffn": (("gelu",), "gelu"),
        "gelu": (("tanh",), "tanh"),
        "qk_norm": ((False,), False),
        "logit_softcap": ((None,), None),
    },
    "qwen3": {
        "positions": (("rope",), "rope"),
        "norm": (("rmsnorm",), "rmsnorm"),
        "ffn": (("swiglu",), "swiglu"),
        "qk_norm": ((True,), True),
        "bias": ((False,), False),
        "logit_softcap": ((None,), None),
    },
}


def blocking_keys(cfg: ModelConfig, fmt: str) -> dict[str, tuple[object, object]]:
    """{key: (the model's value, the value `fmt` needs)} for every setting `fmt` cannot express."""
    if fmt not in _REQUIREMENTS:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
    blocked = {
        key: (getattr(cfg, key), suggest)
        for key, (accepted, suggest) in _REQUIREMENTS[fmt].items()
        if getattr(cfg, key) not in accepted
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
