"""Hugging Face `transformers` interop: write a minitf model as a GPT-2 directory, read GPT-2 back.

GPT-2 is the minitf model with positions=learned, norm=layernorm, ffn=gelu, gelu=tanh, bias=true
and the head tied to the embedding. Only the storage differs: HF's Conv1D keeps each projection
as (in, out) where nn.Linear keeps (out, in), so those matrices are transposed; and minitf pads
the embedding rows to a multiple of 64 while HF keeps exactly vocab_size rows.

transformers (the `hf` extra: pip install -e '.[hf]') is imported inside the functions only,
so `import minitf` never needs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import MinitfError, ModelConfig
from .errors import first_line
from .model import Transformer
from .tokenizer import EOT, Tokenizer, check_vocab

# what GPT-2 is; any other value of these keys has no GPT-2 form
GPT2_SETTINGS = {
    "positions": "learned",
    "norm": "layernorm",
    "ffn": "gelu",
    "gelu": "tanh",
    "bias": True,
    "tie_embeddings": True,
    "qk_norm": False,
    "logit_softcap": None,
}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# HF activation names -> model.gelu; gelu_new, gelu_fast and gelu_pytorch_tanh are one formula
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
LAYERNORM_EPS = 1e-5  # minitf's nn.LayerNorm default, and GPT-2's


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MinitfError(
            "transformers is not installed; pip install -e '.[hf]' (or pip install transformers)"
        ) from None
    return transformers


def _yaml(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def check_gpt2_compatible(cfg: ModelConfig) -> None:
    """Raise MinitfError naming the first setting that GPT-2 cannot express."""
    for key, want in GPT2_SETTINGS.items():
        have = getattr(cfg, key)
        if have != want:
            raise MinitfError(
                f"model.{key}={_yaml(have)} has no GPT-2 equivalent; only models with "
                f"model.{key}={_yaml(want)} can be exported to Hugging Face GPT-2"
            )


def _hf_name(name: str) -> str:
    """minitf parameter name -> GPT2LMHeadModel state_dict name."""
    if name.startswith("lm_head."):
        return name
    return "transformer." + name.replace("blocks.", "h.").replace("wpe.wpe.", "wpe.")


def to_hf_gpt2(model: Transformer, tokenizer: Tokenizer, out_dir) -> Path:
    """Write `out_dir` so that GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained
    load it, with minitf's logits and tokenization. Weights are written in float32."""
    cfg = model.config
    check_gpt2_compatible(cfg)
    check_vocab(tokenizer, cfg.vocab_size, "pass the tokenizer the model was trained with")
    tf = _transformers()
    hf_cfg = tf.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        activation_function="gelu_new",
        layer_norm_epsilon=LAYERNORM_EPS,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=tokenizer.eot_id,
        eos_token_id=tokenizer.eot_id,
        tie_word_embeddings=True,
    )
    state = {}
    for name, p in model.state_dict().items():
        p = p.detach().float().cpu()
        if name in ("wte.weight", "lm_head.weight"):
            p = p[: cfg.vocab_size]  # drop the padding rows
        elif name.endswith(CONV1D):
            p = p.t()  # Linear (out, in) -> Conv1D (in, out)
        state[_hf_name(name)] = p.contiguous()
    hf = tf.GPT2LMHeadModel(hf_cfg)
    hf.load_state_dict(state, strict=True)  # strict: a name missed here fails now, not as wrong logits later
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
    return out_dir


def _load_gpt2(path_or_model):
    tf = _transformers()
    if isinstance(path_or_model, tf.GPT2LMHeadModel):
        return path_or_model
    if isinstance(path_or_model, torch.nn.Module):
        raise MinitfError(
            f"from_hf_gpt2 takes a GPT2LMHeadModel or its directory, got a {type(path_or_model).__name__}"
        )
    where = str(path_or_model)
    try:
        model_type = tf.AutoConfig.from_pretrained(where).model_type
        if model_type != "gpt2":
            raise MinitfError(f"{where} holds a {model_type!r} model, not GPT-2; only GPT-2 can be imported")
        return tf.GPT2LMHeadModel.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise MinitfError(
            f"could not load a GPT-2 model from {where!r} ({first_line(e, 160)}); "
            f"pass a directory written by save_pretrained or to_hf_gpt2"
        ) from None


def from_hf_gpt2(path_or_model) -> Transformer:
    """A minitf Transformer with the logits of a HF GPT-2 (a GPT2LMHeadModel or a local directory).

    The tokenizer of a directory that holds a tokenizer.json loads with minitf.Tokenizer.load(dir).
    """
    hf = _load_gpt2(path_or_model)
    c = hf.config
    problems = {
        "activation_function": c.activation_function not in HF_GELU,
        "n_inner": c.n_inner not in (None, 4 * c.n_embd),
        "layer_norm_epsilon": abs(c.layer_norm_epsilon - LAYERNORM_EPS) > 1e-12,
        "scale_attn_weights": not c.scale_attn_weights,
        "scale_attn_by_inverse_layer_idx": c.scale_attn_by_inverse_layer_idx,
        "add_cross_attention": c.add_cross_attention,
    }
    for key, bad in problems.items():
        if bad:
            raise MinitfError(
                f"GPT-2 config {key}={getattr(c, key)!r} has no minitf equivalent; minitf imports plain GPT-2 only"
            )
    tied = bool(getattr(c, "tie_word_embeddings", True))
    cfg = ModelConfig(
        vocab_size=c.vocab_size,
        block_size=c.n_positions,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_embd=c.n_embd,
        positions="learned",
        norm="layernorm",
        ffn="gelu",
        gelu=HF_GELU[c.activation_function],
        dropout=float(c.resid_pdrop),
        bias=True,
        tie_embeddings=tied,
    )
    model = Transformer(cfg)
    hf_state = hf.state_dict()
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head is listed once, as wte.weight
            src = hf_state[_hf_name(name)].float()
            if name.endswith(CONV1D):
                src = src.t()  # Conv1D (in, out) -> Linear (out, in)
            if name in ("wte.weight", "lm_head.weight"):
                p[: cfg.vocab_size].copy_(src)  # the padding rows stay zero
            else:
                p.copy_(src)
    return model.eval()


def load_pretrained(path) -> tuple[Transformer, Tokenizer]:
    """(model, tokenizer) from a local Hugging Face GPT-2 directory, to fine-tune from
    (run.init_from). Nothing is downloaded: fetch a hub model with your own tools first.

    The tokenizer is the directory's tokenizer.json, or GPT-2's classic vocab.json + merges.txt
    (what GPT2Tokenizer.save_pretrained writes), read as the byte-level BPE they describe.
    """
    where = Path(path)
    if not where.is_dir():
        raise MinitfError(
            f"run.init_from={str(path)!r} is not a directory; pass a local Hugging Face GPT-2 "
            f"directory (config.json, model weights, tokenizer files)"
        )
    model = from_hf_gpt2(where)
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
    check_vocab(
        tokenizer, model.config.vocab_size, "save the model's own tokenizer beside it", f"{where}: the tokenizer"
    )
    return model.train(), tokenizer
