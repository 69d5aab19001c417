"""File writes that a kill or a full disk cannot leave half done.

Everything minitf writes (weights, training state, configs, token caches, pictures) goes through
`atomic_write`: the bytes go to a temporary name in the same directory, then `os.replace` moves
them over the target in one step, so a reader sees the old file or the new one, never a mix.
"""
from __future__ import annotations

import os
from pathlib import Path

from .config import MinitfError


def atomic_write(path: str | Path, write) -> None:
    """Call write(tmp_path), then move tmp_path over path. A failure leaves path untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MinitfError(f"could not write {path}: {e.strerror or e}; "
                          f"the previous checkpoint there is intact") from None
