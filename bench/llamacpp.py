"""Batch-1 decoding, minitf against llama.cpp on the same model: `bench.py --only generate` adds
these rows when llama-cpp-python and gguf are installed (pip install -e '.[gguf,llamacpp]').

The model is the recipe's shape with random weights (speed does not depend on their values),
written to a temporary GGUF file in f32, f16 and q8_0. Every variant decodes the same number of
tokens from one prompt token, sampling top-k 50 at temperature 1, and they take turns round
after round, so a machine that drifts moves them all; each ratio is the median of the per-round
ratios. llama.cpp gets as many threads as torch uses.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from minitf.config import Config, SampleConfig
from minitf.export.architecture import format_or_none
from minitf.generate import generate_tokens
from minitf.model import Transformer
from minitf.tokenizer import EOT, MIN_VOCAB, Tokenizer

INSTALL = "pip install -e '.[gguf,llamacpp]'"


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE of exactly vocab_size tokens (the 256 bytes, <|endoftext|>, and merges of
    byte pairs, then of longer tokens and a byte), so the GGUF file has the model's vocabulary
    without training on a corpus."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {EOT: 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    merges, made = [], list(alphabet)  # every pair of bytes first, then longer tokens: Qwen3's 151,936
    for left in made:
        if len(vocab) >= vocab_size:
            break
        for b in alphabet:
            if len(vocab) >= vocab_size:
                break
            if left + b not in vocab:
                vocab[left + b] = len(vocab)
                merges.append((left, b))
                made.append(left + b)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([EOT])
    return Tokenizer(backend)


@torch.no_grad()
def llamacpp_decode(
    cfg: Config, device: torch.device, new_tokens: int, rounds: int, log=print, compile: bool = True
) -> dict | None:
    """Tokens/s of minitf eager (float32), in bfloat16 (--dtype), compiled in both (unless compile=False), llama.cpp
    f32, f16 and q8_0 at batch 1, in turns; None (with the reason logged) where llama.cpp cannot run this model."""
    reason = _why_not(cfg, device)
    if reason:
        log(f"generate  llama.cpp rows skipped: {reason}")
        return None
    import llama_cpp

    fmt = format_or_none(cfg.model)
    # the context holds the prompt token and every new one: llama.cpp's and minitf's windows alike
    n = min(new_tokens, cfg.model.block_size - 1)
    torch.manual_seed(0)
    model = Transformer(cfg.model).eval()
    half = copy.deepcopy(model).to(torch.bfloat16)  # minitf generate --dtype bfloat16
    threads = torch.get_num_threads()
    settings = SampleConfig(max_new_tokens=n, temperature=1.0, top_k=50, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        llms = _llamas(model, synthetic_tokenizer(cfg.model.vocab_size), Path(tmp), cfg.model.block_size, threads)
        variants = {
            "minitf eager": lambda: _minitf_decode(model, settings, compile=False),
            "minitf bfloat16": lambda: _minitf_decode(half, settings, compile=False),
            **({"minitf compiled": lambda: _minitf_decode(model, settings, compile=True)} if compile else {}),
            **({"minitf bfloat16 compiled": lambda: _minitf_decode(half, settings, compile=True)} if compile else {}),
            "llama.cpp f32": lambda: _llama_decode(llms["f32"], n),
            "llama.cpp f16": lambda: _llama_decode(llms["f16"], n),
            "llama.cpp q8_0": lambda: _llama_decode(llms["q8_0"], n),
        }
        rates, first_compile_s = _in_turns(variants, rounds)
        for llm in llms.values():
            llm.close()
    out = {
        "format": fmt,
        "new_tokens": n,
        "threads": threads,
        "llama_cpp_python": llama_cpp.__version__,
        "compile_first_call_s": first_compile_s,
        "rows": {},
    }
    # each variant against minitf eager, as the median of per-round ratios: the machine drifts between rounds
    base = rates["minitf eager"]
    for name, r in rates.items():
        ratios = sorted(a / b for a, b in zip(r, base))
        out["rows"][name] = {"tokens_per_s": statistics.median(r), "rates": r, "vs_eager": statistics.median(ratios)}
        log(
            f"generate  {statistics.median(r):>10,.1f} tokens/s  batch 1, {name} ({fmt}, {n} new tokens, "
            f"{threads} threads), median of {r}; {statistics.median(ratios):.2f}x minitf eager"
        )
    return out


def _why_not(cfg: Config, device: torch.device) -> str | None:
    """Why llama.cpp cannot decode this model here, or None: the rows are skipped with a reason,
    never an error, since the rest of the generate part measures without them."""
    try:
        import llama_cpp  # noqa: F401

        from minitf.export.gguf import write_gguf  # noqa: F401
    except ImportError:
        return f"llama-cpp-python is not installed ({INSTALL})"
    if device.type != "cpu":
        return "they compare CPU decoding (--device cpu)"
    if format_or_none(cfg.model) is None:
        return "no GGUF architecture computes this model (see minitf.export.architecture)"
    if cfg.model.vocab_size < MIN_VOCAB:  # a byte-level tokenizer has at least the 256 bytes and <|endoftext|>
        return f"a GGUF tokenizer needs a vocabulary of at least {MIN_VOCAB}"
    return None


def _llamas(model: Transformer, tokenizer: Tokenizer, tmp: Path, n_ctx: int, threads: int) -> dict:
    """The model written as GGUF in f32, f16 and q8_0, each loaded by llama.cpp with torch's thread count."""
    import llama_cpp

    from minitf.export.gguf import write_gguf

    llms = {}
    for dtype in ("f32", "f16", "q8_0"):
        path = tmp / f"model-{dtype}.gguf"
        write_gguf(model, tokenizer, path, dtype)
        llms[dtype] = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    return llms


def _minitf_decode(model: Transformer, settings: SampleConfig, compile: bool) -> int:
    """Tokens decoded by minitf from one prompt token."""
    return sum(1 for _ in generate_tokens(model, [1], settings, compile=compile))


def _llama_decode(llm, n: int) -> int:
    """Tokens decoded by llama.cpp from one prompt token, with the same sampling, stopped after n."""
    llm.reset()
    count = 0
    for _ in llm.generate([1], top_k=50, top_p=1.0, min_p=0.0, temp=1.0):
        count += 1
        if count == n:
            break
    return count


def _in_turns(variants: dict, rounds: int) -> tuple[dict, float | None]:
    """Each variant's tokens/s per round, the variants taking turns so a drifting machine moves them
    all alike; and the compiled variant's first call in seconds (its warm-up, mostly compiling)."""
    rates = {name: [] for name in variants}
    first_compile_s = None
    for name, decode in variants.items():  # warm-up; the compiled one compiles here
        t0 = time.perf_counter()
        decode()
        if name == "minitf compiled":
            first_compile_s = round(time.perf_counter() - t0, 1)
    for _ in range(rounds):
        for name, decode in variants.items():
            t0 = time.perf_counter()
            count = decode()
            rates[name].append(round(count / (time.perf_counter() - t0), 1))
    return rates, first_compile_s
