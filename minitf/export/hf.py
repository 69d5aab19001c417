"""Hugging Face `transformers` interop: write a minitf model as the standard architecture that computes
it (GPT-2, Llama, Qwen3 or GPT-NeoX; minitf.export.architecture decides), and read such a directory back.

    option set (minitf.export.architecture)                       written as
    positions=learned|sinusoidal layernorm gelu tanh  GPT2LMHeadModel
    positions=rope rmsnorm swiglu (bias either way)   LlamaForCausalLM (attention_bias = mlp_bias = model.bias)
    the same with qk_norm=true bias=false             Qwen3ForCausalLM (q_norm/k_norm weights one)
    positions=rope layernorm gelu tanh                GPTNeoXForCausalLM (use_parallel_residual=false)

Only the storage differs from minitf's:
- GPT-2's Conv1D keeps each projection as (in, out) where nn.Linear keeps (out, in): transposed.
- minitf fuses q|k|v in one matrix (q: n_head heads, then k and v: n_kv_head heads each) and
  SwiGLU's gate|up in another; Llama and Qwen3 keep q_proj, k_proj, v_proj, gate_proj, up_proj.
- GPT-NeoX fuses q|k|v too, but head by head (q_0 k_0 v_0 q_1 ...): the rows are regrouped.
- minitf pads the embedding rows to a multiple of 64; the directory holds exactly the tokenizer's
  vocabulary (vocab_size), so no padding id can ever be generated.
- Rotary: minitf pairs dimension i with i + D/2, which is HF's rotate_half: no permutation.
- Biases minitf does not have (model.bias=false) are written as zeros where the architecture
  always has them (GPT-2, GPT-NeoX): the same computation.

Export needs transformers (the `hf` extra: pip install -e '.[hf]'); import reads config.json and
safetensors files directly (never a pickle), so it does not. transformers is imported inside the
functions only, so `import minitf` never needs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import ModelConfig
from ..errors import MinitfError, first_line
from ..model import Transformer, ffn_hidden, swiglu_hidden
from ..tokenizer import EOT, Tokenizer, check_vocab
from ..training import checkpoint as ckpt
from .architecture import FORMAT_NAMES, FORMATS, export_format
from .layouts import VOCAB_ROWS
from .weights import TABLES, exported, hf_weights, minitf_tensors

# minitf format -> the transformers classes that hold it, and HF model_type -> minitf format
HF_CLASSES = {fmt: table.hf_classes for fmt, table in TABLES.items()}
MODEL_TYPES = {table.model_type: fmt for fmt, table in TABLES.items()}
# HF activation names -> model.gelu; gelu_new, gelu_fast and gelu_pytorch_tanh are one formula
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
# what torch.save and pickle write: never loaded (unpickling can run code), but named when they are all there is
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# the config.json keys that fix a model's shape: without them a default (GPT-2 small, say) would not fit the weights
SHAPE_KEYS = {
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
    "llama": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"),
}
# buffers some checkpoints carry that hold no trained value
IGNORED = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MinitfError(
            "transformers is not installed; pip install -e '.[hf]' (or pip install transformers)"
        ) from None
    return transformers


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
    rope = {"rope_type": "default", "rope_theta": cfg.rope_base}
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
    llama = dict(
        shape,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope,
        attention_bias=cfg.bias,
    )
    return llama if fmt == "qwen3" else dict(llama, mlp_bias=cfg.bias)


def hf_state(model: Transformer, fmt: str) -> dict[str, torch.Tensor]:
    """`fmt`'s *ForCausalLM state dict (float32, CPU) holding `model`'s weights, named and laid out as
    minitf.export.weights says. A model on the meta device gives meta tensors: the names and shapes
    a checkpoint of its config holds."""
    cfg, table = model.config, TABLES[fmt]
    tensors = minitf_tensors(model)
    out: dict[str, torch.Tensor] = {}
    for name, hf_names, w in hf_weights(table, cfg.n_layer):
        out.update(zip(hf_names, exported(w, name, tensors, table, w.hf_layout, cfg)))
    return {k: v.contiguous() for k, v in out.items()}


def to_hf(model: Transformer, tokenizer: Tokenizer, out_dir, formats: tuple[str, ...] = FORMATS) -> tuple[Path, str]:
    """Write `out_dir` so that AutoModelForCausalLM, AutoTokenizer and pipeline("text-generation")
    load it with minitf's logits and tokenization; returns (the directory, the format written).
    The format is the first of `formats` that computes the model exactly (minitf.export.architecture); a model
    none computes is refused, naming every blocking setting, before anything is written.
    Weights are written in float32."""
    cfg = model.config
    fmt = export_format(cfg, formats)
    check_vocab(tokenizer, cfg.vocab_size, "pass the tokenizer the model was trained with")
    tf = _transformers()
    config_class, model_class = HF_CLASSES[fmt]
    hf = getattr(tf, model_class)(getattr(tf, config_class)(**hf_config(cfg, fmt, tokenizer.eot_id)))
    hf.load_state_dict(hf_state(model, fmt), strict=True)  # strict: a name missed fails now, not as wrong logits
    # generate() and pipeline() stop at <|endoftext|> and pad with it, with no argument needed
    hf.generation_config = tf.GenerationConfig(
        bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id, pad_token_id=tokenizer.eot_id
    )
    out_dir = Path(out_dir)
    hf.save_pretrained(out_dir)
    tokenizer.save(out_dir / "tokenizer.json")
    # PreTrainedTokenizerFast reads tokenizer.json as it is: the same pre-tokenizer, merges and decoder
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": EOT,
                "eos_token": EOT,
                "unk_token": EOT,
                "model_max_length": cfg.block_size,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )
    return out_dir, fmt


def check_export_dir(out_dir, force: bool = False) -> Path:
    """`minitf export --out`: a new or empty directory (a non-empty one only with force), never a
    file and never a run directory, whose weights the export would replace."""
    out = Path(out_dir)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise MinitfError(
            f"--out {out} is {'a link' if out.is_symlink() else 'a file'}; --out names a directory to create"
        )
    if ckpt.is_run_dir(out):
        raise MinitfError(
            f"--out {out} is a minitf run directory; exporting there would replace its weights: choose a new directory"
        )
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not force:
        raise MinitfError(
            f"--out {out} is not empty (it has {', '.join(held[:4])}{', ...' * (len(held) > 4)}); "
            f"pass --force to write into it, or choose a new directory"
        )
    return out


def to_hf_gpt2(model: Transformer, tokenizer: Tokenizer, out_dir) -> Path:
    """to_hf restricted to GPT-2 (GPT2LMHeadModel); returns the directory."""
    return to_hf(model, tokenizer, out_dir, formats=("gpt2",))[0]


# ---------------------------------------------------------------------------------------------
# Hugging Face -> minitf


def _read_dir(where: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, every tensor of the directory's safetensors files)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not (where / "config.json").is_file():
        raise MinitfError(
            f"{where} has no config.json; pass a directory written by save_pretrained (config.json, model.safetensors)"
        )
    config = _json(where / "config.json", "a save_pretrained config.json")
    if not isinstance(config, dict):
        raise MinitfError(f"{where / 'config.json'} holds a JSON {type(config).__name__}, not a model config object")
    index = where / "model.safetensors.index.json"
    pickles = sorted(p.name for p in where.iterdir() if p.suffix in PICKLES)
    if index.is_file():  # sharded: the index names each tensor's file
        listing = _json(index, "a save_pretrained index")
        weight_map = listing.get("weight_map") if isinstance(listing, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise MinitfError(f"{index} has no weight_map of tensor names to files; is it a save_pretrained index?")
        files = sorted(set(weight_map.values()))
    elif (where / "model.safetensors").is_file():
        files = ["model.safetensors"]
    elif pickles:
        raise MinitfError(
            f"{where} holds its weights as a pickle ({', '.join(pickles[:3])}), which minitf never loads (it can run "
            f"code); convert it to safetensors first: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir)"
        )
    else:
        raise MinitfError(f"{where} has no model.safetensors; pass a directory written by save_pretrained")
    state = {}
    for name in files:
        try:
            state.update(load_file(str(where / name)))
        except (SafetensorError, OSError) as e:
            raise MinitfError(f"{where / name} is unreadable ({first_line(e, 120)})") from None
    return config, state


def _json(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MinitfError(f"{path} is not valid JSON ({first_line(e, 80)}); is it {what}?") from None


def _read(path_or_model, what: str) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(config dict, state dict, where) from a transformers model object or a local directory."""
    if isinstance(path_or_model, torch.nn.Module):
        if not hasattr(path_or_model, "config") or not hasattr(path_or_model.config, "to_dict"):
            raise MinitfError(
                f"{what} takes a transformers model or its directory, got a {type(path_or_model).__name__}"
            )
        return path_or_model.config.to_dict(), path_or_model.state_dict(), type(path_or_model).__name__
    where = Path(path_or_model)
    if not where.is_dir():
        raise MinitfError(
            f"could not load a model from {str(where)!r} (not a directory); pass a local directory written by "
            f"save_pretrained (config.json, model.safetensors)"
        )
    config, state = _read_dir(where)
    return config, state, str(where)


def _rope(c: dict) -> tuple[float, list[str]]:
    """(rope_theta, problems) from rope_parameters (transformers 5) or rope_theta/rope_scaling (older files)."""
    params = dict(c.get("rope_parameters") or {})
    scaling = c.get("rope_scaling") or {}
    theta = params.get("rope_theta", c.get("rope_theta", c.get("rotary_emb_base", 10000.0)))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    problems = [] if kind == "default" else [f"rope_scaling (rope_type={kind!r})"]
    return float(theta), problems


def _options(c: dict, fmt: str) -> tuple[dict, list[str]]:
    """(ModelConfig keyword arguments, problems: the settings minitf cannot compute) of an HF config."""
    problems = []

    def need(bad: bool, text: str) -> None:
        if bad:
            problems.append(text)

    if fmt == "gpt2":
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
        ), problems
    theta, rope_problems = _rope(c)
    problems += rope_problems
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    inter = c["intermediate_size"]
    common = dict(
        block_size=c.get("max_position_embeddings", 2048),
        n_layer=c["num_hidden_layers"],
        n_head=heads,
        n_embd=hidden,
        positions="rope",
        rope_base=theta,
        tie_embeddings=c.get("tie_word_embeddings", False),
    )
    need(hidden % heads != 0, f"hidden_size={hidden} not divisible by num_attention_heads={heads}")
    if fmt == "gptneox":
        act = c.get("hidden_act", "gelu")
        need(act not in HF_GELU, f"hidden_act={act!r}")
        need(c.get("use_parallel_residual", True), "use_parallel_residual=True (attention and MLP side by side)")
        factor = (c.get("rope_parameters") or {}).get("partial_rotary_factor", c.get("rotary_pct", 0.25))
        need(factor != 1.0, f"partial_rotary_factor={factor} (minitf rotates every dimension)")
        return dict(
            common,
            norm="layernorm",
            ffn="gelu",
            gelu=HF_GELU.get(act, "tanh"),
            ffn_hidden=None if inter == 4 * hidden else inter,
            norm_eps=c.get("layer_norm_eps", 1e-5),
            bias=True,  # GPT-NeoX's norms and MLP always have biases (attention_bias=false: zeros)
        ), problems
    # llama, qwen3
    act = c.get("hidden_act", "silu")
    need(act != "silu", f"hidden_act={act!r} (minitf's SwiGLU gates with silu)")
    head_dim = c.get("head_dim") or hidden // heads
    need(head_dim != hidden // heads, f"head_dim={head_dim} (minitf's is hidden_size / num_attention_heads)")
    kv = c.get("num_key_value_heads") or heads
    need(heads % kv != 0, f"num_key_value_heads={kv} not dividing num_attention_heads={heads}")
    need(bool(c.get("use_sliding_window")), "use_sliding_window=True (sliding-window attention)")
    need(c.get("sliding_window") is not None and fmt != "qwen3", f"sliding_window={c.get('sliding_window')}")
    layer_types = set(c.get("layer_types") or ["full_attention"])
    need(layer_types != {"full_attention"}, f"layer_types={sorted(layer_types)}")
    # one model.bias for every linear layer: a Llama with only some biases is minitf's with the rest zero
    bias = bool(c.get("attention_bias", False) or c.get("mlp_bias", False))
    return dict(
        common,
        n_kv_head=None if kv == heads else kv,
        norm="rmsnorm",
        ffn="swiglu",
        ffn_hidden=None if inter == swiglu_hidden(hidden) else inter,
        norm_eps=c.get("rms_norm_eps", 1e-6),
        bias=bias,
        qk_norm=fmt == "qwen3",
    ), problems


def _minitf_state(state: dict, cfg: ModelConfig, fmt: str, config: dict, expected: dict, missing: list[str]) -> dict:
    """minitf parameter name -> tensor, from `fmt`'s HF state dict (padding rows not included), as
    minitf.export.weights names and lays them out. Pops what it uses from `state`, so what is left
    over is what minitf has no place for. expected: {HF name: shape} of cfg's checkpoint. A tensor
    the checkpoint lacks is added to `missing` (so that every missing name can be reported at
    once); one the format may lack (where config.json's attention_bias is false, say) stands in as
    zeros."""
    with torch.device("meta"):
        params = {k for k, _ in Transformer(cfg).named_parameters()}  # a tied head is listed once, as wte
    out = {}
    for name, hf_names, w in hf_weights(TABLES[fmt], cfg.n_layer):
        if name is not None and name not in params:
            continue  # a bias of a model without biases, a tied head: nothing of minitf's to fill
        optional = w.optional is True or (bool(w.optional) and not config.get(w.optional, False))
        absent = [n for n in hf_names if n not in state and not optional]
        missing += absent
        parts = [state.pop(n).float() if n in state else torch.zeros(expected[n]) for n in hf_names]
        t = None if absent else w.hf_layout.join(parts, hf_names, cfg)
        if name is not None and t is not None:
            out[name] = t
    return out


def from_hf(path_or_model, vocab_size: int | None = None) -> Transformer:
    """A minitf Transformer with the logits of a Hugging Face GPT-2, Llama, Qwen3 or GPT-NeoX model
    (a transformers model object, or a local directory: config.json and safetensors files).

    vocab_size: keep only the first vocab_size rows of the embedding and head (a checkpoint may
    hold more rows than its tokenizer has tokens; the tokenizer never produces the others).
    Settings minitf cannot compute are named together in one MinitfError, and so are the tensors
    that do not make one complete model of the config (missing, left over, of another shape, or
    holding NaN/inf): no layer is ever left at its random initial value.
    """
    config, state, where = _read(path_or_model, "from_hf")
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise MinitfError(
            f"{where} holds a {model_type!r} model; minitf imports {', '.join(sorted(MODEL_TYPES))} "
            f"(GPT-2, Llama, Qwen3, GPT-NeoX)"
        )
    fmt = MODEL_TYPES[model_type]
    _check_shape_keys(config, fmt, where)
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
    cfg = ModelConfig(vocab_size=vocab_size or hf_vocab, dropout=0.0, **options)
    state = dict(state)
    base = TABLES[fmt].hf_prefix
    if not any(k.startswith(base) for k in state):  # a base-model checkpoint (gpt2 on the hub): names unprefixed
        state = {k if k == "lm_head.weight" else base + k: v for k, v in state.items()}
    if "embed_out.weight" in state:  # older GPT-NeoX files name the head embed_out
        state["lm_head.weight"] = state.pop("embed_out.weight")
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):  # the names and shapes this config's checkpoint holds, without any memory
        expected = {k: tuple(v.shape) for k, v in hf_state(Transformer(cfg), fmt).items()}
    _check_shapes(state, expected, cfg.vocab_size, fmt, where)
    ckpt.refuse_non_finite(
        sorted(state.items()), where, "it cannot be fine-tuned from; fetch or convert the model again"
    )
    missing: list[str] = []
    weights = _minitf_state(state, cfg, fmt, config, expected, missing)
    left = sorted(k for k in state if not k.endswith(IGNORED))
    if missing or left:
        raise MinitfError(
            f"{where} does not hold one complete {FORMAT_NAMES[fmt]} model of its config.json: "
            + "; ".join(
                f"{what} {_some(names)}" for what, names in (("missing", missing), ("no place for", left)) if names
            )
            + "; minitf never fills a layer with random values: use the directory save_pretrained wrote"
        )
    model = Transformer(cfg)
    V = cfg.vocab_size
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head is listed once, as wte.weight
            src = weights[name]
            if name in ("wte.weight", "lm_head.weight"):
                p, src = p[:V], src[:V]  # the padding rows stay zero
            if p.shape != src.shape:  # _check_shapes has named the file's tensor; this is the last guard
                raise MinitfError(f"{where}: {name} has shape {tuple(src.shape)}, its config says {tuple(p.shape)}")
            p.copy_(src)
    return model.eval()


def _some(names: list[str], n: int = 3) -> str:
    """Up to n names, and how many more."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


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


def _check_shapes(state: dict, expected: dict, vocab: int, fmt: str, where) -> None:
    """Every tensor of the checkpoint that the config knows has the shape the config gives it (an
    embedding or head may hold more rows than the tokenizer's vocab: the extra ones are dropped).
    All that differ are named together, with the file's names and shapes."""
    rows = {n for _, names, w in hf_weights(TABLES[fmt], 0) if w.hf_layout is VOCAB_ROWS for n in names}
    wrong = []
    for name in sorted(state.keys() & expected.keys()):
        have, want = tuple(state[name].shape), expected[name]
        if name in rows:
            fits = len(have) == 2 and have[1] == want[1] and have[0] >= vocab
            want_text = f"({vocab} or more, {want[1]})"
        else:
            fits, want_text = have == want, str(want)
        if not fits:
            wrong.append(f"{name} {have} where config.json needs {want_text}")
    if wrong:
        raise MinitfError(
            f"{where}: tensors of another shape than its config.json describes: {_some(wrong)}; "
            f"the weights and config.json do not belong together"
        )


def from_hf_gpt2(path_or_model) -> Transformer:
    """from_hf for GPT-2 only (a GPT2LMHeadModel or its directory)."""
    config = path_or_model.config.to_dict() if hasattr(path_or_model, "config") else None
    if isinstance(path_or_model, torch.nn.Module) and config is None:
        raise MinitfError(
            f"from_hf_gpt2 takes a GPT2LMHeadModel or its directory, got a {type(path_or_model).__name__}"
        )
    model = from_hf(path_or_model)
    if model.config.positions != "learned" or model.config.norm != "layernorm" or model.config.ffn != "gelu":
        raise MinitfError(f"{path_or_model} is not a GPT-2 model; from_hf reads Llama, Qwen3 and GPT-NeoX too")
    return model


def load_pretrained(path) -> tuple[Transformer, Tokenizer]:
    """(model, tokenizer) from a local Hugging Face GPT-2, Llama, Qwen3 or GPT-NeoX directory, to
    fine-tune from (run.init_from). Nothing is downloaded: fetch a hub model with your own tools first.

    The tokenizer is the directory's tokenizer.json, or GPT-2's classic vocab.json + merges.txt
    (what GPT2Tokenizer.save_pretrained writes), read as the byte-level BPE they describe.
    """
    where = Path(path)
    if not where.is_dir():
        pickled = " (a pickle, which minitf never loads: it can run code)" if where.suffix in PICKLES else ""
        raise MinitfError(
            f"run.init_from={str(path)!r} is not a directory{pickled}; pass a local Hugging Face GPT-2, Llama or "
            f"Qwen3 directory (config.json, model.safetensors, tokenizer files)"
        )
    if (where / "tokenizer.json").is_file():
        tokenizer = Tokenizer.load(where / "tokenizer.json")
    elif (where / "vocab.json").is_file() and (where / "merges.txt").is_file():
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        backend = HFTokenizer(models.BPE.from_file(str(where / "vocab.json"), str(where / "merges.txt")))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        if backend.token_to_id(EOT) is not None:
            backend.add_special_tokens([EOT])  # so a literal <|endoftext|> in text is the separator, as in GPT-2
        tokenizer = Tokenizer(backend)
    else:
        raise MinitfError(
            f"{where} holds no tokenizer (tokenizer.json, or vocab.json and merges.txt); "
            f"save the model's tokenizer into it with save_pretrained"
        )
    model = from_hf(where, vocab_size=tokenizer.vocab_size)
    check_vocab(
        tokenizer, model.config.vocab_size, "save the model's own tokenizer beside it", f"{where}: the tokenizer"
    )
    return model.train(), tokenizer
