"""A Hugging Face hub id (`Qwen/Qwen3-0.6B`) as a local directory, through huggingface_hub itself:
its cache, HF_HUB_OFFLINE, HF_TOKEN and HF_ENDPOINT mean what they mean for transformers.

Only what minitf reads is fetched (config.json, the safetensors files and their index, the
tokenizer and its chat template), never a pickle. What is fetched is read as any downloaded
directory is (minitf.export.hf_files): bounded, and never followed outside its repository's folder
of the cache, where a snapshot's files are links into the folder's blobs/.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import MinitfError, first_line

# the files of a model repository minitf reads: the rest (pickles, ONNX, GGUF, images) are never fetched
FETCHED = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*"]
# owner/name as the hub spells them (letters, digits, - _ .), at most 96 characters each
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def is_hub_id(name: str) -> bool:
    """Whether `name` is a hub id rather than a local path: owner/name, and nothing there on disk."""
    return bool(REPO_ID.fullmatch(name)) and not Path(name).exists() and ".." not in name


def local_dir(name: str, key: str = "run.init_from") -> Path:
    """The local directory for `name`: a path as it is, or a hub id's snapshot in the Hugging Face
    cache, fetched there first when the hub can be reached. key: what the user set, for messages."""
    if not is_hub_id(name):
        return Path(name).expanduser()
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise MinitfError(
            f"{key}={name} is not a directory here; to fetch it from the Hugging Face hub, install huggingface_hub "
            f"(pip install -e '.[hf]'), or pass a local directory"
        ) from None
    try:
        return Path(snapshot_download(name, allow_patterns=FETCHED))
    except LocalEntryNotFoundError:  # offline (HF_HUB_OFFLINE, or no network) and not in the cache
        raise MinitfError(
            f"{key}={name}: the Hugging Face hub cannot be reached and {name} is not in its cache; fetch it "
            f"where there is a network (hf download {name}) or pass a local directory"
        ) from None
    except GatedRepoError:  # before RepositoryNotFoundError: it is one
        raise MinitfError(
            f"{key}={name} is gated on the hub: accept its terms on huggingface.co, then log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise MinitfError(
            f"{key}={name} is no model repository on the hub (or a private one: log in with hf auth login)"
        ) from None
    except Exception as e:  # the hub's HTTP errors, a full disk: one line, the cause named
        raise MinitfError(f"{key}={name} could not be fetched from the hub ({first_line(e, 160)})") from None


def containing_folder(where: Path) -> Path:
    """The folder a directory's files must stay inside: the directory itself, or, for a snapshot of
    the hub's cache (models--owner--name/snapshots/<commit>), the repository's folder, whose blobs/
    its files are links to."""
    if where.parent.name == "snapshots" and where.parent.parent.name.startswith("models--"):
        return where.parent.parent
    return where
