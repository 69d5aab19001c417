"""The named recipes: configs/*.yaml, loaded by name (load_config("tiny"), --config tiny)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import ConfigError

RECIPE_SUFFIX = ".yaml"


def recipes_dir() -> Path:
    """Where the named recipes are: inside the installed package (minitf/configs, mapped from the
    repository's configs/ at build time), or the clone's configs/ when minitf runs from a source tree."""
    shipped = Path(str(resources.files("minitf") / "configs"))
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "configs"


def recipes() -> list[str]:
    """The names of the recipes that load by name (load_config("tiny"), --config tiny)."""
    return sorted(p.name[: -len(RECIPE_SUFFIX)] for p in recipes_dir().glob(f"*{RECIPE_SUFFIX}"))


def recipe_path(name_or_path: str | Path) -> Path:
    """A recipe's file: an existing path as given, else a recipe name (with or without .yaml). A
    bare name that is a recipe's is the recipe even where a directory of that name is here (runs of
    a recipe are often named after it: `--config chat` beside a folder `chat`)."""
    path = Path(name_or_path)
    name = path.name[: -len(RECIPE_SUFFIX)] if path.name.endswith(RECIPE_SUFFIX) else path.name
    known = recipes()
    if len(path.parts) != 1 or (path.exists() and not (path.is_dir() and name in known)):
        return path  # a path with a directory in it is always a path; so is a file here
    if name not in known:
        raise ConfigError(
            f"no config file or recipe named {str(name_or_path)!r}; the recipes are {', '.join(known)}, "
            "or pass a YAML file's path"
        )
    return recipes_dir() / f"{name}{RECIPE_SUFFIX}"
