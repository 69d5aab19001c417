"""Where a run directory may be: a path the file system can name with the run's files inside it,
and not the current directory or a repository's root (RunConfig.validate asks, before any work)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ConfigError, shown

# room left under the path limit for the names a run writes inside its directory (the longest:
# a temporary file beside state.pt, a sharded checkpoint's files)
RUN_FILE_ROOM = 64


def check_run_dir_path(out_dir: Path, named: str) -> None:
    """run.out_dir (named: the key that gave it), refused in one line where a run could not or
    should not be written: past the file system's name limits, or the current directory or a
    repository's root."""
    _check_path_length(out_dir, named)
    _check_not_project_dir(out_dir)


def _check_path_length(out_dir: Path, named: str) -> None:
    """A run directory the file system cannot name (ENAMETOOLONG) is refused here, before any
    work: a name in the path longer than the file system allows (255 bytes on most), or a path
    so long that the run's own files would pass the path limit (4096 bytes on Linux)."""
    full = Path(os.path.abspath(out_dir.expanduser()))
    name_max, path_max = _name_limits(full)
    for part in full.parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(
                f"{named} gives the run directory a name of {len(os.fsencode(part)):,} bytes ({shown(part, 40)}), "
                f"longer than the {name_max} this file system allows; choose a shorter {named}"
            )
    if len(os.fsencode(str(full))) + RUN_FILE_ROOM > path_max:
        raise ConfigError(
            f"{named} makes the run directory's path {len(os.fsencode(str(full))):,} bytes long; with the "
            f"run's file names it would pass this system's path limit of {path_max}: choose a shorter {named}"
        )


def _name_limits(path: Path) -> tuple[int, int]:
    """(longest name, longest path) in bytes on the file system that would hold path, asked of its
    nearest existing directory (POSIX pathconf); 255 and 4096 where the system cannot say."""
    if hasattr(os, "pathconf"):  # not on Windows
        for there in (path, *path.parents):
            try:
                if there.is_dir():
                    return os.pathconf(there, "PC_NAME_MAX"), os.pathconf(there, "PC_PATH_MAX")
            except (OSError, ValueError):  # a name too long to look up, or no answer: try the parent
                continue
    return 255, 4096


def _check_not_project_dir(out_dir: Path) -> None:
    """The run directory cannot be the current directory or a repository's root: a run's files
    (config.yaml, model.safetensors, ...) would be written among the user's own."""
    try:
        here, where = Path.cwd().resolve(), out_dir.expanduser().resolve()
    except (OSError, RuntimeError):
        return  # an unreadable path: the write itself will say so
    pyproject = where / "pyproject.toml"
    repo = (where / ".git").exists() or (
        pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"minitf"', pyproject.read_text(errors="replace"))
    )
    if where == here or repo:
        raise ConfigError(
            f"run.out_dir {str(out_dir)!r} is {'the current directory' if where == here else 'a repository root'}; "
            f"runs write config.yaml and weights there: choose a directory of its own, e.g. run.out_dir=runs/mine"
        )
