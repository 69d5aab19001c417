r"""Talk to a chat run (one fine-tuned with `minitf train --config chat`): a multi-turn prompt
whose answers print as they are generated. The newest run under runs/ unless --run is given.

minitf chat --run runs/chat
minitf chat --run runs/chat --system "Answer with the number only." --temperature 0
printf 'What is 2 plus 3?\nAnd 4 plus 4?\n' | minitf chat --run runs/chat --seed 0   # one message per line

At the prompt: /reset starts a new conversation (the system prompt kept), /help lists these,
/quit (or Ctrl-D) ends. Ctrl-C during an answer stops it (that question and its half answer are
left out of the conversation); Ctrl-C at the prompt ends. Sampling settings default to the run's
sample.* (config.yaml), as for minitf generate; with --seed, each answer is minitf.chat's for it.
On a terminal, control characters an answer holds are shown escaped (\x1b; cli/terminal.py).
"""

from __future__ import annotations

import argparse
import sys

from minitf.cli.common import add_device_argument, add_dtype_argument, dtype_words, newest_run, stdin_prompts
from minitf.cli.terminal import for_stdout
from minitf.conversations.answer import chat_stream
from minitf.errors import ConfigError, MinitfError
from minitf.export.hf import describe_weights, load_model
from minitf.generate import sample_settings
from minitf.generation.args import SETTINGS, check_prompt_text

COMMANDS = "/reset: a new conversation (the system prompt kept); /help: this line; /quit or Ctrl-D: end"


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = _parser(prog).parse_args(argv)
    if args.system is not None:
        check_prompt_text(args.system)
        if not args.system.strip():
            raise ConfigError("--system is empty; give the system prompt's text, or leave --system out")
    run = args.run or newest_run()
    model, tok, cfg = load_model(run, best=args.best, device=args.device, dtype=args.dtype)
    if getattr(tok, "chat_template", None) is None:
        raise MinitfError(
            f"{run} is not a chat model (it has no chat template); fine-tune it on conversations with "
            f"minitf train --config chat run.init_from={run}, then chat with that run"
        )
    # the run's own sampling settings, with those given here on top
    settings = sample_settings(cfg.sample, **{n: getattr(args, n) for n in SETTINGS if getattr(args, n) is not None})
    weights = describe_weights(run, args.best, "uses") + dtype_words(args.dtype)
    print(f"[chatting with {run}: {weights}; {COMMANDS}]", file=sys.stderr)
    start = [{"role": "system", "content": args.system}] if args.system else []
    if _converse(model, tok, settings, start, args.stop):  # turns that failed were said as they failed
        sys.exit(1)


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a chat run's directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--system", help="a system prompt that starts every conversation")
    for name, (kind, _) in SETTINGS.items():  # the settings minitf generate takes, under the same names
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"default: the run's sample.{name} (config.yaml)")
    p.add_argument("--stop", action="append", help="end an answer when it contains this (repeatable)")
    add_device_argument(p)
    add_dtype_argument(p)
    return p


def _converse(model, tok, settings, start: list[dict], stop) -> int:
    """Read messages until /quit, end of input or Ctrl-C at the prompt; answer each in turn. Returns
    how many turns failed (said in one line each, and left out of the conversation)."""
    messages, lines, failed = list(start), stdin_prompts(), 0
    piped = not sys.stdin.isatty()  # no one typed the questions: each is shown before its answer
    while True:
        try:
            line = next(lines)
        except (StopIteration, KeyboardInterrupt):  # Ctrl-C at the prompt ends the chat, as Ctrl-D does
            return failed
        command = line.strip()
        if command in ("/quit", "/exit"):
            return failed
        if command in ("/reset", "/help") or not command:
            messages = list(start) if command == "/reset" else messages
            print({"/reset": "[a new conversation]", "/help": COMMANDS}.get(command, ""), file=sys.stderr)
            continue
        if piped:  # on stderr, as the typed prompt is: stdout stays the answers alone, for a pipe to read
            print(f"> {line}", file=sys.stderr, flush=True)
        try:
            answer = _answer(model, tok, [*messages, {"role": "user", "content": line}], settings, stop)
        except MinitfError as e:  # e.g. longer than block_size, or the template refused it or ran past a bound
            print(f"error: {e} (/reset starts a new conversation)", file=sys.stderr)
            failed, answer = failed + 1, None
        if answer is not None and not answer.strip():  # a conversation's turns have text (conversations/rules.py)
            print("[an empty answer: that turn is left out of the conversation]", file=sys.stderr)
        elif answer is not None:
            messages += [{"role": "user", "content": line}, {"role": "assistant", "content": answer}]


def _answer(model, tok, messages: list[dict], settings, stop) -> str | None:
    """Print the answer as it streams and return it; None when Ctrl-C stopped it. A conversation
    that cannot be answered (a MinitfError: too long, refused by the template) is raised, any half
    answer's line ended first."""
    text, pieces = "", None
    try:
        pieces = chat_stream(model, tok, messages, settings, stop=stop)
        for piece in pieces:
            print(for_stdout(piece), end="", flush=True)  # ESC and its kind shown, on a terminal
            text += piece
        print(flush=True)
        return text
    except KeyboardInterrupt:
        print(flush=True)  # the half answer's line ended
        print("[answer stopped]", file=sys.stderr)
    except MinitfError:
        if text:
            print(flush=True)
        raise
    finally:
        if pieces is not None:
            pieces.close()  # the model back in its mode, the KV cache freed
    return None
