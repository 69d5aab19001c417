"""The `minitf` command, one module per sub-command.

Each sub-command is a module here with `main(argv, prog)`; scripts/<name>.py and `python -m minitf`
are thin fronts to the same functions. A command's module is imported only when it runs, so
`minitf --help` and a mistyped command answer at once.

The commands: `train`, `generate`, `chat`, `evaluate`, `explore`, `attention`, `plot`, `heads`,
`export`, `export_gguf`, `serve`, `bench` and `speedrun`; beside them `common` (what the commands
share: a run to load, --device, the one-line errors), `start` (Ctrl-C while the command starts) and
`terminal` (a model's control characters shown escaped on a terminal).
"""

from __future__ import annotations

import difflib
import importlib
import sys

# name -> (module in minitf.cli, one line for `minitf --help`)
COMMANDS = {
    "train": ("train", "train a model and write a run directory (--config tiny: seconds on a CPU)"),
    "generate": ("generate", "sample text from a trained run, with a KV cache"),
    "chat": ("chat", "talk to a chat run: a multi-turn prompt whose answers stream"),
    "evaluate": ("evaluate", "loss, perplexity and bits per byte of a run on any text"),
    "explore": ("explore", "a local web page to watch tokens stream and open their attention"),
    "attention": ("attention", "draw or print a run's attention weights on a text"),
    "plot": ("plot", "draw loss curves from runs' metrics"),
    "heads": ("heads", "watch a run's induction heads form over training, from its snapshots"),
    "export": (
        "export",
        "write a run as a Hugging Face directory: GPT-2, GPT-NeoX, Llama or Qwen3 (needs the hf extra)",
    ),
    "export-gguf": ("export_gguf", "write a run as one GGUF file for llama.cpp and Ollama (needs the gguf extra)"),
    "serve": ("serve", "an OpenAI-compatible server for a trained run (/v1/completions, /v1/chat/completions)"),
    "bench": ("bench", "measure training, generation, data and memory speed on this machine"),
    "speedrun": ("speedrun", "compare recipes at equal wall time, in turns"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items())
    return (
        "usage: minitf <command> [options]   (minitf <command> --help for its options)\n\n"
        f"commands:\n{rows}\n\n"
        "e.g. minitf train --config tiny data.source=file:my.txt, then minitf generate"
    )


def main(argv: list[str] | None = None) -> None:
    """Run `minitf <command> ...`: errors as one line and exit code 2, as every script does."""
    from .common import run_main

    argv = sys.argv[1:] if argv is None else list(argv)
    run_main(lambda: _dispatch(argv))


def _dispatch(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    if argv[0] == "--version":
        from .. import __version__

        print(f"minitf {__version__}")
        return
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"error: unknown command {name!r}{hint}; the commands are {', '.join(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    command = importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")
    command.main(rest, prog=f"minitf {name}")
