"""Data preparation on a generated corpus of a chosen size: seconds, MB/s and peak memory.

minitf bench --only data --data-size MB [--data-files N] [--parquet] calls data_scaling(). The
corpus is written under a temporary directory (deleted afterwards) as one file, N text files or
N parquet shards (read as hf:<dir>) of words drawn from a Zipf-distributed vocabulary of a
million made-up words (1 % of letters non-ASCII), so BPE training and encoding see about as many
distinct words as in real text. prepare_data runs in a child process, so its peak memory is the
OS's figure for that process alone: VmHWM of the child, ru_maxrss of its largest worker, and the
whole process tree's proportional resident memory (PSS, which counts the pages forked workers
share with their parent once) sampled every 0.2 s.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS, CHUNK = 1_000_000, 8 << 20


def text_chunks(seed: int = 0):
    """Endless ~8 MB chunks of text: lines of about ten words."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz") + ["é", "ö", "ñ", "ß"])
    lengths = rng.integers(1, 13, WORDS)
    n = int(lengths.sum())
    chars = "".join(letters[np.where(rng.random(n) < 0.01, rng.integers(26, 30, n), rng.integers(0, 26, n))])
    ends = np.cumsum(lengths)
    vocab = np.array([chars[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist())])
    p = 1 / np.arange(1, WORDS + 1) ** 1.05
    p /= p.sum()
    while True:
        words = vocab[rng.choice(WORDS, size=CHUNK // 6, p=p)]
        yield "".join(np.char.add(words, np.where(rng.random(len(words)) < 0.1, ".\n", " ")).tolist())


def write_corpus(root: Path, mb: float, files: int, parquet: bool = False) -> list[Path]:
    """mb MB of text as `files` text files of about equal size, or as parquet shards (a column
    'text', one row per document of about 10 kB, as in web-text datasets)."""
    root.mkdir(parents=True, exist_ok=True)
    per_file, paths, text, chunks = int(mb * 1e6 / files), [], "", text_chunks()
    for i in range(files):
        paths.append(root / f"part{i:05d}.{'parquet' if parquet else 'txt'}")
        docs, size = [], 0
        while size < per_file:
            text = text or next(chunks)
            data = text[
                : min(per_file - size, 10_000 if parquet else CHUNK)
            ]  # characters: a file may end a few bytes long
            docs.append(data)
            size += len(data.encode("utf-8"))
            text = text[len(data) :]
        if parquet:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"text": docs}), paths[-1])
        else:
            paths[-1].write_text("".join(docs), encoding="utf-8")
    return paths


def data_scaling(
    mb: float, files: int = 1, procs=(None,), rounds: int = 1, vocab_size: int = 4096, parquet: bool = False
) -> list[dict]:
    """Write the corpus once, then prepare it cold in a child process for each num_proc in procs,
    taking turns `rounds` times (so on a machine whose speed drifts each is timed beside the others)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="minitf-bench-data-", dir="/tmp") as tmp:
        t0 = time.perf_counter()
        paths = write_corpus(Path(tmp) / "corpus", mb, files, parquet)
        gen_s = time.perf_counter() - t0
        source = f"hf:{paths[0].parent}" if parquet else f"file:{paths[0].parent if files > 1 else paths[0]}"
        for r in range(rounds):
            for num_proc in procs:  # the first run trains the tokenizer; the others reuse it
                args = {"source": source, "vocab_size": vocab_size, "num_proc": num_proc, "cache": f"{tmp}/cache"}
                child = [sys.executable, "-m", "bench.data", json.dumps(args)]
                p = subprocess.run(child, capture_output=True, text=True)
                if p.returncode:
                    raise RuntimeError(f"the preparing child failed: {p.stderr[-2000:]}")
                res = json.loads(p.stdout.strip().splitlines()[-1])
                out_mb = res["mb"]
                shutil.rmtree(f"{tmp}/cache/tokens")
                out.append(
                    {
                        "corpus_mb": round(res.pop("mb"), 1),
                        "files": files,
                        "source": source.split(":")[0],
                        "num_proc": res.pop("num_proc"),
                        "round": r,
                        "generate_s": round(gen_s, 1),
                        **res,
                        "mb_per_s": round(out_mb / res["total_s"], 2),
                        "tokenize_mb_per_s": round(out_mb / res["tokenize_s"], 2),
                    }
                )
    return out


def _tree_rss(pid: int) -> int:
    """Proportional resident bytes (PSS: a page shared by n processes counts 1/n in each) of pid
    and all its descendants, from /proc: the memory the preparation really holds."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            total += int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:"))) << 10
            for t in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            continue
    return total


def _vm_hwm_kib() -> int:
    """This process's peak resident memory. (Not ru_maxrss: that survives exec, so a child of a
    big process starts with its parent's figure.)"""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def _child(args: dict) -> None:
    """In the child: prepare_data with a fresh cache, sampling memory by phase; print one JSON line."""
    import resource
    import threading

    os.environ["MINITF_CACHE"] = args["cache"]
    from minitf.config import DataConfig
    from minitf.corpus.prepare import prepare_data

    try:
        from minitf.corpus.prepare import _num_proc
    except ImportError:  # minitf before bounded tokenization, measured for comparison

        def _num_proc(asked, nbytes):
            return asked or os.cpu_count()

    trained = any(Path(args["cache"], "tokenizers").glob("*.json"))
    phase, peaks, done = ["tokenize" if trained else "bpe"], {"bpe": 0, "tokenize": 0}, threading.Event()

    def sample():
        while not done.wait(0.2):
            peaks[phase[0]] = max(peaks[phase[0]], _tree_rss(os.getpid()))

    def log(line):
        phase[0] = "tokenize" if "trained a" in line else phase[0]

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    data = prepare_data(
        DataConfig(source=args["source"], vocab_size=args["vocab_size"], num_proc=args["num_proc"]), log=log
    )
    total = time.perf_counter() - t0
    done.set()
    s = data.meta["splits"]
    mib = 1 << 20
    print(
        json.dumps(
            {
                "num_proc": _num_proc(args["num_proc"], data.meta["splits"]["train"]["bytes"]),
                "trained_bpe": not trained,
                "mb": (s["train"]["bytes"] + s["val"]["bytes"]) / 1e6,
                "tokens": s["train"]["tokens"] + s["val"]["tokens"],
                "total_s": round(total, 1),
                "tokenize_s": data.meta["tokenize_seconds"],
                "bpe_and_read_s": round(total - data.meta["tokenize_seconds"], 1),
                "peak_rss_mb": round(_vm_hwm_kib() / 1024),
                "peak_worker_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
                "peak_tree_pss_bpe_mb": round(peaks["bpe"] / mib),
                "peak_tree_pss_tokenize_mb": round(peaks["tokenize"] / mib),
                "cache_mb": round(sum(f.stat().st_size for f in data.path.iterdir()) / 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))


def describe(r: dict) -> str:
    """One line for one measurement of data_scaling."""
    kind = "parquet shard(s)" if r["source"] == "hf" else "text file(s)"
    return (
        f"data      {r['corpus_mb']} MB in {r['files']} {kind}, num_proc {r['num_proc']}: {r['total_s']} s "
        f"({r['mb_per_s']} MB/s end to end; tokenizing {r['tokenize_s']} s, {r['tokenize_mb_per_s']} MB/s), "
        f"peak RSS {r['peak_rss_mb']} MB (largest worker {r['peak_worker_rss_mb']} MB; all processes, PSS: "
        f"BPE {r['peak_tree_pss_bpe_mb']} MB, tokenizing {r['peak_tree_pss_tokenize_mb']} MB), "
        f"cache {r['cache_mb']} MB"
    )


def tokenizer_speed(vocab_size: int = 4096, log=print) -> dict:
    """BPE training time and encode throughput on the default corpus (fetched once, then cached)."""
    from minitf.corpus.shakespeare import shakespeare_files
    from minitf.corpus.sources import cache_dir
    from minitf.tokenizer import Tokenizer

    texts = [f.read_text(encoding="utf-8") for f in shakespeare_files(cache_dir(), log)]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    t0 = time.perf_counter()
    tok = Tokenizer.train(texts, vocab_size)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = sum(len(ids) for ids in tok.encode_batch(texts))
    enc_s = time.perf_counter() - t0
    # one 1 MB line without whitespace (a DNA sequence, a minified file): BPE sees a single 1 MB
    # "word", which it learns from in pieces of MAX_PIECE_BYTES (quadratic, minutes, without them)
    rng = random.Random(0)
    letters = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=1 << 20))
    t0 = time.perf_counter()
    Tokenizer.train([letters], vocab_size)
    no_space_s = time.perf_counter() - t0
    return {
        "corpus_mb": round(mb, 2),
        "vocab": tok.vocab_size,
        "train_s": round(train_s, 2),
        "encode_s": round(enc_s, 2),
        "encode_mb_per_s": round(mb / enc_s, 2),
        "tokens": n,
        "no_whitespace_1mb_train_s": round(no_space_s, 2),
    }


def data_prep_speed(cfg) -> dict:
    """prepare_data cold (empty token cache; the downloaded corpus is reused) and then cached."""
    from minitf.corpus.prepare import prepare_data
    from minitf.corpus.shakespeare import shakespeare_files
    from minitf.corpus.sources import cache_dir

    corpus = shakespeare_files(cache_dir(), lambda *a: None)[0].parent if cfg.data.source == "shakespeare" else None
    old = os.environ.get("MINITF_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        if corpus is not None:  # the same files, so no download is timed
            os.symlink(corpus, Path(tmp) / corpus.name)
        os.environ["MINITF_CACHE"] = tmp
        try:
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                prepare_data(cfg.data, log=lambda *a: None)
                times.append(time.perf_counter() - t0)
        finally:
            if old is None:
                del os.environ["MINITF_CACHE"]
            else:
                os.environ["MINITF_CACHE"] = old
    return {"source": cfg.data.source, "cold_s": round(times[0], 2), "cached_s": round(times[1], 3)}
