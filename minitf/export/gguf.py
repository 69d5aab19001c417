"""Write a minitf model as one GGUF file that llama.cpp (and Ollama, which reads the same files) runs.

    python scripts/export_gguf.py --run runs/shakespeare --out shakespeare.gguf [--dtype f32|f16|q8_0]

The architecture comes from minitf.export.architecture (gpt2, llama, qwen3 or gptneox); the file holds the
hyperparameters llama.cpp reads for it, the weights under llama.cpp's tensor names, and the
tokenizer (minitf.export.gguf_vocab: byte-level BPE's tokens, types and merges, or a SentencePiece-style
vocabulary's tokens, types and scores; <|endoftext|> as bos and eos), so nothing else has to travel
with it; a chat run's file also holds its template (tokenizer.chat_template) and its end-of-turn token
as eos and eot, where llama.cpp's chat ends an answer. The writer is the `gguf` package (the `gguf`
extra: pip install -e '.[gguf]'), published by the llama.cpp project; it is imported inside the
functions only.

Layout facts the file depends on (each checked by tests/integration/test_gguf_llamacpp.py against llama.cpp itself):
- GGUF stores a (rows, cols) array as ne = (cols, rows): nn.Linear's (out, in) weight and the
  embedding's (vocab, n_embd) are written as they are.
- The tensors' names and layouts are minitf.export.weights' GGUF side: there, llama.cpp's llama
  graph gets its q and k rows in consecutive rotary pairs, and the padding rows minitf adds to
  the embedding (to a multiple of 64) are dropped: the file has exactly the tokenizer's vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import MinitfError
from ..model import Transformer
from ..positions import rope_scaling, rotary_angles
from ..system.sizes import ffn_hidden
from ..tokenizer import Tokenizer, check_vocab
from .architecture import FORMAT_NAMES, export_format
from .gguf_vocab import add_tokenizer, checked_vocabulary, gguf_package
from .weights import HEAD, TABLES, Weight, exported, minitf_name, minitf_tensors

DTYPES = ("f32", "f16", "q8_0")
Q8_BLOCK = 32  # q8_0 quantizes rows in blocks of 32 values
F16_MAX = 65504.0  # the largest finite float16
# what llama.cpp's gemma3 graph fixes (its llama_load_hparams for gemma3): the sliding layers are five in
# six, rotating at base 10,000
GEMMA3_GLOBAL_EVERY, GEMMA3_LOCAL_BASE = 6, 10000.0


# ---------------------------------------------------------------------------------------------
# the weights


def _tensors(model: Transformer, fmt: str) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> float32 tensor, named and laid out as minitf.export.weights says for `fmt`,
    in the file's order: the embeddings, each layer, the final norm and head."""
    cfg, table = model.config, TABLES[fmt]
    tensors = minitf_tensors(model)
    if cfg.tie_embeddings and not table.gguf_tied_head:
        del tensors[HEAD.minitf]  # llama.cpp reuses token_embd as the output matrix

    def made(weights: tuple[Weight, ...], layer: int | None = None) -> dict[str, torch.Tensor]:
        """GGUF name (a layer's without "blk.{i}.") -> tensor, for these weights of the model or of `layer`."""
        out = {}
        for w in weights:
            parts = exported(w, minitf_name(w, layer), tensors, table, w.gguf_layout, cfg)
            out.update(zip(w.gguf, parts))
        return out

    out = made(table.embeddings)
    for i in range(cfg.n_layer):
        layer = made(table.layer, i)
        out.update((f"blk.{i}.{name}", layer.pop(name)) for name in table.gguf_layer_order if name in layer)
        if layer:
            raise RuntimeError(f"{', '.join(layer)} missing from the {fmt} table's gguf_layer_order")
    out.update(made(table.final))
    return out


def _encode(t: torch.Tensor, dtype: str):
    """(array, raw GGML type or None) for one tensor: vectors stay float32 (as llama.cpp's own
    converter keeps them), matrices become f16 or q8_0 (rows not a multiple of 32: f16)."""
    gguf = gguf_package()
    a = t.contiguous().numpy().astype(np.float32)
    if dtype == "f32" or a.ndim == 1:
        return a, None
    if dtype == "q8_0" and a.shape[-1] % Q8_BLOCK == 0:
        q8 = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(a, q8), q8
    return a.astype(np.float16), None


# ---------------------------------------------------------------------------------------------
# the file


def _norm_eps(model: Transformer) -> float:
    return float(model.ln_f.eps)  # every norm is made by make_norm with the same eps


def write_gguf(model: Transformer, tokenizer: Tokenizer, path, dtype: str = "f32") -> str:
    """Write `path` (a .gguf file) for llama.cpp; returns the format written (minitf.export.architecture's;
    a Mistral's file is llama.cpp's llama)."""
    cfg = model.config
    fmt = export_format(cfg)  # refuses, naming every blocking setting, before anything is written
    if dtype not in DTYPES:
        raise MinitfError(f"--dtype must be one of {'|'.join(DTYPES)}, got {dtype!r}")
    if not TABLES[fmt].gguf:
        raise MinitfError(
            f"minitf writes no GGUF file of {FORMAT_NAMES[fmt]} models; export to Hugging Face (minitf export), "
            f"which llama.cpp's convert_hf_to_gguf.py turns into one"
        )
    check_vocab(tokenizer, cfg.vocab_size, "pass the tokenizer the model was trained with")
    vocabulary = checked_vocabulary(tokenizer)  # refused before anything is written
    gguf = gguf_package()
    arch = gguf.MODEL_ARCH[TABLES[fmt].gguf_arch]
    _check_rope_and_window(cfg, fmt)
    tensors = {**_tensors(model, fmt), **_rope_tensors(cfg)}
    _check_names(tensors, arch, fmt)
    _check_range(tensors, dtype)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    try:
        writer.add_name("minitf")
        writer.add_file_type(
            {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}.get(
                dtype, gguf.LlamaFileType.MOSTLY_Q8_0
            )
        )
        if dtype != "f32":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_hyperparameters(writer, model, fmt, ffn=ffn_hidden(cfg))
        add_tokenizer(writer, tokenizer, vocabulary)
        for name, t in tensors.items():
            array, raw = _encode(t, dtype)
            writer.add_tensor(name, array, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return fmt


def _check_rope_and_window(cfg, fmt: str) -> None:
    """Refuse what llama.cpp's graph for `fmt` would compute otherwise: a sliding window that hides
    keys within the context (its llama, qwen and phi3 graphs attend to all of them), and llama3
    rotary scaling where the graph reads no per-frequency factors."""
    if TABLES[fmt].gguf_sliding:
        _check_sliding(cfg, fmt)
        return
    if cfg.sliding_window is not None and cfg.sliding_window < cfg.block_size:
        raise MinitfError(
            f"model.sliding_window={cfg.sliding_window} is shorter than model.block_size={cfg.block_size}, and "
            f"llama.cpp's {fmt} graph sees every key; export to Hugging Face instead (minitf export)"
        )
    if cfg.rope_scaling == "llama3" and not TABLES[fmt].gguf_rope_factors:
        raise MinitfError(
            f"model.rope_scaling=llama3 has no place in llama.cpp's {fmt} graph; export to Hugging Face instead"
        )


def _check_sliding(cfg, fmt: str) -> None:
    """llama.cpp's gemma3 graph fixes what a Gemma 3 config may vary: five sliding layers in six, the
    sliding layers' rotary base 10,000, scores scaled by 1/sqrt(head width), no rotary scaling.
    Gemma 3's 270M and 1B models are so; a model that is not would be computed otherwise."""
    local_base = cfg.rope_local_base if cfg.rope_local_base is not None else cfg.rope_base
    scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_size**-0.5
    fixed = {
        "model.sliding_window": (cfg.sliding_window is not None, "a window (Gemma 3's 512)"),
        "model.global_every": (cfg.global_every == GEMMA3_GLOBAL_EVERY, f"{GEMMA3_GLOBAL_EVERY}"),
        "model.rope_local_base": (local_base == GEMMA3_LOCAL_BASE, f"{GEMMA3_LOCAL_BASE:g}"),
        "model.attn_scale": (abs(scale * cfg.head_size**0.5 - 1) < 1e-6, "1/sqrt(head width)"),
        "model.rope_scaling": (cfg.rope_scaling == "none", "none"),
    }
    wrong = [f"{key} (llama.cpp's: {theirs})" for key, (ok, theirs) in fixed.items() if not ok]
    if wrong:
        raise MinitfError(
            f"llama.cpp's {fmt} graph fixes {', '.join(wrong)}; this model differs there, so export it to "
            "Hugging Face instead (minitf export), which transformers computes as minitf does"
        )


def _rope_tensors(cfg) -> dict[str, torch.Tensor]:
    """rope_scaling=llama3's frequencies as llama.cpp takes them: one factor per rotary pair, by which
    it divides that pair's frequency (rope_freqs, as llama.cpp's own converter writes for Llama 3.1)."""
    if cfg.rope_scaling != "llama3":
        return {}
    plain = rotary_angles(2, cfg.head_size, cfg.rope_base)[1]  # (D/2,) the frequencies: position 1's angles
    scaled = rotary_angles(2, cfg.head_size, cfg.rope_base, rope_scaling(cfg))[1]
    return {"rope_freqs.weight": (plain / scaled).float()}


def _check_range(tensors: dict[str, torch.Tensor], dtype: str) -> None:
    """Every matrix stored as float16 (--dtype f16, and q8_0's rows that are not a multiple of 32) fits
    float16's range: numpy writes inf for a larger value, silently. q8_0 stores each block's scale,
    the block's largest value / 127, as float16."""
    if dtype == "f32":
        return
    for name, t in tensors.items():
        if t.dim() == 1:
            continue  # vectors stay float32
        q8 = dtype == "q8_0" and t.shape[-1] % Q8_BLOCK == 0
        largest = float(t.abs().max()) if t.numel() else 0.0
        if largest > F16_MAX * (127 if q8 else 1):
            other = "f32 or q8_0" if dtype == "f16" else "f32"
            raise MinitfError(
                f"--dtype {dtype} cannot hold {name}: its largest value is {largest:.6g}, beyond float16's "
                f"{F16_MAX:.0f}; export with --dtype {other}"
            )


def _check_names(tensors: dict[str, torch.Tensor], arch, fmt: str) -> None:
    """Every tensor name is one gguf's own table lists for the architecture (llama.cpp loads no other)."""
    gguf = gguf_package()
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    for name in tensors:
        parts = name.split(".")
        base = f"blk.{{bid}}.{parts[2]}" if parts[0] == "blk" else parts[0]
        if base not in known:
            raise RuntimeError(f"{name} is not a tensor of gguf's {fmt} architecture")


def _add_hyperparameters(writer, model: Transformer, fmt: str, ffn: int) -> None:
    """The shape and settings llama.cpp's graph for `fmt` reads; ffn: the feed-forward width."""
    cfg = model.config
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_feed_forward_length(ffn)
    if cfg.norm == "layernorm":  # GPT-2 and GPT-NeoX; Llama and Qwen3 use RMSNorm
        writer.add_layer_norm_eps(_norm_eps(model))
    else:
        writer.add_layer_norm_rms_eps(_norm_eps(model))
    if TABLES[fmt].gguf_parallel_residual:
        writer.add_parallel_residual(False)  # minitf's sublayers run one after the other
    if cfg.rope_scaling == "linear":  # llama3's factors are a tensor (_rope_tensors)
        writer.add_rope_scaling_type(gguf_package().RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_factor)
    if TABLES[fmt].gguf_sliding:  # the others' graphs see every key (checked)
        writer.add_sliding_window(cfg.sliding_window)
    if cfg.positions == "rope":
        writer.add_rope_freq_base(cfg.rope_base)
        writer.add_rope_dimension_count(cfg.head_size)
        writer.add_key_length(cfg.head_size)
        writer.add_value_length(cfg.head_size)


def export_run(run, out, dtype: str = "f32", best: bool = False, force: bool = False) -> tuple[Path, str]:
    """Export a run directory's model to the GGUF file `out`; (the path, the architecture)."""
    from ..run_dir import RUN_FILES, is_run_dir, load_run
    from ..system.files import atomic_write, check_out_file

    out = check_out_file(out, force, example="model.gguf")
    if out.name in RUN_FILES and is_run_dir(out.parent):
        raise MinitfError(f"--out {out} is a file of the run in {out.parent}; name a new file, e.g. model.gguf")
    model, tokenizer, _ = load_run(run, best=best)
    export_format(model.config)  # refuse before creating any directory
    out.parent.mkdir(parents=True, exist_ok=True)
    fmt = {}
    # a temporary name, then one rename: a failed or interrupted export never leaves half a file,
    # and with --force the old file stays until the new one is complete
    atomic_write(out, lambda tmp: fmt.setdefault("arch", write_gguf(model, tokenizer, tmp, dtype)))
    return out, fmt["arch"]
