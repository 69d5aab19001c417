"""Batch-1 decoding, minitf against llama.cpp on the same model: `bench.py --only generate` adds
these rows when llama-cpp-python and gguf are installed (pip install -e '.[gguf,llamacpp]').

The model is the recipe's shape with random weights (speed does not depend on their values),
written to a temporary GGUF file in f32 and in q8_0. Every variant decodes the same number of
tokens from one prompt token, sampling top-k 50 at temperature 1, and they take turns round
after round, so a machine that drifts moves them all; each ratio is the median of the per-round
ratios. llama.cpp gets as many threads as torch uses.
"""

from __future__ import annotations

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
    byte pairs), so the GGUF file has the model's vocabulary without training on a corpus."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {EOT: 0, **{c: i + 1 for i, c in enumerate(alphabet)}}
    merges = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([EOT])
    return Tokenizer(backend)


@torch.no_grad()
def llamacpp_decode(
    cfg: Config, device: torch.device, new_tokens: int, rounds: int, log=print, compile: bool = True
) -> dict | None:
    """Tokens/s of minitf eager, minitf compiled (unless compile=False), llama.cpp f32 and q8_0 at
    batch 1, in turns; None (with the reason logged) where llama.cpp cannot run this model."""
    try:
        import llama_cpp

        from minitf.export.gguf import write_gguf
    except ImportError:
        log(f"generate  llama.cpp rows skipped: llama-cpp-python is not installed ({INSTALL})")
        return None
    if device.type != "cpu":
        log("generate  llama.cpp rows skipped: they compare CPU decoding (--device cpu)")
        return None
    fmt = format_or_none(cfg.model)
    if fmt is None:
        log(
            "generate  llama.cpp rows skipped: no GGUF architecture computes this model "
            "(see minitf.export.architecture)"
        )
        return None
    if cfg.model.vocab_size < MIN_VOCAB:  # a byte-level tokenizer has at least the 256 bytes and <|endoftext|>
        log(f"generate  llama.cpp rows skipped: a GGUF tokenizer needs a vocabulary of at least {MIN_VOCAB}")
        return None
    # the context holds the prompt token and every new one: llama.cpp's and minitf's windows alike
    n = min(new_tokens, cfg.model.block_size - 1)
    torch.manual_seed(0)
    model = Transformer(cfg.model).eval()
    tokenizer = synthetic_tokenizer(cfg.model.vocab_size)
    threads = torch.get_num_threads()
    settings = SampleConfig(max_new_tokens=n, temperature=1.0, top_k=50, seed=0)

    def minitf_run(compile):
        def run():
            return sum(1 for _ in generate_tokens(model, [1], settings, compile=compile))

        return run

    def llama_run(llm):
        def run():
            llm.reset()
            count = 0
            for _ in llm.generate([1], top_k=50, top_p=1.0, min_p=0.0, temp=1.0):
                count += 1
                if count == n:
                    break
            return count

        return run

    with tempfile.TemporaryDirectory() as tmp:
        llms = {}
        for dtype in ("f32", "q8_0"):
            path = Path(tmp) / f"model-{dtype}.gguf"
            write_gguf(model, tokenizer, path, dtype)
            llms[dtype] = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=cfg.model.block_size,
                n_threads=threads,
                n_threads_batch=threads,
                verbose=False,
            )
        variants = {
            "minitf eager": minitf_run(False),
            **({"minitf compiled": minitf_run(True)} if compile else {}),
            "llama.cpp f32": llama_run(llms["f32"]),
            "llama.cpp q8_0": llama_run(llms["q8_0"]),
        }
        rates = {name: [] for name in variants}
        first_compile_s = None
        for name, run in variants.items():  # warm-up; the compiled one compiles here
            t0 = time.perf_counter()
            run()
            if name == "minitf compiled":
                first_compile_s = round(time.perf_counter() - t0, 1)
        for _ in range(rounds):
            for name, run in variants.items():
                t0 = time.perf_counter()
                count = run()
                rates[name].append(round(count / (time.perf_counter() - t0), 1))
        for llm in llms.values():
            llm.close()

    base = rates["minitf eager"]
    out = {
        "format": fmt,
        "new_tokens": n,
        "threads": threads,
        "llama_cpp_python": llama_cpp.__version__,
        "compile_first_call_s": first_compile_s,
        "rows": {},
    }
    for name, r in rates.items():
        ratios = sorted(a / b for a, b in zip(r, base))
        out["rows"][name] = {"tokens_per_s": statistics.median(r), "rates": r, "vs_eager": statistics.median(ratios)}
        log(
            f"generate  {statistics.median(r):>10,.1f} tokens/s  batch 1, {name} ({fmt}, {n} new tokens, "
            f"{threads} threads), median of {r}; {statistics.median(ratios):.2f}x minitf eager"
        )
    return out
