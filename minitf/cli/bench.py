"""`minitf bench`: the measurements of training, generation, data, memory and the servers, against
nanoGPT and llama.cpp. They live in the repository's bench/ folder, not in the installed package,
so they run from a clone (`pip install -e .`, then `minitf bench` or `python scripts/bench.py`)."""

import importlib
import sys
from pathlib import Path

from ..errors import MinitfError


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    clone = Path(__file__).resolve().parents[2]  # minitf/cli/bench.py -> the clone's top, in an editable install
    if not (clone / "bench" / "cli.py").is_file():
        raise MinitfError(
            "minitf bench runs from a clone of the repository: its measurements (bench/) are not part of "
            "the installed package; clone it, pip install -e . there, and run minitf bench or python scripts/bench.py"
        )
    if str(clone) not in sys.path:
        sys.path.insert(0, str(clone))
    importlib.import_module("bench.cli").main(argv, prog)
