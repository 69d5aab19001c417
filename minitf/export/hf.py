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

# minitf format -> the transformers classes that hold it, and HF model_type -> minitf format
HF_CLASSES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gptneox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
}
MODEL_TYPES = {"gpt2": "gpt2", "llama": "llama", "qwen3": "qwen3", "gpt_neox": "gptneox"}
# the prefix of the base model's weights in each *ForCausalLM (hub files sometimes hold the base model only)
PREFIX = {"gpt2": "transformer.", "llama": "model.", "qwen3": "model.", "gptneox": "gpt_neox."}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
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


def _neox_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Fused q|k|v rows (3 H D, ...), q for all heads then k then v -> GPT-NeoX's head by head (q_h k_h v_h)."""
    return w.reshape(3, n_head, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def _from_neox_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of _neox_rows."""
    return w.reshape(n_head, 3, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def hf_state(model: Transformer, fmt: str) -> dict[str, torch.Tensor]:
    """`fmt`'s *ForCausalLM state dict (float32, CPU) holding `model`'s weights. A model on the
    meta device gives meta tensors: the names and shapes a checkpoint of its config holds."""
    cfg = model.config
    V, C, H, KV, D = cfg.vocab_size, cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.head_dim
    F = ffn_hidden(cfg)
    sd = {k: v.detach().float().to(v.device if v.is_meta else "cpu") for k, v in model.state_dict().items()}
    zeros = {  # the bias each minitf weight would have: zeros where model.bias=false
        "ln_1": C,
        "ln_2": C,
        "attn.c_attn": (H + 2 * KV) * D,
        "attn.c_proj": C,
        "mlp.c_fc": 2 * F if cfg.ffn == "swiglu" else F,
        "mlp.c_proj": C,
    }

    def bias(p: str, part: str) -> torch.Tensor:
        return sd.get(f"{p}{part}.bias", torch.zeros(zeros[part]))

    out: dict[str, torch.Tensor] = {}
    base = PREFIX[fmt]
    head = sd["lm_head.weight"][:V]  # the padding rows dropped; the same tensor as wte when tied
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        if fmt == "gpt2":
            h = f"{base}h.{i}."
            for part, name in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
                out[h + name + ".weight"], out[h + name + ".bias"] = sd[p + part + ".weight"], bias(p, part)
            for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                out[h + part + ".weight"] = sd[p + part + ".weight"].t()  # Linear (out, in) -> Conv1D (in, out)
                out[h + part + ".bias"] = bias(p, part)
        elif fmt == "gptneox":
            h = f"{base}layers.{i}."
            out[h + "input_layernorm.weight"], out[h + "input_layernorm.bias"] = sd[p + "ln_1.weight"], bias(p, "ln_1")
            out[h + "post_attention_layernorm.weight"] = sd[p + "ln_2.weight"]
            out[h + "post_attention_layernorm.bias"] = bias(p, "ln_2")
            out[h + "attention.query_key_value.weight"] = _neox_rows(sd[p + "attn.c_attn.weight"], H)
            out[h + "attention.query_key_value.bias"] = _neox_rows(bias(p, "attn.c_attn"), H)
            out[h + "attention.dense.weight"], out[h + "attention.dense.bias"] = (
                sd[p + "attn.c_proj.weight"],
                bias(p, "attn.c_proj"),
            )
            out[h + "mlp.dense_h_to_4h.weight"], out[h + "mlp.dense_h_to_4h.bias"] = (
                sd[p + "mlp.c_fc.weight"],
                bias(p, "mlp.c_fc"),
            )
            out[h + "mlp.dense_4h_to_h.weight"], out[h + "mlp.dense_4h_to_h.bias"] = (
                sd[p + "mlp.c_proj.weight"],
                bias(p, "mlp.c_proj"),
            )
        else:  # llama, qwen3
            h = f"{base}layers.{i}."
            out[h + "input_layernorm.weight"] = sd[p + "ln_1.weight"]
            out[h + "post_attention_layernorm.weight"] = sd[p + "ln_2.weight"]
            sizes = (H * D, KV * D, KV * D)
            for suffix in ("weight", "bias") if cfg.bias else ("weight",):
                q, k, v = sd[f"{p}attn.c_attn.{suffix}"].split(sizes)
                gate, up = sd[f"{p}mlp.c_fc.{suffix}"].chunk(2)  # silu(x W_gate) * (x W_up), fused in minitf
                out[f"{h}self_attn.q_proj.{suffix}"] = q
                out[f"{h}self_attn.k_proj.{suffix}"] = k
                out[f"{h}self_attn.v_proj.{suffix}"] = v
                out[f"{h}self_attn.o_proj.{suffix}"] = sd[f"{p}attn.c_proj.{suffix}"]
                out[f"{h}mlp.gate_proj.{suffix}"], out[f"{h}mlp.up_proj.{suffix}"] = gate, up
                out[f"{h}mlp.down_proj.{suffix}"] = sd[f"{p}mlp.c_proj.{suffix}"]
            if fmt == "qwen3":  # minitf's q/k norm has no weight: Qwen3's, set to one, multiplies by 1
                out[h + "self_attn.q_norm.weight"] = torch.ones(D)
                out[h + "self_attn.k_norm.weight"] = torch.ones(D)
    if fmt == "gpt2":
        out[base + "wte.weight"] = sd["wte.weight"][:V]
        # learned: the trained table; sinusoidal: the fixed one minitf adds, which is the same thing
        out[base + "wpe.weight"] = sd["wpe.wpe.weight"] if cfg.positions == "learned" else model.wpe.table.float()
        out[base + "ln_f.weight"], out[base + "ln_f.bias"] = sd["ln_f.weight"], sd.get("ln_f.bias", torch.zeros(C))
    elif fmt == "gptneox":
        out[base + "embed_in.weight"] = sd["wte.weight"][:V]
        out[base + "final_layer_norm.weight"] = sd["ln_f.weight"]
        out[base + "final_layer_norm.bias"] = sd.get("ln_f.bias", torch.zeros(C))
    else:
        out[base + "embed_tokens.weight"] = sd["wte.weight"][:V]
        out[base + "norm.weight"] = sd["ln_f.weight"]
    out["lm_head.weight"] = head
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


def _minitf_state(state: dict, cfg: ModelConfig, fmt: str, attention_bias: bool, mlp_bias: bool, missing=None):
    """minitf parameter name -> tensor, from `fmt`'s HF state dict (padding rows not included).
    Pops what it uses from `state`, so what is left over is what minitf has no place for.
    missing: (a list, the expected HF shapes): a tensor the checkpoint lacks is added to the list and
    stands in as zeros, so that every missing name can be reported at once; None: the first raises."""
    H, KV, D, C = cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.n_embd
    base = PREFIX[fmt]
    F = ffn_hidden(cfg)

    def take(name: str, size: int | None = None) -> torch.Tensor:
        """HF tensor `name` (a missing optional bias of `size`: zeros)."""
        if name in state:
            return state.pop(name).float()
        if size is not None:
            return torch.zeros(size)
        if missing is not None and name in missing[1]:
            missing[0].append(name)
            return torch.zeros(missing[1][name])
        raise MinitfError(f"the checkpoint has no {name}; is it a complete {FORMAT_NAMES[fmt]} model?")

    out = {}
    for i in range(cfg.n_layer):
        p = f"blocks.{i}."
        if fmt == "gpt2":
            h = f"{base}h.{i}."
            for part in ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                w = take(h + part + ".weight")
                out[p + part + ".weight"] = w.t() if (part + ".weight").endswith(CONV1D) else w
                out[p + part + ".bias"] = take(h + part + ".bias")
        elif fmt == "gptneox":
            h = f"{base}layers.{i}."
            out[p + "ln_1.weight"], out[p + "ln_1.bias"] = (
                take(h + "input_layernorm.weight"),
                take(h + "input_layernorm.bias"),
            )
            out[p + "ln_2.weight"], out[p + "ln_2.bias"] = (
                take(h + "post_attention_layernorm.weight"),
                take(h + "post_attention_layernorm.bias"),
            )
            out[p + "attn.c_attn.weight"] = _from_neox_rows(take(h + "attention.query_key_value.weight"), H)
            out[p + "attn.c_attn.bias"] = _from_neox_rows(take(h + "attention.query_key_value.bias", 3 * C), H)
            out[p + "attn.c_proj.weight"] = take(h + "attention.dense.weight")
            out[p + "attn.c_proj.bias"] = take(h + "attention.dense.bias", C)
            out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = (
                take(h + "mlp.dense_h_to_4h.weight"),
                take(h + "mlp.dense_h_to_4h.bias"),
            )
            out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = (
                take(h + "mlp.dense_4h_to_h.weight"),
                take(h + "mlp.dense_4h_to_h.bias"),
            )
        else:
            h = f"{base}layers.{i}."
            out[p + "ln_1.weight"] = take(h + "input_layernorm.weight")
            out[p + "ln_2.weight"] = take(h + "post_attention_layernorm.weight")
            for suffix in ("weight", "bias") if cfg.bias else ("weight",):
                a = suffix == "weight" or attention_bias  # a missing bias (bias only in the MLP, say) is zero
                m = suffix == "weight" or mlp_bias
                q = take(f"{h}self_attn.q_proj.{suffix}", None if a else H * D)
                k = take(f"{h}self_attn.k_proj.{suffix}", None if a else KV * D)
                v = take(f"{h}self_attn.v_proj.{suffix}", None if a else KV * D)
                out[f"{p}attn.c_attn.{suffix}"] = torch.cat((q, k, v))
                out[f"{p}attn.c_proj.{suffix}"] = take(f"{h}self_attn.o_proj.{suffix}", None if a else C)
                gate = take(f"{h}mlp.gate_proj.{suffix}", None if m else F)
                up = take(f"{h}mlp.up_proj.{suffix}", None if m else F)
                out[f"{p}mlp.c_fc.{suffix}"] = torch.cat((gate, up))
                out[f"{p}mlp.c_proj.{suffix}"] = take(f"{h}mlp.down_proj.{suffix}", None if m else C)
            if fmt == "qwen3":
                for norm in ("q_norm", "k_norm"):
                    w = take(f"{h}self_attn.{norm}.weight")
                    if missing is not None and f"{h}self_attn.{norm}.weight" in missing[0]:
                        continue
                    if not torch.equal(w, torch.ones_like(w)):
                        raise MinitfError(
                            f"{h}self_attn.{norm}.weight is not all ones; minitf's q/k norm has no weight, "
                            f"so only Qwen3 models with unit q_norm/k_norm weights import"
                        )
    if fmt == "gpt2":
        out["wte.weight"] = take(base + "wte.weight")
        out["wpe.wpe.weight"] = take(base + "wpe.weight")
        out["ln_f.weight"], out["ln_f.bias"] = take(base + "ln_f.weight"), take(base + "ln_f.bias")
    elif fmt == "gptneox":
        out["wte.weight"] = take(base + "embed_in.weight")
        out["ln_f.weight"] = take(base + "final_layer_norm.weight")
        out["ln_f.bias"] = take(base + "final_layer_norm.bias")
    else:
        out["wte.weight"] = take(base + "embed_tokens.weight")
        out["ln_f.weight"] = take(base + "norm.weight")
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
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
    base = PREFIX[fmt]
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
    weights = _minitf_state(
        state,
        cfg,
        fmt,
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        missing=(missing, expected),
    )
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
    rows = {PREFIX[fmt] + e for e in ("wte.weight", "embed_in.weight", "embed_tokens.weight")} | {"lm_head.weight"}
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
