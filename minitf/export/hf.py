"""Hugging Face `transformers` interop: write a minitf model as the standard architecture that computes
it (GPT-2, Llama, Qwen3 or GPT-NeoX; minitf.export.architecture decides), and read such a directory back.

The directory's config.json is minitf.export.hf_config's; its tensors are the model's, named and
laid out as minitf.export.weights says (minitf.export.hf_tensors): only the storage differs from
minitf's, never a value. The embedding and head hold exactly the tokenizer's vocabulary
(vocab_size), so no padding id can ever be generated.

Export needs transformers (the `hf` extra: pip install -e '.[hf]'); import reads config.json and
safetensors files directly (never a pickle, minitf.export.hf_files), so it does not. transformers
is imported inside the functions only, so `import minitf` never needs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import Config
from ..errors import MinitfError
from ..model import Transformer
from ..run_dir import as_device, is_run_dir, load_run, which_weights
from ..system.files import atomic_write_dir, special_kind
from ..system.runtime import DTYPES
from ..tokenizer import Tokenizer, check_vocab
from .architecture import FORMATS, export_format
from .hf_config import check_memory, hf_config, model_config
from .hf_files import PICKLES, read, read_tokenizer
from .hf_tensors import hf_state, minitf_weights
from .hub import is_hub_id, local_dir
from .weights import TABLES

# minitf format -> the transformers config and model classes that hold it
HF_CLASSES = {fmt: table.hf_classes for fmt, table in TABLES.items()}


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


def to_hf(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir,
    formats: tuple[str, ...] = FORMATS,
    dtype: torch.dtype = torch.float32,
) -> tuple[Path, str]:
    """Write `out_dir` so that AutoModelForCausalLM, AutoTokenizer and pipeline("text-generation")
    load it with minitf's logits and tokenization; returns (the directory, the format written).
    The format is the first of `formats` that computes the model exactly (minitf.export.architecture); a model
    none computes is refused, naming every blocking setting, before anything is written.
    Weights are written in dtype (a run's run.weights_dtype: a downloaded bfloat16 model goes back in bfloat16)."""
    cfg = model.config
    fmt = export_format(cfg, formats)
    check_vocab(tokenizer, cfg.vocab_size, "pass the tokenizer the model was trained with")
    tf = _transformers()
    config_class, model_class = HF_CLASSES[fmt]
    hf = getattr(tf, model_class)(getattr(tf, config_class)(**hf_config(cfg, fmt, tokenizer.eot_id)))
    hf.load_state_dict(hf_state(model, fmt), strict=True)  # strict: a name missed fails now, not as wrong logits
    hf.to(dtype)  # in place, one tensor at a time; config.json says the dtype
    # generate() and pipeline() stop at <|endoftext|> and pad with it, with no argument needed; and
    # at the model's context (max_length counts the prompt too): pipeline()'s own default,
    # max_new_tokens=256, is dropped where the model's generation config sets max_length. A chat
    # model's answer ends at its end-of-turn token (ChatML's <|im_end|>): generate() stops there too
    ends = _ends(tokenizer)
    hf.generation_config = tf.GenerationConfig(
        bos_token_id=tokenizer.eot_id,
        eos_token_id=ends if len(ends) > 1 else ends[0],
        pad_token_id=tokenizer.eot_id,
        max_length=cfg.block_size,
    )
    out_dir = Path(out_dir)
    # into a temporary directory beside out_dir, then renamed into place: a full or read-only disk
    # leaves one line and nothing half-written that the next export would refuse as "not empty"
    atomic_write_dir(out_dir, lambda tmp: _save(hf, tokenizer, cfg.block_size, tmp))
    return out_dir, fmt


def _ends(tokenizer: Tokenizer) -> list[int]:
    """The ids generation stops at: a chat model's end-of-turn token first, then <|endoftext|>."""
    template = getattr(tokenizer, "chat_template", None)
    turn = template.end_of_turn(tokenizer) if template is not None else tokenizer.eot_id
    return list(dict.fromkeys([turn, tokenizer.eot_id]))


def _save(hf, tokenizer: Tokenizer, block_size: int, out_dir: Path) -> None:
    """Write the transformers model, tokenizer.json and tokenizer_config.json into out_dir; for a
    chat model also its template, in tokenizer_config.json and in chat_template.jinja (where
    transformers' own save_pretrained keeps it), with the end-of-turn token as eos_token, so
    apply_chat_template renders minitf's prompt and pipelines stop where minitf.chat stops."""
    hf.save_pretrained(out_dir)
    tokenizer.save(out_dir / "tokenizer.json")
    template = getattr(tokenizer, "chat_template", None)
    special = template.special if template is not None else {}
    # PreTrainedTokenizerFast reads tokenizer.json as it is: the same pre-tokenizer, merges and decoder
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": special.get("bos_token", tokenizer.eot),
        "eos_token": tokenizer.backend.id_to_token(_ends(tokenizer)[0]),
        "unk_token": tokenizer.eot,
        "model_max_length": block_size,
        "clean_up_tokenization_spaces": False,
    }
    if template is not None:
        config["chat_template"] = template.source
        template.save(out_dir)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def check_export_dir(out_dir, force: bool = False) -> Path:
    """`minitf export --out`: a new or empty directory (a non-empty one only with force), never a
    file and never a run directory, whose weights the export would replace. Inside it, a file the
    export writes replaces a regular file only (system.files.atomic_write_dir refuses a FIFO there)."""
    out = Path(out_dir)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a link" if out.is_symlink() else special_kind(out) or "a file"
        raise MinitfError(f"--out {out} is {what}; --out names a directory to create")
    if is_run_dir(out):
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


def from_hf(path_or_model, vocab_size: int | None = None, frozen: torch.dtype | None = None) -> Transformer:
    """A minitf Transformer with the logits of a Hugging Face GPT-2, Llama, Qwen3 or GPT-NeoX model
    (a transformers model object, or a local directory: config.json and safetensors files).

    vocab_size: keep only the first vocab_size rows of the embedding and head (a checkpoint may
    hold more rows than its tokenizer has tokens; the tokenizer never produces the others).
    Settings minitf cannot compute are named together in one MinitfError, and so are the tensors
    that do not make one complete model of the config (missing, left over, of another shape, or
    holding NaN/inf): no layer is ever left at its random initial value.
    frozen: a LoRA run's 16-bit dtype, which its frozen matrices are loaded in (minitf_weights).
    """
    config, state, where = read(path_or_model, "from_hf")
    fmt, cfg = model_config(config, vocab_size, where)
    check_memory(cfg, fmt, config, sum(t.numel() * t.element_size() for t in state.values()), where)
    weights = minitf_weights(state, cfg, fmt, config, where, frozen)  # the embedding and head padded (VocabRows)
    model = Transformer.holding(cfg, weights).eval()  # the weights themselves: never a second copy
    model.stored_dtype = stored_dtype(state)  # what a fine-tune of it writes back (run.weights_dtype=auto)
    return model


def stored_dtype(state: dict) -> str:
    """The dtype most of a checkpoint's bytes are stored in ("bfloat16" for most downloads)."""
    held: dict[torch.dtype, int] = {}
    for t in state.values():
        if t.dtype.is_floating_point:
            held[t.dtype] = held.get(t.dtype, 0) + t.numel() * t.element_size()
    best = max(held, key=held.get, default=torch.float32)
    return str(best).removeprefix("torch.") if best in (torch.bfloat16, torch.float16) else "float32"


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


def load_pretrained(
    path, key: str = "run.init_from", frozen: torch.dtype | None = None
) -> tuple[Transformer, Tokenizer]:
    """(model, tokenizer) from a Hugging Face model of a family minitf imports (GPT-2, Llama, Qwen2,
    Qwen3, Mistral, Phi-3, GPT-NeoX), to fine-tune from (run.init_from) or talk to: a local
    directory, or a hub id (`Qwen/Qwen3-0.6B`), found in or fetched into the Hugging Face cache
    (minitf.export.hub). key: what the user set it as, for messages.

    The tokenizer is the directory's tokenizer.json, or GPT-2's classic vocab.json + merges.txt
    (what GPT2Tokenizer.save_pretrained writes), read as the byte-level BPE they describe.
    frozen: a LoRA run's 16-bit dtype, which its frozen matrices are loaded in (from_hf).
    """
    where = local_dir(str(path), key)
    if not where.is_dir():
        pickled = " (a pickle, which minitf never loads: it can run code)" if where.suffix in PICKLES else ""
        raise MinitfError(
            f"{key}={str(path)!r} is not a directory{pickled}; pass a local Hugging Face model directory "
            f"(config.json, model.safetensors, tokenizer files) or a hub id such as Qwen/Qwen3-0.6B"
        )
    tokenizer = read_tokenizer(where)
    model = from_hf(where, vocab_size=tokenizer.vocab_size, frozen=frozen)
    check_vocab(
        tokenizer, model.config.vocab_size, "save the model's own tokenizer beside it", f"{where}: the tokenizer"
    )
    return model.train(), tokenizer


# ---------------------------------------------------------------------------------------------
# a run or a downloaded model, for the commands that use one


def is_hf_model(path) -> bool:
    """Whether path names a Hugging Face model (a hub id, or a directory with config.json and no minitf run)."""
    where = Path(path)
    return is_hub_id(str(path)) or ((where / "config.json").is_file() and not is_run_dir(where))


def load_model(
    path, best: bool = False, device="cpu", key: str = "--run", dtype: str = "float32"
) -> tuple[Transformer, Tokenizer, Config]:
    """(model in eval mode, tokenizer, config) for minitf chat, generate and serve: a minitf run
    directory (run_dir.load_run), or a Hugging Face model of a family minitf imports, a directory or
    a hub id, as it was downloaded (its config: minitf's defaults with the model's model.*).
    dtype: torch's name of the weights' dtype while sampling (--dtype); a 16-bit one halves the
    bytes each decoded token reads (a downloaded model's 16-bit matrices are read straight into it)."""
    wanted = DTYPES[dtype]
    if not is_hf_model(path):
        model, tokenizer, cfg = load_run(path, best=best, device=device)
        return model.to(wanted), tokenizer, cfg
    if best:
        raise MinitfError(f"--best reads a run's best.safetensors; {path} is a Hugging Face model: leave --best out")
    model, tokenizer = load_pretrained(path, key, frozen=None if wanted == torch.float32 else wanted)
    cfg = Config()
    cfg.model = model.config
    return model.to(as_device(device), wanted).eval(), tokenizer, cfg


def describe_weights(path, best: bool, verb: str) -> str:
    """The weights a command uses, for its start-up line: a run's file and step (run_dir.which_weights),
    or a downloaded model's family."""
    if not is_hf_model(path):
        return which_weights(path, best, verb)
    return "a downloaded Hugging Face model, as it is"
