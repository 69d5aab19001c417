"""A chat template read from a directory: a run's, transformers' own save, or a download's.

A run directory (and transformers' save_pretrained) keeps the template as chat_template.jinja and
the special tokens it names (bos_token, eos_token) in tokenizer_config.json; a downloaded model may
keep the template inside tokenizer_config.json instead. Both files come from a download, so each is
read bounded (a FIFO or a huge file is one line, never a hang).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..chat_template import MAX_TEMPLATE_BYTES, TEMPLATE_FILE, TOKENS_FILE, ChatTemplate
from ..errors import MinitfError
from ..system.files import read_at_most


def load_template(directory: Path, config: dict | None = None) -> ChatTemplate | None:
    """The chat template kept in a directory: a run's (or transformers' own) chat_template.jinja, else
    tokenizer_config.json's chat_template (its "default" when it lists several); None if neither.
    The special tokens it names come from tokenizer_config.json. `config` is that file parsed, when
    the caller has read it (bounded) already; else it is read here."""
    directory = Path(directory)
    config = _read_tokens(directory / TOKENS_FILE) if config is None else config
    source, origin = None, directory / "tokenizer_config.json"
    if (directory / TEMPLATE_FILE).exists() or (directory / TEMPLATE_FILE).is_symlink():
        source, origin = _read_template(directory / TEMPLATE_FILE), directory / TEMPLATE_FILE
    elif isinstance(config.get("chat_template"), str):
        source = config["chat_template"]
    elif isinstance(config.get("chat_template"), list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in config["chat_template"] if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        return None
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[key] = value
    return ChatTemplate(source, special, str(origin))


def _read_tokens(path: Path) -> dict:
    """A run's tokenizer_config.json (the special tokens of its template), {} where there is none."""
    if not path.is_file():
        return {}
    text = _read_template(path)
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise MinitfError(f"{path} is not JSON ({e}); restore the run's own tokenizer_config.json") from None
    return parsed if isinstance(parsed, dict) else {}


def _read_template(path: Path) -> str:
    """A chat_template.jinja's text: a regular file (a FIFO would never end) of UTF-8, or one line."""
    if not path.is_file():
        raise MinitfError(
            f"{path} is not a regular file (a FIFO, a device, a folder or a broken link); put the "
            f"model's chat template there as text, or remove it"
        )
    try:
        raw = read_at_most(path, MAX_TEMPLATE_BYTES)
    except OSError as e:
        raise MinitfError(f"cannot read {path} ({e.strerror or e}); fix its permissions") from None
    if raw is None:
        raise MinitfError(f"{path} is over {MAX_TEMPLATE_BYTES >> 20} MiB, not a chat template; fetch the model again")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MinitfError(f"{path} is not UTF-8 text (byte {e.start:,}); save the chat template as UTF-8") from None
