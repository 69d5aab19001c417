"""What the scripts share: user mistakes become one line on stderr and a non-zero exit code."""
from __future__ import annotations

import sys
from pathlib import Path

from .config import MinitfError


def run_main(main) -> None:
    """Run main(); a MinitfError prints 'error: ...' and exits 2, Ctrl-C exits 130. No tracebacks."""
    try:
        main()
    except MinitfError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(0)


def newest_run(root: str | Path = "runs") -> Path:
    """The run directory under `root` whose weights were written last."""
    runs = sorted(Path(root).glob("*/model.safetensors"), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise MinitfError(f"no trained run under {root}/; train one with python scripts/train.py, "
                          f"or pass --run DIR")
    return runs[-1].parent
