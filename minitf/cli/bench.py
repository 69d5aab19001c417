"""`minitf bench`: the measurements of training, generation, data, memory and the servers, against
nanoGPT and llama.cpp. They live in the repository's bench/ folder, not in the installed package,
so they run from a clone (`pip install -e .`, then `minitf bench` or `python scripts/bench.py`)."""

import importlib
import sys
from pathlib import Path

from ..errors import MinitfError

CLONE = Path(__file__).resolve().parents[2]  # minitf/cli/bench.py -> the clone's top, in an editable install


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    if not (CLONE / "bench" / "cli.py").is_file():
        raise MinitfError(
            "minitf bench runs from a clone of the repository: its measurements (bench/) are not part of "
            "the installed package; clone it, pip install -e . there, and run minitf bench or python scripts/bench.py"
        )
    # the clone goes first on the path, even where it is there already: `python scripts/bench.py` puts
    # scripts/ first, and its bench.py would otherwise be imported as the bench package
    if str(CLONE) in sys.path:
        sys.path.remove(str(CLONE))
    sys.path.insert(0, str(CLONE))
    importlib.import_module("bench.cli").main(argv, prog)
