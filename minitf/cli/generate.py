r"""Sample text from a trained run (the newest under runs/ unless --run is given).

minitf generate
minitf generate --run runs/shakespeare --prompt $'Juliet.\n' --max-new-tokens 200 --stream
minitf generate --temperature 0 --num-samples 1        # greedy
echo "To be" | minitf generate --interactive           # one prompt per input line
minitf generate --prompt-file scene.txt                # a long, multi-line prompt

On a terminal, control characters in the text are shown escaped (\x1b; cli/terminal.py); piped, exact.
"""

import argparse
import sys
import time

from minitf.cli.common import (
    add_device_argument,
    add_dtype_argument,
    dtype_words,
    newest_run,
    read_prompt,
    stdin_prompts,
)
from minitf.cli.terminal import for_stdout
from minitf.errors import ConfigError
from minitf.export.hf import describe_weights, load_model
from minitf.generate import check_num_samples, generate, sample_settings, stream
from minitf.generation.args import SETTINGS, check_prompt_text


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = _parser(prog).parse_args(argv)
    if args.num_samples < 1:  # checked before loading anything, so the error is the only line
        raise ConfigError(f"--num-samples must be at least 1, got {args.num_samples}")
    prompt = read_prompt(args.prompt_file) if args.prompt_file else args.prompt
    if prompt is not None:
        check_prompt_text(prompt)
    run = args.run or newest_run()
    model, tok, cfg = load_model(run, best=args.best, device=args.device, dtype=args.dtype)
    check_num_samples(model, args.num_samples, "--num-samples")  # named as typed here, before any sampling
    # the run's own sampling settings, with those given here on top
    settings = sample_settings(cfg.sample, **{n: getattr(args, n) for n in SETTINGS if getattr(args, n) is not None})
    weights = describe_weights(run, args.best, "samples") + dtype_words(args.dtype)
    print(f"[sampling from {run}: {weights}]", file=sys.stderr)
    prompt = settings.prompt if prompt is None else prompt
    typed = args.interactive and sys.stdin.isatty()  # the terminal shows the prompt already: no echo
    for text in stdin_prompts() if args.interactive else [prompt]:
        _sample(model, tok, text, settings, args, echo="" if typed else text)


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="run directory (default: the newest under runs/)")
    p.add_argument("--best", action="store_true", help="use best.safetensors (lowest val loss)")
    p.add_argument("--prompt", help="text to continue (default: the run's sample.prompt; '' = new document)")
    p.add_argument("--prompt-file", help="read the prompt from this UTF-8 file (several lines are fine)")
    run_default = "default: the run's sample.%s (config.yaml)"
    p.add_argument("--max-new-tokens", type=int, help=run_default % "max_new_tokens")
    p.add_argument("--temperature", type=float, help="0 = greedy; " + run_default % "temperature")
    p.add_argument("--top-k", type=int, help="sample among the k likeliest, 0 = all; " + run_default % "top_k")
    p.add_argument("--top-p", type=float, help="nucleus: the smallest set reaching p; " + run_default % "top_p")
    p.add_argument("--repetition-penalty", type=float, help="1 = off; " + run_default % "repetition_penalty")
    p.add_argument("--stop", action="append", help="stop when the text contains this (repeatable)")
    p.add_argument("--seed", type=int, help="a seed makes the text repeatable; " + run_default % "seed")
    p.add_argument("--num-samples", type=int, default=1, help="samples from one prompt (default: 1)")
    p.add_argument("--stream", action="store_true", help="print text as it is generated")
    p.add_argument("--interactive", action="store_true", help="read prompts, one per line, until end of input")
    add_device_argument(p)
    add_dtype_argument(p)
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step: seconds to compile, then faster tokens (long outputs)",
    )
    p.add_argument("--verbose", action="store_true", help="print tokens/s to stderr")
    return p


def _sample(model, tok, prompt: str, settings, args: argparse.Namespace, echo: str) -> None:
    """Print the samples for one prompt, each after `echo` (the prompt, unless the terminal shows it)."""
    t0, info = time.time(), {}
    opts = dict(stop=args.stop, compile=args.compile)
    if args.stream and args.num_samples == 1:  # one sample can be printed piece by piece
        print(for_stdout(echo), end="", flush=True)
        text = ""
        for piece in stream(model, tok, prompt, settings, info=info, **opts):
            print(for_stdout(piece), end="", flush=True)  # ESC and its kind shown, on a terminal
            text += piece
        print()
    else:
        texts = generate(model, tok, prompt, settings, num_samples=args.num_samples, info=info, **opts)
        texts = [texts] if args.num_samples == 1 else texts
        for i, text in enumerate(texts):
            if args.num_samples > 1:
                print(f"---------- sample {i + 1} ----------")
            print(for_stdout(echo + text))
    if args.verbose:
        n = sum(info["tokens"])  # as sampled (re-encoding the text can merge or split tokens)
        print(f"[{n} tokens in {time.time() - t0:.2f}s: {n / (time.time() - t0):.1f} tokens/s]", file=sys.stderr)
