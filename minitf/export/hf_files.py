"""What a local Hugging Face directory holds, read without transformers and never unpickled:
config.json, the safetensors files (one, or shards with their index), the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..chat_template import TEMPLATE_FILE
from ..conversations.template_files import load_template
from ..errors import MinitfError, first_line
from ..tokenizer import EOT, SEPARATORS, Tokenizer
from .hub import containing_folder

# what torch.save and pickle write: never loaded (unpickling can run code), but named when they are all there is
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# the most a downloaded text file is read whole: config.json and a shard index are kilobytes, the
# largest tokenizers tens of megabytes; more is not what the name says, and reading it could fill memory
MAX_JSON_BYTES = 16 << 20
MAX_TOKENIZER_BYTES = 256 << 20


def read(path_or_model, what: str) -> tuple[dict, dict, str]:
    """(config dict, state dict, where) from a transformers model object (its tensors) or a local
    directory (FileTensors, read when used)."""
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


def _read_dir(where: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, every tensor of the directory's safetensors files)."""
    from safetensors import SafetensorError, safe_open

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
        for name in files:
            _check_inside(where, name, index)
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
            with safe_open(str(where / name), framework="pt") as f:
                state.update((key, FileTensor(where / name, key, f.get_slice(key))) for key in f.keys())
        except (SafetensorError, OSError) as e:
            raise MinitfError(f"{where / name} is unreadable ({first_line(e, 120)})") from None
    return config, state


# safetensors' dtype names -> torch's
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class FileTensor:
    """One tensor of a safetensors file, read only when asked (load): its shape and dtype come from
    the header, so a whole directory is checked before a byte of weights is read, and the model is
    filled one tensor at a time. Each read opens the file anew, so no mapping of the whole file stays
    resident beside the model: importing a model takes about its own size in memory."""

    def __init__(self, path: Path, name: str, view):
        self.path, self.name = path, name
        self.shape = torch.Size(view.get_shape())
        self.dtype = DTYPES.get(view.get_dtype(), torch.uint8)  # an unknown dtype: shapes and sizes still check

    def numel(self) -> int:
        return self.shape.numel()

    def element_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def load(self) -> torch.Tensor:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(self.path), framework="pt") as f:
                return f.get_tensor(self.name)
        except (SafetensorError, OSError) as e:
            raise MinitfError(f"{self.path} is unreadable at {self.name} ({first_line(e, 120)})") from None


def loaded(t) -> torch.Tensor:
    """A state dict's value as a tensor of its own: a FileTensor read now; a transformers model's
    tensor copied, so the imported model never shares storage with the one it came from."""
    return t.load() if isinstance(t, FileTensor) else t.detach().clone()


def _check_inside(where: Path, name: str, index: Path) -> None:
    """A shard the index names is a file inside the model directory (a hub snapshot: inside its
    repository's folder of the cache, hub.containing_folder): an index is downloaded, and `../x` or
    `/etc/x` would read from anywhere. Checked before the file is opened, and the error says
    nothing of what lies outside."""
    shard = Path(name)
    if shard.is_absolute() or ".." in shard.parts:
        escape = "an absolute path" if shard.is_absolute() else "a path leading out of the directory"
    elif not (where / shard).resolve().is_relative_to(containing_folder(where).resolve()):
        escape = "a link leading out of the directory"
    else:
        return
    raise MinitfError(
        f"{index}: weight_map entry {name[:120]!r} is {escape}; shards must be files inside {where}: "
        f"fetch the model again (a download's --local-dir holds real files)"
    )


def _bounded(path: Path, limit: int, what: str) -> None:
    """A file of a download that is read whole: a regular file (a FIFO or /dev/zero would never end)
    of at most `limit` bytes, or one line naming it."""
    if not path.is_file():
        raise MinitfError(f"{path} is not a regular file; is it {what}? Fetch the model again")
    size = path.stat().st_size
    if size > limit:
        raise MinitfError(
            f"{path} is {size / 1e6:,.0f} MB, more than {what} holds (at most {limit / 1e6:,.0f} MB are read); "
            f"fetch the model again"
        )


def _json(path: Path, what: str):
    _bounded(path, MAX_JSON_BYTES, what)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MinitfError(f"{path} is not valid JSON ({first_line(e, 80)}); is it {what}?") from None


def read_tokenizer(where: Path) -> Tokenizer:
    """The directory's tokenizer.json, or GPT-2's classic vocab.json + merges.txt (what
    GPT2Tokenizer.save_pretrained writes), read as the byte-level BPE they describe."""
    if (where / "tokenizer.json").is_file():
        tokenizer = _downloaded_tokenizer(where / "tokenizer.json")
        tokenizer.chat_template = _chat_template(where)
        return tokenizer
    if (where / "vocab.json").is_file() and (where / "merges.txt").is_file():
        from tokenizers import Tokenizer as HFTokenizer

        for name in ("vocab.json", "merges.txt"):
            _bounded(where / name, MAX_TOKENIZER_BYTES, "a tokenizer")
        from tokenizers import decoders, models, pre_tokenizers

        backend = HFTokenizer(models.BPE.from_file(str(where / "vocab.json"), str(where / "merges.txt")))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        if backend.token_to_id(EOT) is not None:
            backend.add_special_tokens([EOT])  # so a literal <|endoftext|> in text is the separator, as in GPT-2
        return Tokenizer(backend)
    raise MinitfError(
        f"{where} holds no tokenizer (tokenizer.json, or vocab.json and merges.txt); "
        f"save the model's tokenizer into it with save_pretrained"
    )


def _chat_template(where: Path):
    """The directory's chat template (tokenizer_config.json's, or chat_template.jinja), read bounded."""
    config = where / "tokenizer_config.json"
    parsed = _json(config, "a tokenizer config") if config.is_file() else {}
    if (where / TEMPLATE_FILE).is_file():
        _bounded(where / TEMPLATE_FILE, MAX_JSON_BYTES, "a chat template")
    return load_template(where, parsed if isinstance(parsed, dict) else {})


def _downloaded_tokenizer(path: Path) -> Tokenizer:
    """A model directory's tokenizer.json. It came with the model, so a broken one is the
    download's fault: the fix is fetching it again, not training a tokenizer of one's own."""
    from tokenizers import Tokenizer as HFTokenizer

    _bounded(path, MAX_TOKENIZER_BYTES, "a tokenizer")
    try:
        backend = HFTokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as e:  # tokenizers raises plain Exception for malformed JSON
        raise MinitfError(
            f"{path} is broken ({first_line(e, 120)}): the downloaded model's tokenizer cannot be read; "
            f"fetch the model again"
        ) from None
    if not any(backend.token_to_id(t) is not None for t in SEPARATORS):
        raise MinitfError(
            f"{path} has no end-of-text token ({', '.join(SEPARATORS)}), minitf's document separator; "
            f"fine-tune from a model whose tokenizer has one"
        )
    return Tokenizer(backend)
