"""The explorer's HTTP API against a trained run: the numbers are the library's own (generate,
inspect), bad input is a 400 with one line, nothing outside the page is served, streams stop."""

import copy
import dataclasses
import http.client
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from urllib.error import HTTPError

import pytest
import torch
from safetensors import safe_open

import minitf
from minitf.generate import generate_tokens, sample_settings, token_probs, window_start
from minitf.inspection import logit_lens, token_label
from minitf.positions import rotary_angles, sinusoidal_table
from minitf.run_dir import METRICS, read_rows
from minitf.sampling import sampler_distribution
from minitf.web.explore import STATIC
from minitf.web.explore.api import MAX_GENERATIONS, VIEWS, BadRequest, Explorer
from tests.support import ROOT
from tests.support.processes import spawned


@pytest.fixture
def server(explore_server):
    return explore_server


def call(server, path, body=None, headers=None, raw=None):
    """(status, JSON) of a GET (no body) or a JSON POST."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def events(server, body) -> list[dict]:
    req = urllib.request.Request(
        server.url + "api/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"] == "application/x-ndjson"
        return [json.loads(line) for line in r]


def test_run_info_and_loss_curve(server, tiny_run):
    status, run = call(server, "/api/run")
    model, _, cfg = minitf.load_run(tiny_run)
    with safe_open(str(tiny_run / "model.safetensors"), "pt") as f:
        step = int(f.metadata()["step"])
    assert status == 200 and run["step"] == step == 30 and run["checkpoint"] == "model.safetensors"
    assert run["params"] == model.num_params() and run["config"] == json.loads(json.dumps(cfg.to_dict()))
    assert run["limits"]["block_size"] == cfg.model.block_size == 32
    status, curve = call(server, "/api/metrics")
    evals = [r for r in read_rows(tiny_run / METRICS) if "val_loss" in r]
    assert status == 200 and [p["step"] for p in curve["points"] if "val_loss" in p] == [r["step"] for r in evals]
    assert [p["val_loss"] for p in curve["points"] if "val_loss" in p] == [r["val_loss"] for r in evals]


def test_the_page_ships_in_the_package_and_loads_nothing_from_outside(server):
    for path, (name, kind) in STATIC.items():
        with urllib.request.urlopen(server.url.rstrip("/") + path, timeout=10) as r:
            text = r.read().decode()
            assert r.headers["Content-Type"] == kind and len(text) > 500
        # no CDN, font or script from elsewhere (the SVG namespace is a name, not a download)
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), name
    page = urllib.request.urlopen(server.url, timeout=10).read().decode()
    assert all(f'"{p}"' in page for p in STATIC if p != "/")


@pytest.mark.parametrize(
    "path",
    [
        "/static/../explore.py",
        "/static/..%2f..%2fREADME.md",
        "/../../etc/passwd",
        "/static/app.js/../../config.py",
        "//etc/passwd",
        "/static/",
        "/minitf/web/explore.py",
    ],
)
def test_nothing_but_the_page_is_served(server, path):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", path)  # sent as written: no client-side normalisation of the dots
    r = conn.getresponse()
    body = r.read()
    assert r.status == 404 and "no page" in json.loads(body)["error"]
    assert b"import" not in body and b"root:" not in body


def expected_tokens(tiny_run, prompt, **settings):
    model, tok, cfg = minitf.load_run(tiny_run)
    s = sample_settings(cfg.sample, **settings)
    return [int(i) for i in generate_tokens(model, tok.encode(prompt), s)], minitf.generate(model, tok, prompt, s)


def test_generate_streams_the_tokens_of_minitf_generate(server, tiny_run):
    got = events(server, {"prompt": "ROMEO: O", "max_new_tokens": 25, "seed": 3, "temperature": 1.0, "top_k": None})
    tok = server.explorer.tok
    assert [t["id"] for t in got[0]["prompt"]] == tok.encode("ROMEO: O")
    tokens = [e["token"] for e in got[1:-1]]
    ids, text = expected_tokens(tiny_run, "ROMEO: O", max_new_tokens=25, seed=3, temperature=1.0, top_k=None)
    assert [t["id"] for t in tokens] == ids[: len(tokens)] and "".join(t["text"] for t in tokens) == text
    assert got[-1] == {"done": "eot" if tokens[-1]["id"] == tok.eot_id else "length"}
    for t in tokens:
        probs = [p for _, p in t["top"]]
        assert 0 < t["prob"] <= 1 and len(t["top"]) == 5 and probs == sorted(probs, reverse=True)
        assert t["prob"] <= probs[0] + 1e-6


def test_two_tabs_generating_at_once_do_not_mix(server, tiny_run):
    bodies = [
        {"prompt": p, "max_new_tokens": 60, "seed": s, "temperature": 1.0} for p, s in (("ROMEO:", 1), ("JULIET: O", 2))
    ]
    results = [None, None]

    def tab(i):
        results[i] = [e["token"]["id"] for e in events(server, bodies[i]) if "token" in e]

    threads = [threading.Thread(target=tab, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for body, got in zip(bodies, results):
        ids, _ = expected_tokens(tiny_run, body["prompt"], max_new_tokens=60, seed=body["seed"], temperature=1.0)
        assert got == ids[: len(got)] and len(got) > 5


def test_a_closed_stream_stops_its_generation(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    conn.request(
        "POST",
        "/api/generate",
        json.dumps({"prompt": "ROMEO:", "max_new_tokens": 1000, "temperature": 2.0}),
        {"Content-Type": "application/json"},
    )
    r = conn.getresponse()
    assert "prompt" in json.loads(r.readline()) and "token" in json.loads(r.readline())
    r.close()  # the tab goes away: its socket closes
    conn.close()
    deadline = time.time() + 30
    while not any("closed the stream" in m for m in server.logs) and time.time() < deadline:
        time.sleep(0.05)
    sent = [int(re.search(r"after (\d+) tokens", m)[1]) for m in server.logs if "closed the stream" in m]
    assert sent and sent[-1] < 1000
    assert all(server.explorer.slots.acquire(blocking=False) for _ in range(MAX_GENERATIONS))  # its slot came back
    for _ in range(MAX_GENERATIONS):
        server.explorer.slots.release()


def test_attention_is_inspects_own_numbers(server, tiny_run):
    tok = server.explorer.tok
    ids = tok.encode("ROMEO: O love, sweet night")
    query, layer, head = len(ids) - 3, 1, 1
    status, v = call(server, "/api/attention", {"ids": ids, "query": query, "layer": layer, "head": head})
    ins = minitf.inspect(server.explorer.model, tok, ids)
    T, H, L = len(ids), ins.n_head, ins.n_layer
    assert status == 200 and v["offset"] == 0 and v["query"] == query and v["ids"] == ids and len(v["tokens"]) == T
    assert len(v["grid"]) == L and all(len(heads) == H for heads in v["grid"])
    for layer in range(L):
        for h in range(H):
            row = torch.tensor(v["grid"][layer][h])
            assert row.shape == (query + 1,) and abs(row.sum().item() - 1) < 1e-5
            torch.testing.assert_close(row, ins.layers[layer].weights[h, query, : query + 1], atol=1e-6, rtol=0)
    heat = v["heatmap"]
    assert [[x is None for x in r] for r in heat] == [[j > i for j in range(T)] for i in range(T)]  # the causal mask
    full = torch.tensor([[0.0 if x is None else x for x in r] for r in heat])
    torch.testing.assert_close(full, ins.layers[layer].weights[head], atol=1e-6, rtol=0)
    s, steps = v["steps"], ins.layers[layer]
    assert s["d"] == steps.q.size(-1) and s["masked"][query + 1 :] == [None] * (T - query - 1)
    for name in ("scores", "scaled", "weights"):
        torch.testing.assert_close(torch.tensor(s[name]), getattr(steps, name)[head, query], atol=1e-6, rtol=0)
    torch.testing.assert_close(
        torch.tensor(s["scaled"]), torch.tensor(s["scores"]) / math.sqrt(s["d"]), atol=1e-5, rtol=0
    )
    out = torch.tensor(s["weights"]) @ torch.tensor(s["v"])  # the weighted sum of the values
    torch.testing.assert_close(torch.tensor(s["out"]), out, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(s["out"]), steps.heads[head, query], atol=1e-6, rtol=0)


def test_attention_past_block_size_inspects_the_window_ending_at_the_query(server):
    tok = server.explorer.tok
    ids = (tok.encode("ROMEO: O love, sweet night! ") * 6)[:50]  # block_size is 32
    status, v = call(server, "/api/attention", {"ids": ids, "query": 45})
    assert status == 200 and v["offset"] == 14 and v["ids"] == ids[14:46] and v["query"] == 31
    ins = minitf.inspect(server.explorer.model, tok, ids[14:46])
    torch.testing.assert_close(torch.tensor(v["grid"][0][0]), ins.layers[0].weights[0, 31], atol=1e-6, rtol=0)


PROMPT = "ROMEO: O love, sweet night"


def window_logits(model, ids, position):
    """The model's logits (V,) for the token after ids[position], over generation's window."""
    start = window_start(position + 1, model.config.block_size)
    with torch.no_grad():
        return model(torch.tensor([ids[start : position + 1]]))[0][0, -1]


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
        {"temperature": 1.5, "top_k": None, "top_p": 0.5, "repetition_penalty": 1.3},
        {"temperature": 0.5, "top_k": None, "top_p": 0.6},
        {"temperature": 0, "top_k": None},
        {},  # the run's own sample settings
    ],
)
def test_distribution_is_softmax_of_the_logits_after_the_samplers_rules(server, settings):
    model, tok, cfg = server.explorer.model, server.explorer.tok, server.explorer.cfg
    ids = tok.encode(PROMPT)
    position = len(ids) - 3
    status, v = call(server, "/api/distribution", {"ids": ids, "position": position, "top": 30, **settings})
    s = sample_settings(cfg.sample, **settings)
    logits = window_logits(model, ids, position)
    history = torch.tensor([ids[: position + 1]])
    probs = token_probs(logits[None], s, history)[0]  # what generation reports, temperature > 0
    penalized = sampler_distribution(logits[None], s, history).model[0]
    assert status == 200 and v["position"] == position and v["offset"] == 0 and v["vocab"] == tok.vocab_size
    assert v["settings"] == {k: getattr(s, k) for k in ("temperature", "top_k", "top_p", "repetition_penalty")}
    assert v["next"] == {"id": ids[position + 1], "label": token_label(tok.decode([ids[position + 1]]))}
    shown = [t["id"] for t in v["tokens"]]
    assert shown[:30] == penalized.topk(30).indices.tolist() and len(shown) in (30, 31)
    got = {k: torch.tensor([t[k] for t in v["tokens"]]) for k in ("logit", "model", "tempered", "prob")}
    torch.testing.assert_close(got["logit"], logits[shown], atol=1e-6, rtol=0)
    torch.testing.assert_close(got["model"], penalized[shown], atol=1e-6, rtol=0)
    if s.temperature:
        torch.testing.assert_close(got["prob"], probs[shown], atol=1e-6, rtol=0)
        tempered = (torch.log(penalized) / s.temperature).softmax(-1)  # the penalized logits / T, softmaxed
        torch.testing.assert_close(got["tempered"], tempered[shown], atol=1e-5, rtol=0)
        assert v["kept"] == int((probs > 0).sum()) and [t["kept"] for t in v["tokens"]] == (probs[shown] > 0).tolist()
    else:  # greedy: everything on the likeliest token
        assert v["kept"] == 1 and got["prob"].tolist() == [1.0] + [0.0] * (len(shown) - 1)
    if s.top_k:
        assert v["kept"] <= s.top_k
    if s.temperature and s.top_p and not s.top_k:  # top_p alone: the smallest set of the likeliest reaching p
        kept, mass = torch.tensor([t["kept"] for t in v["tokens"]])[:30], got["tempered"][:30]
        assert kept.tolist() == [True] * v["kept"] + [False] * (30 - v["kept"]) if v["kept"] < 30 else kept.all()
        if v["kept"] < 30:
            assert mass[kept].sum() >= s.top_p - 1e-6 and mass[kept][:-1].sum() < s.top_p
    assert v["entropy"]["sampled"] <= v["entropy"]["tempered"] + 1e-6  # cutting tokens only sharpens


def test_a_generated_tokens_distribution_gave_it_its_probability(server, tiny_run):
    """Past block_size too: the page asks about the window generation read."""
    body = {"prompt": "ROMEO: O", "max_new_tokens": 40, "seed": 4, "temperature": 1.2, "top_k": 20, "top_p": 0.95}
    got = events(server, body)
    ids = [t["id"] for t in got[0]["prompt"]]
    n = len(ids)
    tokens = [e["token"] for e in got[1:-1]]
    ids += [t["id"] for t in tokens]
    assert len(ids) > 32 + 2  # the window has moved
    rules = {k: body[k] for k in ("temperature", "top_k", "top_p")}
    for j in (n, n + 5, len(ids) - 1):  # the first, a middle and the last generated token
        status, v = call(server, "/api/distribution", {"ids": ids, "position": j - 1, **rules})
        [mine] = [t for t in v["tokens"] if t["id"] == ids[j]]
        assert status == 200 and v["next"]["id"] == ids[j] and mine["kept"]
        assert v["offset"] == window_start(j, 32) and abs(mine["prob"] - tokens[j - n]["prob"]) < 1e-4


def test_logit_lens_ends_on_the_models_logits(server):
    model, tok = server.explorer.model, server.explorer.tok
    ids = tok.encode(PROMPT)
    position = 6
    status, v = call(server, "/api/lens", {"ids": ids, "position": position, "top": 8})
    L = model.config.n_layer
    assert status == 200 and [r["name"] for r in v["layers"]] == ["embeddings"] + [f"block {i}" for i in range(L)]
    probs = window_logits(model, ids, position).softmax(-1)
    last = v["layers"][-1]
    best = probs.topk(8)
    assert [t["id"] for t in last["top"]] == best.indices.tolist()  # the last layer's lens: the real prediction
    torch.testing.assert_close(torch.tensor([t["prob"] for t in last["top"]]), best.values, atol=1e-6, rtol=0)
    lens = logit_lens(model, minitf.inspect(model, tok, ids[: position + 1]))[:, -1].softmax(-1)  # (L + 1, V)
    nxt = ids[position + 1]
    for row, p in zip(v["layers"], lens):
        assert [t["id"] for t in row["top"]] == p.topk(8).indices.tolist()
        assert abs(row["next"]["prob"] - p[nxt].item()) < 1e-6 and row["next"]["rank"] == int((p > p[nxt]).sum()) + 1
    assert v["layers"][0]["top"] != last["top"]  # the blocks change what the stream predicts
    status, v = call(server, "/api/lens", {"ids": ids, "position": len(ids) - 1})
    assert status == 200 and v["next"] is None and "next" not in v["layers"][0] and len(v["layers"][0]["top"]) == 5


def explorer_with(explorer, positions: str):
    """The tiny run's explorer with a fresh model of another position kind (the API reads what the model has)."""
    cfg = dataclasses.replace(explorer.cfg, model=dataclasses.replace(explorer.cfg.model, positions=positions))
    other = copy.copy(explorer)
    other.cfg, other.model = cfg, minitf.Transformer(cfg.model).eval()
    return other


@pytest.mark.parametrize("kind", ["learned", "sinusoidal", "rope"])
def test_positions_are_the_models_own(server, kind):
    served = kind == server.explorer.cfg.model.positions  # the run's own kind; the others on a fresh model
    ex = server.explorer if served else explorer_with(server.explorer, kind)
    m = ex.cfg.model
    ids = ex.tok.encode(PROMPT * 3)[:45]  # past block_size: the window's positions
    v = ex.positions({"ids": ids, "position": 40})
    if served:  # over HTTP the API says the same
        status, over_http = call(server, "/api/positions", {"ids": ids, "position": 40})
        assert status == 200 and over_http == v
    start = window_start(41, m.block_size)
    assert v["kind"] == kind == m.positions and v["offset"] == start and v["position"] == 40 - start
    assert v["n"] == len(v["tokens"]) == 41 - start and v["token"]["id"] == ids[40]
    if kind == "rope":
        angles = torch.tensor(v["angles"], dtype=torch.float64)
        assert angles.shape == (m.block_size, m.head_size // 2)  # a small table: every position
        torch.testing.assert_close(angles, rotary_angles(m.block_size, m.head_size, m.rope_base), atol=1e-6, rtol=0)
        torch.testing.assert_close(angles.cos().float(), ex.model.rope.cos, atol=1e-5, rtol=0)  # what rope turns by
        torch.testing.assert_close(angles.sin().float(), ex.model.rope.sin, atol=1e-5, rtol=0)
        assert "table" not in v
        return
    table = torch.tensor(v["table"])
    assert table.shape == (m.block_size, m.n_embd)
    own = ex.model.wpe.wpe.weight if kind == "learned" else sinusoidal_table(m.block_size, m.n_embd)
    torch.testing.assert_close(table, own.detach(), atol=1e-6, rtol=0)
    assert abs(v["norms"]["position"] - own[40 - start].norm().item()) < 1e-5
    assert abs(v["norms"]["token"] - ex.model.wte.weight[ids[40]].norm().item()) < 1e-5


BAD = [
    ("/api/generate", {"prompt": 12}, "prompt must be text, got int"),
    ("/api/generate", {"prompt": "x" * 5000}, "the prompt is 5000 characters; at most 4000, shorten it"),
    ("/api/generate", {"prompt": "ROMEO: O love " * 20}, r"tokens but this model reads at most block_size=32; shorten"),
    ("/api/generate", {"max_new_tokens": 5000}, "max_new_tokens is 5000; at most 1000 here"),
    ("/api/generate", {"max_new_tokens": 0}, "sample.max_new_tokens must be positive, got 0"),
    ("/api/generate", {"temperature": "hot"}, "temperature must be a number, got 'hot'"),
    ("/api/generate", {"temperature": -1}, r"sample.temperature must be >= 0 \(0 = greedy\), got -1.0"),
    ("/api/generate", {"top_p": 2}, r"sample.top_p must be in \(0, 1\], got 2.0"),
    ("/api/generate", {"top_k": 2.5}, "top_k must be a whole number, got 2.5"),
    ("/api/generate", {"seed": -1}, r"seed is -1; it must be 0..9223372036854775807"),
    ("/api/generate", {"temprature": 1}, "unknown field 'temprature'; expected some of max_new_tokens, prompt,"),
    ("/api/attention", {"ids": [], "query": 0}, "ids must be a list of 1 to 1032 token ids"),
    ("/api/attention", {"ids": "ROMEO", "query": 0}, "ids must be a list of 1 to 1032 token ids"),
    ("/api/attention", {"ids": [1, 2], "query": 2}, r"query is 2; it must be 0..1"),
    ("/api/attention", {"ids": [1, 2]}, "query must be a whole number, got None"),
    ("/api/attention", {"ids": [1, 10**9], "query": 1}, r"ids holds ids outside 0..299 \(min 1, max 1000000000\)"),
    ("/api/attention", {"ids": [1, True], "query": 1}, r"ids holds True, which is not a token id \(an int in 0..299\)"),
    ("/api/attention", {"ids": [1, 2], "query": 1, "layer": 2}, r"layer is 2; it must be 0..1"),
    ("/api/attention", [1, 2], "the request body must be a JSON object"),
    ("/api/distribution", {"ids": [1, 2], "position": 2}, r"position is 2; it must be 0..1"),
    ("/api/distribution", {"ids": [1, 2], "position": 1, "top_p": 0}, r"sample.top_p must be in \(0, 1\], got 0"),
    (
        "/api/distribution",
        {"ids": [1, 2], "position": 1, "temperature": None},
        "temperature must be a number, got None",
    ),
    ("/api/distribution", {"ids": [1, 2], "position": 1, "seed": 3}, "unknown field 'seed'; expected some of ids,"),
    ("/api/distribution", {"ids": [1, 2], "position": 1, "top": 500}, r"top is 500; it must be 1..100"),
    ("/api/lens", {"ids": [1, -4], "position": 0}, r"ids holds ids outside 0..299 \(min -4, max 1\)"),
    ("/api/lens", {"ids": [], "position": 0}, "ids must be a list of 1 to 1032 token ids"),
    ("/api/positions", {"ids": [1, 2], "position": "1"}, "position must be a whole number, got '1'"),
    (
        "/api/positions",
        {"ids": [1, 2], "position": 0, "layer": 0},
        "unknown field 'layer'; expected some of ids, position",
    ),
    ("/api/nowhere", {}, "no endpoint '/api/nowhere' here"),
]


@pytest.mark.parametrize("path, body, message", BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_is_a_400_with_one_line(server, path, body, message):
    status, answer = call(server, path, body)
    assert status == (404 if "nowhere" in path else 400)
    assert re.search(message, answer["error"]) and "\n" not in answer["error"]


def test_bad_requests_busy_server_and_foreign_hosts(server):
    assert call(server, "/api/attention", raw=b"{not json")[1] == {"error": "the request body is not valid JSON"}
    status, answer = call(server, "/api/generate", {}, headers={"Content-Type": "text/plain"})
    assert status == 400 and "Content-Type: application/json" in answer["error"]
    status, answer = call(server, "/api/run", headers={"Host": "attacker.example:80"})  # DNS rebinding
    assert status == 403 and "127.0.0.1 or localhost only" in answer["error"]
    taken = [server.explorer.slots.acquire(blocking=False) for _ in range(MAX_GENERATIONS)]
    try:
        status, answer = call(server, "/api/generate", {"prompt": "ROMEO:"})
        assert all(taken) and status == 503 and "generations are running already" in answer["error"]
    finally:
        for _ in range(MAX_GENERATIONS):
            server.explorer.slots.release()


def run_script(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "scripts/explore.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_script_mistakes_are_one_line_and_exit_2(tmp_path, tiny_run):
    r = run_script("--run", str(tmp_path / "nope"))
    assert (
        r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_script("--run", str(tiny_run), "--port", str(port))
    assert (
        r.returncode == 2
        and r.stderr
        == f"error: cannot serve on 127.0.0.1:{port} (Address already in use); "
        f"pass another --port (0 picks a free one)\n"
    )


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_one_line(tiny_run, port):
    r = run_script("--run", str(tiny_run), "--port", port)
    assert r.returncode == 2 and r.stderr == (
        f"error: --port {port} is out of range; use 1..65535, or 0 for any free port\n"
    )


def test_script_serves_until_ctrl_c_and_warns_off_loopback(tiny_run):
    p = spawned("scripts/explore.py", "--run", str(tiny_run), "--port", "0", "--host", "0.0.0.0")
    try:
        line = p.stdout.readline()
        port = int(re.search(r"http://0\.0\.0\.0:(\d+)/", line)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/run", timeout=10) as r:
            assert json.loads(r.read())["run"] == tiny_run.name
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    assert p.returncode == 0 and "Traceback" not in err and "interrupted" not in err
    assert err.startswith("warning: serving on 0.0.0.0: anyone who can reach this machine")


def test_the_page_ships_in_a_built_package(tmp_path):
    pytest.importorskip("setuptools", reason="building the package here needs setuptools")
    src, target = tmp_path / "src", tmp_path / "site"  # a copy: the build leaves build/ and egg-info behind
    shutil.copytree(ROOT / "minitf", src / "minitf", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", src / "configs")  # the recipes ship as minitf/configs
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code = (
        "import minitf, minitf.web.explore as e; from importlib import resources; "
        "print(minitf.__file__); "
        "print(sum(len(resources.files('minitf.web.explore').joinpath('static', n).read_bytes()) "
        "for n, _ in e.STATIC.values()))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    path, size = r.stdout.split()
    assert path.startswith(str(target)) and int(size) == sum(
        (ROOT / "minitf" / "web" / "explore" / "static" / n).stat().st_size for n, _ in STATIC.values()
    )


def raw_request(server, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """(status, JSON) of a request sent byte for byte as given, with its body's Content-Length."""
    with socket.create_connection(server.server_address[:2], timeout=30) as s:
        s.sendall(head + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head_bytes, _, answer = data.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(answer)


POST_ATTENTION = b"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


HOSTILE_JSON = [
    (b'{"ids": [1, 2], "query": 1e400}', r"a number too large for JSON \(1e400\)"),
    (b'{"prompt": "\\ud800"}', r"a lone surrogate '\\ud800', which is not text"),
    (b'{"ids": ' + b"[" * 100_000 + b"]" * 100_000 + b', "query": 0}', "nested too deeply"),
    (b'{"temperature": NaN}', "holds NaN, which is not a number JSON allows"),
    (b'{"ids": [1, 2], "query": -Infinity}', "holds -Infinity, which is not a number JSON allows"),
]


@pytest.mark.parametrize("body, message", HOSTILE_JSON, ids=["1e400", "surrogate", "deep", "nan", "-inf"])
def test_hostile_json_is_a_400_with_one_line(server, body, message):
    path = b"/api/generate" if b"prompt" in body or b"temperature" in body else b"/api/attention"
    status, answer = raw_request(server, POST_ATTENTION.replace(b"/api/attention", path), body)
    assert status == 400 and re.search(message, answer["error"]), answer
    assert "\n" not in answer["error"]


@pytest.mark.parametrize("host", [b"[::1", b"127.0.0.1:notaport", b"\xff\xfe", b"[zz]"])
def test_a_malformed_host_header_is_a_400(server, host):
    status, answer = raw_request(server, b"GET /api/run HTTP/1.1\r\nHost: " + host + b"\r\n")
    assert status in (400, 403) and "\n" not in answer["error"], answer
    assert status == 400 or "127.0.0.1 or localhost only" in answer["error"]


def test_slow_clients_neither_block_nor_stay(server):
    """20 clients that send their headers a byte at a time (a slowloris): the page still answers
    at once, the slow clients hold no thread (one event loop reads every connection), and each is
    answered 408 and closed when its timeout has passed."""
    from minitf.web.explore import ExploreServer
    from minitf.web.stack import Limits

    limits = Limits(timeout=2.0)
    logs = []
    slow_server = ExploreServer(server.explorer, "127.0.0.1", 0, log=logs.append, limits=limits)
    thread = threading.Thread(target=slow_server.serve_forever, daemon=True)
    thread.start()
    slow = []
    try:
        assert call(slow_server, "/api/run")[0] == 200  # the server's own threads, if any, start here
        threads = threading.active_count()
        t0 = time.monotonic()
        for _ in range(20):
            s = socket.create_connection(slow_server.server_address, timeout=10)
            s.sendall(b"GET /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(s)
        for _ in range(3):  # a byte at a time keeps them sending, never finishing
            for s in slow:
                s.sendall(b"a")
            time.sleep(0.1)
        status, info = call(slow_server, "/api/run")
        assert status == 200 and info["run"] == server.explorer.run_dir.name
        assert time.monotonic() - t0 < limits.timeout  # answered while every slow client still hangs
        assert threading.active_count() == threads  # 20 open connections, not one thread more
        for s in slow:
            answer = b""
            while chunk := s.recv(65536):  # the 408, then end of file: the server closed it
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 ") and b"request timed out" in answer
        assert limits.timeout - 0.5 < time.monotonic() - t0 < limits.timeout + 5
        assert sum("no complete request within 2 s; closed" in line for line in logs) == 20
    finally:
        for s in slow:
            s.close()
        slow_server.close()
        thread.join(5)


def test_a_diverged_runs_nan_loss_never_reaches_the_page_as_nan(tiny_run, tmp_path):
    """metrics.jsonl of a run whose loss went NaN (Python's json writes NaN and Infinity): the page
    gets JSON that a browser parses, the non-finite values left out of their points."""
    from minitf.web.explore import Explorer, ExploreServer

    run = tmp_path / "diverged"
    shutil.copytree(tiny_run, run)
    with open(run / METRICS, "a") as f:
        f.write(json.dumps({"step": 45, "train_loss": float("nan"), "val_loss": float("inf"), "lr": 1e-3}) + "\n")
    srv = ExploreServer(Explorer(run), "127.0.0.1", 0, log=lambda msg: None)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(srv.url + "api/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        srv.close()
        thread.join(5)

    def refuse(name):
        raise AssertionError(f"{name} in the answer: {text}")

    points = json.loads(text, parse_constant=refuse)["points"]  # a browser's JSON.parse takes no NaN
    assert [p["step"] for p in points] == [15, 30, 45]
    assert points[-1] == {"step": 45, "lr": 1e-3}  # the chart skips a value that is not there
    assert all(math.isfinite(p["train_loss"]) for p in points[:2])


def test_the_runs_own_max_new_tokens_is_not_a_bad_request(server):
    """The 1000-token cap is on what a request asks for; a run whose config says more still generates."""
    ex = copy.copy(server.explorer)
    ex.cfg = dataclasses.replace(ex.cfg, sample=dataclasses.replace(ex.cfg.sample, max_new_tokens=2000))
    assert ex._generation_request({"prompt": "ROMEO:"})[1].max_new_tokens == 2000
    with pytest.raises(BadRequest, match="max_new_tokens is 2000; at most 1000 here"):
        ex._generation_request({"prompt": "ROMEO:", "max_new_tokens": 2000})


# The explorer's heads and attribution views (POST /api/heads, /api/attribution) over a trained
# run: the numbers are minitf.interpret's on the window the model read, and bad input is one line.


@pytest.fixture(scope="module")
def ex(tiny_run):
    return Explorer(tiny_run)


@pytest.fixture(scope="module")
def ids(ex):
    return ex.tok.encode("ROMEO: O love, sweet night! ROMEO: O love")


def post(server, view: str, body: dict):
    """(status, JSON) of POST /api/<view>."""
    req = urllib.request.Request(
        server.url.rstrip("/") + f"/api/{view}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_views_are_served(explore_server, ex, ids):
    assert VIEWS["heads"] == "heads" and VIEWS["attribution"] == "attribution"
    status, d = post(explore_server, "heads", {"ids": ids, "position": 4, "heads": [[0, 0]]})
    assert status == 200 and d["heads"] == [[0, 0]] and d == ex.heads({"ids": ids, "position": 4, "heads": [[0, 0]]})
    status, d = post(explore_server, "attribution", {"ids": ids, "position": 4})
    assert status == 200 and d["target"]["id"] == ids[5]
    status, d = post(explore_server, "heads", {"ids": ids, "position": 4, "heads": [[0, 99]]})
    assert status == 400 and "head is 99" in d["error"]


# What training prints is right: the commands it suggests run as printed, the LR schedule it
# follows reaches its peak and floor on any machine speed, and its notes compare with the budget.


def test_explorer_run_info_says_the_budget(explore_server, tiny_run):
    import urllib.request

    with urllib.request.urlopen(explore_server.url + "api/run", timeout=30) as r:
        assert json.loads(r.read())["budget"] == "30 steps"
