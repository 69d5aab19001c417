"""The OpenAI-compatible server's latency and throughput: minitf bench --only serve.

The server is `minitf serve` itself, in its own process, as users run it (its default settings:
4 completions generate at once, the others wait for a slot); the clients are threads of this
process that speak plain HTTP over loopback (urllib, no client library in the way). Clients in the
server's own process would take its interpreter lock to read every event, which a real client never
does. Each client streams one
completion of `new_tokens` tokens from the run's own prompt, with its own seed, and reports

- first token: seconds from sending its request to the first server-sent event (one sampled token);
- its tokens (usage.completion_tokens) and when its stream ended.

With 1 and with 8 clients starting at once, in turns for `rounds` rounds (machines drift: the two
settings alternate); tokens/s is all clients' tokens over the time from the first request to the
last stream's end. A first request warms up and is not counted.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def _stream(url: str, model: str, prompt: str, new_tokens: int, seed: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": new_tokens,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    t0 = time.perf_counter()
    first, tokens = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            first = first if first is not None else time.perf_counter() - t0
            usage = json.loads(line[6:]).get("usage")
            tokens = usage["completion_tokens"] if usage else tokens
    return {"start": t0, "first_token_s": first, "end": time.perf_counter(), "tokens": tokens}


def _round(url: str, model: str, prompt: str, new_tokens: int, clients: int, seed: int) -> dict:
    results = [None] * clients
    start = threading.Barrier(clients)

    def client(i):
        start.wait()
        results[i] = _stream(url, model, prompt, new_tokens, seed + i)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    return {"first": [r["first_token_s"] for r in results], "tokens": tokens, "rate": tokens / wall}


def serve_speed(
    run_dir: str | Path, new_tokens: int = 100, rounds: int = 3, clients=(1, 8), parallel: int = 4, cwd=None
) -> dict:
    """The numbers above; cwd: where `python -m minitf serve` starts (another checkout's, to compare)."""
    from minitf.config import load_config

    server = subprocess.Popen(
        [sys.executable, "-m", "minitf", "serve", "--run", str(run_dir), "--port", "0", "--parallel", str(parallel),
         "--max-tokens", str(max(new_tokens, 20))],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        said = server.stdout.readline()
        if not (found := re.search(r"http://\S+", said)):
            raise RuntimeError(f"minitf serve did not start: {said}{server.stderr.read()}")
        url = found[0].rstrip("/")
        with urllib.request.urlopen(url + "/models", timeout=60) as r:
            model = json.loads(r.read())["data"][0]["id"]
        prompt = load_config(Path(run_dir) / "config.yaml").sample.prompt
        _stream(url, model, prompt, min(new_tokens, 20), 0)  # warm-up
        seen = {c: [] for c in clients}
        for r in range(rounds):
            for c in clients:
                seen[c].append(_round(url, model, prompt, new_tokens, c, seed=1000 * r))
    finally:
        server.send_signal(signal.SIGTERM)  # a graceful stop
        server.communicate(timeout=60)
    out = {"run": str(run_dir), "new_tokens": new_tokens, "parallel": parallel, "runs": []}
    for c, done in seen.items():
        firsts = [t for d in done for t in d["first"]]
        out["runs"].append(
            {
                "clients": c,
                "first_token_s": round(statistics.median(firsts), 4),
                "first_token_max_s": round(max(firsts), 4),
                "tokens_per_s": round(statistics.median(d["rate"] for d in done), 1),
                "rates": [round(d["rate"], 1) for d in done],
                "tokens": [d["tokens"] for d in done],
            }
        )
    return out


def describe(res: dict) -> list[str]:
    return [
        f"serve     {r['clients']} client{'s' if r['clients'] > 1 else ' '} at once: first token "
        f"{r['first_token_s']} s (median, max {r['first_token_max_s']}), {r['tokens_per_s']:,.1f} tokens/s in all "
        f"(median of {r['rates']}), {res['new_tokens']} tokens each, {res['parallel']} generating at once"
        for r in res["runs"]
    ]
