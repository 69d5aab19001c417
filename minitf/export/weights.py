"""The weight map: for each format minitf exports, the tensors that hold a minitf model's weights,
named as Hugging Face's files and llama.cpp's GGUF files name them, in their layouts.

One table per format of minitf.export.architecture. The Hugging Face export and import
(minitf.export.hf_tensors) and the GGUF export (minitf.export.gguf) read their tensor names and
layouts from here and nowhere else, so a new format is one more table in TABLES.

A table lists a layer's weights and the model's (embeddings; final norm and head). HF files are
read and written layer by layer, then the embeddings, then the final norm and head; GGUF files
hold the embeddings first, then each layer in the table's gguf_layer_order, then the rest.
Where the architecture always has biases (GPT-2, GPT-NeoX) and minitf has none
(model.bias=false), the biases are written as zeros: the same computation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..model import Transformer
from .layouts import (
    GATE_UP,
    HEAD_BY_HEAD,
    PLUS_ONE,
    QKV_ADJACENT_PAIRS,
    QKV_SPLIT,
    TRANSPOSED,
    VOCAB_ROWS,
    WHOLE,
    Layout,
)


@dataclass(frozen=True)
class Weight:
    """One minitf tensor and the tensors that hold it in a format."""

    minitf: str  # its state-dict name (a layer's without "blocks.{i}.")
    hf: tuple[str, ...]  # HF's names (a layer's without its prefix), one per part of hf_layout
    gguf: tuple[str, ...]  # llama.cpp's names (a layer's without "blk.{i}."), one per part of gguf_layout
    hf_layout: Layout = WHOLE
    gguf_layout: Layout = WHOLE
    # an HF file may lack it (read as zeros): always (True), or where config.json's flag of this name is false
    optional: bool | str = False
    beside_base: bool = False  # the LM head: every *ForCausalLM keeps it outside the base model's prefix


def weight(minitf, hf, gguf, hf_layout: Layout = WHOLE, gguf_layout: Layout = WHOLE, optional=False) -> Weight:
    """A Weight; a name given as one string is a tensor in one part."""

    def names(n):
        return (n,) if isinstance(n, str) else tuple(n)

    return Weight(minitf, names(hf), names(gguf), hf_layout, gguf_layout, optional)


@dataclass(frozen=True)
class Table:
    """Everything one format calls a minitf model's tensors."""

    model_type: str  # config.json's model_type
    hf_classes: tuple[str, str]  # the transformers config and model classes
    hf_prefix: str  # the base model inside *ForCausalLM (hub files sometimes hold the base model only)
    hf_layer: str  # a layer's prefix inside the base model; {i}: its index
    gguf_arch: str  # the gguf package's MODEL_ARCH member
    layer: tuple[Weight, ...]
    embeddings: tuple[Weight, ...]
    final: tuple[Weight, ...]  # the final norm and the head
    # a layer's GGUF tensors in the order the file holds them: llama.cpp reads them by name, but the
    # order minitf has always written keeps every file byte for byte what it was
    gguf_layer_order: tuple[str, ...]
    zero_biases: bool = False  # the architecture always has biases: those minitf lacks are written as zeros
    gguf_tied_head: bool = False  # llama.cpp's graph reads output.weight even when the head is tied
    gguf_parallel_residual: bool = False  # the graph can run both sublayers side by side: the file says it does not
    gguf_rope_factors: bool = True  # the graph reads per-frequency rotary factors (rope_freqs: Llama 3's scaling)
    gguf: bool = True  # minitf writes GGUF files of this format
    # llama.cpp's graph slides a window, five layers in six at rotary base 10,000 (its gemma3): the
    # file holds the window, and a model that slides otherwise is refused
    gguf_sliding: bool = False


HEAD = Weight("lm_head.weight", ("lm_head.weight",), ("output.weight",), VOCAB_ROWS, VOCAB_ROWS, beside_base=True)

# GPT-2 and GPT-NeoX: LayerNorm with biases, one fused q|k|v, a plain MLP
LAYERNORM_GGUF_ORDER = (
    "attn_norm.weight",
    "ffn_norm.weight",
    "attn_output.weight",
    "ffn_down.weight",
    "attn_norm.bias",
    "attn_qkv.weight",
    "attn_qkv.bias",
    "attn_output.bias",
    "ffn_norm.bias",
    "ffn_up.weight",
    "ffn_up.bias",
    "ffn_down.bias",
)

GPT2 = Table(
    model_type="gpt2",
    hf_classes=("GPT2Config", "GPT2LMHeadModel"),
    hf_prefix="transformer.",
    hf_layer="h.{i}.",
    gguf_arch="GPT2",
    layer=(
        weight("ln_1.weight", "ln_1.weight", "attn_norm.weight"),
        weight("ln_1.bias", "ln_1.bias", "attn_norm.bias"),
        weight("ln_2.weight", "ln_2.weight", "ffn_norm.weight"),
        weight("ln_2.bias", "ln_2.bias", "ffn_norm.bias"),
        # q, k, v rows in turn in the GGUF file, as llama.cpp splits them
        weight("attn.c_attn.weight", "attn.c_attn.weight", "attn_qkv.weight", TRANSPOSED),
        weight("attn.c_attn.bias", "attn.c_attn.bias", "attn_qkv.bias"),
        weight("attn.c_proj.weight", "attn.c_proj.weight", "attn_output.weight", TRANSPOSED),
        weight("attn.c_proj.bias", "attn.c_proj.bias", "attn_output.bias"),
        weight("mlp.c_fc.weight", "mlp.c_fc.weight", "ffn_up.weight", TRANSPOSED),
        weight("mlp.c_fc.bias", "mlp.c_fc.bias", "ffn_up.bias"),
        weight("mlp.c_proj.weight", "mlp.c_proj.weight", "ffn_down.weight", TRANSPOSED),
        weight("mlp.c_proj.bias", "mlp.c_proj.bias", "ffn_down.bias"),
    ),
    embeddings=(
        weight("wte.weight", "wte.weight", "token_embd.weight", VOCAB_ROWS, VOCAB_ROWS),
        # sinusoidal positions: the fixed table minitf adds, written as the learned one (minitf_tensors)
        weight("wpe.wpe.weight", "wpe.weight", "position_embd.weight"),
    ),
    final=(
        weight("ln_f.weight", "ln_f.weight", "output_norm.weight"),
        weight("ln_f.bias", "ln_f.bias", "output_norm.bias"),
        HEAD,
    ),
    gguf_layer_order=LAYERNORM_GGUF_ORDER,
    zero_biases=True,
)

GPTNEOX = Table(
    model_type="gpt_neox",
    hf_classes=("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    hf_prefix="gpt_neox.",
    hf_layer="layers.{i}.",
    gguf_arch="GPTNEOX",
    layer=(
        weight("ln_1.weight", "input_layernorm.weight", "attn_norm.weight"),
        weight("ln_1.bias", "input_layernorm.bias", "attn_norm.bias"),
        weight("ln_2.weight", "post_attention_layernorm.weight", "ffn_norm.weight"),
        weight("ln_2.bias", "post_attention_layernorm.bias", "ffn_norm.bias"),
        weight("attn.c_attn.weight", "attention.query_key_value.weight", "attn_qkv.weight", HEAD_BY_HEAD),
        # files of attention_bias=false lack the attention's biases: zeros
        weight("attn.c_attn.bias", "attention.query_key_value.bias", "attn_qkv.bias", HEAD_BY_HEAD, optional=True),
        weight("attn.c_proj.weight", "attention.dense.weight", "attn_output.weight"),
        weight("attn.c_proj.bias", "attention.dense.bias", "attn_output.bias", optional=True),
        weight("mlp.c_fc.weight", "mlp.dense_h_to_4h.weight", "ffn_up.weight"),
        weight("mlp.c_fc.bias", "mlp.dense_h_to_4h.bias", "ffn_up.bias"),
        weight("mlp.c_proj.weight", "mlp.dense_4h_to_h.weight", "ffn_down.weight"),
        weight("mlp.c_proj.bias", "mlp.dense_4h_to_h.bias", "ffn_down.bias"),
    ),
    embeddings=(weight("wte.weight", "embed_in.weight", "token_embd.weight", VOCAB_ROWS, VOCAB_ROWS),),
    final=(
        weight("ln_f.weight", "final_layer_norm.weight", "output_norm.weight"),
        weight("ln_f.bias", "final_layer_norm.bias", "output_norm.bias"),
        HEAD,
    ),
    gguf_layer_order=LAYERNORM_GGUF_ORDER,
    zero_biases=True,
    gguf_tied_head=True,
    gguf_parallel_residual=True,
)


def llama_layer(gguf_qkv: Layout) -> tuple[Weight, ...]:
    """Llama's and Qwen3's layer: the norms, every projection's weight, then every projection's bias
    (where model.bias). gguf_qkv: the layout llama.cpp's graph reads q, k and v in."""
    return (
        weight("ln_1.weight", "input_layernorm.weight", "attn_norm.weight"),
        weight("ln_2.weight", "post_attention_layernorm.weight", "ffn_norm.weight"),
        *projections("weight", gguf_qkv, False, False),
        # a file may lack the attention's or the MLP's biases where config.json says so: zeros
        *projections("bias", gguf_qkv, "attention_bias", "mlp_bias"),
    )


def projections(s: str, gguf_qkv: Layout, attention_optional, mlp_optional) -> tuple[Weight, ...]:
    """Llama's four projections' weights or biases (s): q|k|v split in three, SwiGLU's gate|up in two."""
    return (
        weight(
            f"attn.c_attn.{s}",
            (f"self_attn.q_proj.{s}", f"self_attn.k_proj.{s}", f"self_attn.v_proj.{s}"),
            (f"attn_q.{s}", f"attn_k.{s}", f"attn_v.{s}"),
            QKV_SPLIT,
            gguf_qkv,
            attention_optional,
        ),
        weight(f"attn.c_proj.{s}", f"self_attn.o_proj.{s}", f"attn_output.{s}", optional=attention_optional),
        weight(
            f"mlp.c_fc.{s}",
            (f"mlp.gate_proj.{s}", f"mlp.up_proj.{s}"),
            (f"ffn_gate.{s}", f"ffn_up.{s}"),
            GATE_UP,
            GATE_UP,
            mlp_optional,
        ),
        weight(f"mlp.c_proj.{s}", f"mlp.down_proj.{s}", f"ffn_down.{s}", optional=mlp_optional),
    )


LLAMA_GGUF_ORDER = (
    "attn_norm.weight",
    "ffn_norm.weight",
    "attn_output.weight",
    "ffn_down.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.bias",
    "ffn_gate.bias",
    "ffn_up.bias",
    "ffn_down.bias",
)

LLAMA_GGUF_WEIGHTS = tuple(n for n in LLAMA_GGUF_ORDER if not n.endswith(".bias"))

LLAMA = Table(
    model_type="llama",
    hf_classes=("LlamaConfig", "LlamaForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="LLAMA",
    layer=llama_layer(QKV_ADJACENT_PAIRS),  # llama.cpp's llama graph rotates consecutive pairs
    embeddings=(weight("wte.weight", "embed_tokens.weight", "token_embd.weight", VOCAB_ROWS, VOCAB_ROWS),),
    final=(weight("ln_f.weight", "norm.weight", "output_norm.weight"), HEAD),
    gguf_layer_order=LLAMA_GGUF_ORDER,
)

QWEN3 = Table(
    model_type="qwen3",
    hf_classes=("Qwen3Config", "Qwen3ForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="QWEN3",
    layer=(
        *llama_layer(QKV_SPLIT),  # llama.cpp's qwen3 graph rotates halves, as minitf does
        weight("attn.q_norm.weight", "self_attn.q_norm.weight", "attn_q_norm.weight"),
        weight("attn.k_norm.weight", "self_attn.k_norm.weight", "attn_k_norm.weight"),
    ),
    embeddings=LLAMA.embeddings,
    final=LLAMA.final,
    gguf_layer_order=(*LLAMA_GGUF_ORDER, "attn_q_norm.weight", "attn_k_norm.weight"),
)

# Qwen2 and Qwen2.5: Llama with biases on q, k and v only (minitf: model.bias=false, qkv_bias=true)
QWEN2 = Table(
    model_type="qwen2",
    hf_classes=("Qwen2Config", "Qwen2ForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="QWEN2",
    layer=(
        *llama_layer(QKV_SPLIT)[:6],  # the norms and the four projections' weights; llama.cpp's qwen2 rotates halves
        projections("bias", QKV_SPLIT, False, False)[0],  # q, k, v's biases, which every Qwen2 file holds
    ),
    embeddings=LLAMA.embeddings,
    final=LLAMA.final,
    gguf_layer_order=tuple(n for n in LLAMA_GGUF_ORDER if not n.endswith(".bias"))
    + ("attn_q.bias", "attn_k.bias", "attn_v.bias"),
)

# Mistral: Llama's tensors under Llama's names (llama.cpp runs it as llama); config.json adds the sliding window
MISTRAL = Table(
    model_type="mistral",
    hf_classes=("MistralConfig", "MistralForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="LLAMA",
    layer=llama_layer(QKV_ADJACENT_PAIRS)[:6],  # no biases
    embeddings=LLAMA.embeddings,
    final=LLAMA.final,
    gguf_layer_order=LLAMA_GGUF_WEIGHTS,
)

# Phi-3 and Phi-4-mini: Llama's computation with q|k|v in one matrix and gate|up in another, in
# minitf's own row order, so both are stored whole
PHI3 = Table(
    model_type="phi3",
    hf_classes=("Phi3Config", "Phi3ForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="PHI3",
    gguf_rope_factors=False,
    layer=(
        weight("ln_1.weight", "input_layernorm.weight", "attn_norm.weight"),
        weight("ln_2.weight", "post_attention_layernorm.weight", "ffn_norm.weight"),
        weight("attn.c_attn.weight", "self_attn.qkv_proj.weight", "attn_qkv.weight"),
        weight("attn.c_proj.weight", "self_attn.o_proj.weight", "attn_output.weight"),
        weight("mlp.c_fc.weight", "mlp.gate_up_proj.weight", "ffn_up.weight"),  # llama.cpp splits gate|up itself
        weight("mlp.c_proj.weight", "mlp.down_proj.weight", "ffn_down.weight"),
    ),
    embeddings=LLAMA.embeddings,
    final=LLAMA.final,
    gguf_layer_order=(
        "attn_norm.weight",
        "ffn_norm.weight",
        "attn_output.weight",
        "ffn_down.weight",
        "attn_qkv.weight",
        "ffn_up.weight",
    ),
)

# Gemma 3's text models (270M, 1B): four norms a layer, each stored as w of Gemma's (1 + w) in a
# Hugging Face file and as the 1 + w it multiplies by in a GGUF one (llama.cpp's converter adds the
# one); the Llama family's projections, unpermuted (llama.cpp rotates Gemma's halves, as HF does);
# q/k norms with gains
GEMMA3 = Table(
    model_type="gemma3_text",
    hf_classes=("Gemma3TextConfig", "Gemma3ForCausalLM"),
    hf_prefix="model.",
    hf_layer="layers.{i}.",
    gguf_arch="GEMMA3",
    layer=(
        weight("ln_1.weight", "input_layernorm.weight", "attn_norm.weight", PLUS_ONE),
        weight("after_attn.weight", "post_attention_layernorm.weight", "post_attention_norm.weight", PLUS_ONE),
        weight("ln_2.weight", "pre_feedforward_layernorm.weight", "ffn_norm.weight", PLUS_ONE),
        weight("after_mlp.weight", "post_feedforward_layernorm.weight", "post_ffw_norm.weight", PLUS_ONE),
        *projections("weight", QKV_SPLIT, False, False),
        weight("attn.q_norm.weight", "self_attn.q_norm.weight", "attn_q_norm.weight", PLUS_ONE),
        weight("attn.k_norm.weight", "self_attn.k_norm.weight", "attn_k_norm.weight", PLUS_ONE),
    ),
    embeddings=LLAMA.embeddings,
    final=(weight("ln_f.weight", "norm.weight", "output_norm.weight", PLUS_ONE), HEAD),
    gguf_layer_order=(
        "attn_norm.weight",
        "post_attention_norm.weight",
        "ffn_norm.weight",
        "post_ffw_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
    ),
    gguf_sliding=True,
)

# one table per format of minitf.export.architecture.FORMATS, in its order
TABLES = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "qwen3": QWEN3,
    "gptneox": GPTNEOX,
    "qwen2": QWEN2,
    "mistral": MISTRAL,
    "phi3": PHI3,
    "gemma3": GEMMA3,
}


# ---------------------------------------------------------------------------------------------
# reading the tables


def minitf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """A model's tensors as every export reads them: its state dict in float32 on the CPU (a
    model on the meta device stays there: its tensors then give only names and shapes), with
    sinusoidal positions' fixed table standing as the learned table, which holds the same values."""
    tensors = {k: v.detach().float().to(v.device if v.is_meta else "cpu") for k, v in model.state_dict().items()}
    if model.config.positions == "sinusoidal":
        tensors["wpe.wpe.weight"] = model.wpe.table.float()
    return tensors


def minitf_name(w: Weight, layer: int | None = None) -> str:
    """w's name in minitf's state dict, in block `layer` (None: a weight of the model's, not a layer's)."""
    return w.minitf if layer is None else f"blocks.{layer}.{w.minitf}"


def exported(
    w: Weight, name: str, tensors: dict[str, torch.Tensor], table: Table, layout: Layout, cfg: ModelConfig
) -> list[torch.Tensor]:
    """The format's tensors for w, whose minitf tensor is `name` (minitf_name's), as
    `layout`'s parts: made from the model's own tensor; from zeros for a bias the model lacks where
    the format always has biases; none ([]) where neither minitf nor the format has it."""
    if name in tensors:
        t = tensors[name]
    elif table.zero_biases and name.endswith(".bias"):
        t = torch.zeros(tensors[name.removesuffix(".bias") + ".weight"].shape[0])  # as many as the weight's rows
    else:
        return []
    return layout.split(t, cfg)


def hf_weights(table: Table, n_layer: int) -> Iterator[tuple[str, tuple[str, ...], Weight]]:
    """(minitf's name, HF's names, the weight) for every weight of an n_layer model, in the order
    HF tensors are read and written: layer by layer, then the embeddings, the final norm and head."""
    for i in range(n_layer):
        layer = table.hf_prefix + table.hf_layer.format(i=i)
        for w in table.layer:
            yield minitf_name(w, i), tuple(layer + n for n in w.hf), w
    for w in table.embeddings + table.final:
        yield minitf_name(w), tuple(n if w.beside_base else table.hf_prefix + n for n in w.hf), w
