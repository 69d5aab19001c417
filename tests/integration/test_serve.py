"""The OpenAI-compatible server, spoken to by the official `openai` client over 127.0.0.1: its
completions are minitf.generate's, its logprobs the model's own, its errors the client's own
exception types; slow clients and closed connections are handled (observed through the server's
hooks and logs, never through timings)."""

import json
import math
import re
import socket
import threading

import pytest
import torch

import minitf
from minitf.generate import generate_tokens, sample_settings
from minitf.run_dir import load_run
from minitf.web.serve import Limits
from minitf.web.serve.request import MAX_STOPS
from tests.support.processes import command, spawned
from tests.support.serving import raw, serving

openai = pytest.importorskip("openai", reason="the OpenAI client is not installed: pip install -e '.[serve]'")


@pytest.fixture(scope="module")
def server(tiny_run):
    with serving(tiny_run) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return load_run(tiny_run)


def reference(loaded, prompt, **settings):
    """minitf.generate's texts and token counts for the same request."""
    model, tok, cfg = loaded
    stop, n = settings.pop("stop", None), settings.pop("num_samples", 1)
    info = {}
    texts = minitf.generate(model, tok, prompt, cfg.sample, stop=stop, num_samples=n, info=info, **settings)
    return ([texts] if n == 1 else texts), info["tokens"]


def test_models_lists_the_run(client, tiny_run):
    models = client.models.list().data
    assert [m.id for m in models] == [tiny_run.name] and models[0].owned_by == "minitf"
    assert client.models.retrieve(tiny_run.name).id == tiny_run.name


def test_completion_equals_generate(client, loaded, tiny_run):
    settings = dict(max_new_tokens=20, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    r = client.completions.create(
        model=tiny_run.name,
        prompt="ROMEO:\n",
        max_tokens=20,
        temperature=0.9,
        top_p=0.95,
        seed=7,
        extra_body={"top_k": 40},
    )
    (text,), (tokens,) = reference(loaded, "ROMEO:\n", **settings)
    assert r.choices[0].text == text and r.model == tiny_run.name and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(loaded[1].encode("ROMEO:\n"))
    assert r.usage.completion_tokens == tokens and r.usage.total_tokens == r.usage.prompt_tokens + tokens
    assert r.choices[0].finish_reason == ("length" if tokens == 20 else "stop")
    echoed = client.completions.create(
        model=tiny_run.name,
        prompt="ROMEO:\n",
        max_tokens=20,
        temperature=0.9,
        top_p=0.95,
        seed=7,
        echo=True,
        extra_body={"top_k": 40},
    )
    assert echoed.choices[0].text == "ROMEO:\n" + text and echoed.usage == r.usage

    # two prompts x n=2: four choices, prompt by prompt, each prompt's pair as generate(num_samples=2) gives it
    prompts = ["JULIET:\n", ""]
    r = client.completions.create(model=tiny_run.name, prompt=prompts, n=2, max_tokens=12, seed=3, temperature=1.0)
    want, counts = [], 0
    for p in prompts:
        texts, tokens = reference(loaded, p, max_new_tokens=12, seed=3, temperature=1.0, num_samples=2)
        want, counts = want + texts, counts + sum(tokens)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and [c.text for c in r.choices] == want
    assert r.choices[0].text != r.choices[1].text  # n=2 samples twice, not one text copied
    assert r.usage.completion_tokens == counts
    assert r.usage.prompt_tokens == len(loaded[1].encode("JULIET:\n")) + 1  # "" starts from <|endoftext|>


def test_stream_joins_to_the_same_text(client, tiny_run):
    ask = dict(model=tiny_run.name, prompt="O love", n=2, max_tokens=25, seed=11, stop=["\n\n", "!"], logprobs=2)
    whole = client.completions.create(**ask)
    texts, finish, usage, tokens, logprobs = ["", ""], [None, None], None, [[], []], [[], []]
    for chunk in client.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        assert chunk.id.startswith("cmpl-") and chunk.model == tiny_run.name
        for c in chunk.choices:
            texts[c.index] += c.text
            finish[c.index] = c.finish_reason or finish[c.index]
            tokens[c.index] += c.logprobs.tokens
            logprobs[c.index] += c.logprobs.token_logprobs
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices] and finish == [c.finish_reason for c in whole.choices]
    assert tokens == [c.logprobs.tokens for c in whole.choices]
    assert logprobs == [c.logprobs.token_logprobs for c in whole.choices]
    assert usage == whole.usage


def test_stop_cuts_the_text(client, loaded, tiny_run):
    ask = dict(model=tiny_run.name, prompt="NURSE:\n", max_tokens=40, seed=5, temperature=0.8)
    full = client.completions.create(**ask).choices[0].text
    assert len(full) > 12
    stop = full[8:11]  # a string the text is known to contain
    r = client.completions.create(**ask, stop=[stop, "never in this text \x00"])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
    assert (
        r.choices[0].text == reference(loaded, "NURSE:\n", max_new_tokens=40, seed=5, temperature=0.8, stop=stop)[0][0]
    )


def test_seed_reproducibility(client, tiny_run):
    def text(seed):
        return client.completions.create(model=tiny_run.name, prompt="O", max_tokens=15, seed=seed).choices[0].text

    assert text(42) == text(42)
    assert len({text(s) for s in range(4)}) > 1


def test_logprobs_are_the_models(client, loaded, tiny_run):
    """Each token's logprob is log_softmax of the model's logits under the sampler's settings
    (temperature, then top_k), computed here from one plain forward pass over the whole text."""
    model, tok, cfg = loaded
    prompt, n, temperature, top_k = "ROMEO:\nO", 12, 0.7, 20
    r = client.completions.create(
        model=tiny_run.name,
        prompt=prompt,
        max_tokens=n,
        seed=9,
        temperature=temperature,
        logprobs=3,
        extra_body={"top_k": top_k},
    )
    lp = r.choices[0].logprobs
    ids = tok.encode(prompt)
    settings = sample_settings(cfg.sample, max_new_tokens=n, temperature=temperature, top_k=top_k, seed=9)
    new = [int(t) for t in generate_tokens(model, ids, settings)]  # the sampler's own draws
    assert tok.eot_id not in new  # every token has its logprob entry
    assert len(ids) + n <= cfg.model.block_size  # one window: the plain forward pass sees what the sampler saw
    with torch.no_grad():
        logits = model(torch.tensor([ids + new]))[0][0, len(ids) - 1 : -1]  # (n, V): the logits of each new token
    scaled = logits / temperature
    kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # (n, 1)
    want = scaled.masked_fill(scaled < kth, float("-inf")).log_softmax(dim=-1)  # (n, V)
    assert lp.tokens == [tok.decode([i]) for i in new]
    assert lp.token_logprobs == pytest.approx([float(want[k, i]) for k, i in enumerate(new)], abs=1e-4)
    for k, top in enumerate(lp.top_logprobs):
        best = want[k].topk(3)
        assert sorted(top.values(), reverse=True)[:3] == pytest.approx(best.values.tolist(), abs=1e-4)
        assert {tok.decode([j]) for j in best.indices.tolist()} <= set(top)
    if "".join(lp.tokens) == r.choices[0].text:  # every token whole characters: offsets are the running lengths
        assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(n)]


def test_bad_requests_raise_the_clients_exceptions(client, tiny_run):
    name = tiny_run.name
    cases = [
        (dict(max_tokens=0), "max_tokens", None),
        (dict(temperature=5), "temperature", None),
        (dict(n=100), "n", None),
        (dict(stop=[str(i) for i in range(MAX_STOPS + 1)]), "stop", None),
        (dict(extra_body={"frequency": 1}), "frequency", None),
        (dict(presence_penalty=0.5), "presence_penalty", None),
        (dict(prompt="O love " * 40), "prompt", "context_length_exceeded"),
        (dict(prompt=[1, 2, 10**6]), "prompt", None),  # an id past the vocabulary
        (dict(prompt=[[1, 2], []]), "prompt", None),
        (dict(seed=-1), "seed", None),
    ]
    for extra, param, code in cases:
        ask = {"model": name, "prompt": "O", **extra}
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(**ask)
        assert e.value.status_code == 400 and e.value.param == param and e.value.code == code, extra
        assert e.value.type == "invalid_request_error" and "\n" not in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="O")
    assert e.value.code == "model_not_found" and name in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    assert "not a chat model" in e.value.message and "v1/completions" in e.value.message
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=name, prompt="O" * (2 << 20))  # a body past the server's 1 MiB
    assert e.value.status_code == 413


def test_errors_have_openais_shape(server):
    cases = [
        ("GET", "/v1/nothing", b"", None, 404),
        ("POST", "/v1/nothing", b"{}", None, 404),
        ("GET", "/v1/completions", b"", None, 405),
        ("DELETE", "/v1/models", b"", None, 405),
        ("POST", "/v1/completions", b"{not json", None, 400),
        ("POST", "/v1/completions", b"[1, 2]", None, 400),
        ("POST", "/v1/completions", b'{"model": "x", "prompt": "O"}', {"Content-Type": "text/plain"}, 400),
        ("POST", "/v1/completions", b"[" * 100000 + b"]" * 100000, None, 400),  # deep nesting
        ("POST", "/v1/completions", b'{"model": "tiny", "max_tokens": 1e400}', None, 400),
        ("GET", "/v1/models", b"", {"Host": "attacker.example"}, 403),  # DNS rebinding
        ("GET", "/v1/models", b"", {"Host": "[::1"}, 400),
        ("GET", "/v1/models", b"", {"Host": "127.0.0.1:notaport"}, 400),
    ]
    for method, path, body, headers, status in cases:
        got, payload = raw(server, method, path, body, headers)
        assert got == status, (method, path, body[:30], payload)
        assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
        assert payload["error"]["message"] and "\n" not in payload["error"]["message"]
    # a Content-Length past the bound is answered before the body is sent
    with socket.create_connection(server.server_address, timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 9999999\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 413 ")


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 1e-300),  # 0 in float32: logits / 0 = inf, then nan; was 200 with null logprobs
        ("repetition_penalty", 1e300),
        ("repetition_penalty", 1e-31),
        ("top_k", 10**30),
    ],
)
def test_sampling_settings_that_would_make_nan_are_a_400(server, field, value):
    body = {"model": server.api.name, "prompt": "O", "max_tokens": 3, "logprobs": 2, field: value}
    status, payload = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 400, payload
    error = payload["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    assert error["message"].startswith(field) and "\n" not in error["message"], error
    assert ("[1e-30, 1e30]" in error["message"]) != (field == "top_k"), error  # the range that is allowed


@pytest.mark.parametrize("temperature", [1e-300, 1e-45])
def test_a_tiny_temperature_is_greedy_with_finite_logprobs(server, temperature):
    """Below float32's smallest number a temperature divides as that number: the likeliest token."""
    body = {"model": server.api.name, "prompt": "O", "max_tokens": 3, "logprobs": 2, "seed": 0}
    status, greedy = raw(server, "POST", "/v1/completions", json.dumps({**body, "temperature": 0}).encode())
    status, payload = raw(server, "POST", "/v1/completions", json.dumps({**body, "temperature": temperature}).encode())
    assert status == 200, payload
    assert payload["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert all(math.isfinite(lp) for lp in payload["choices"][0]["logprobs"]["token_logprobs"])


def test_a_content_length_of_other_digits_is_a_400_and_the_server_goes_on(tiny_run):
    """Headers are read as latin-1, where byte 0xb2 is '²': a digit to str.isdigit() but not to
    int(), which stopped the server. The request is refused, and the server answers the next one."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: "
    with serving(tiny_run) as server:
        for length in (b"\xb2", b"1\xb9\xb3", "²".encode(), b"1 2", b"-1", b"0x10"):
            with socket.create_connection(server.server_address, timeout=30) as s:
                s.sendall(head + length + b"\r\n\r\n")
                assert s.recv(100).startswith(b"HTTP/1.1 400 "), length
        status, models = raw(server, "GET", "/v1/models")
        assert status == 200 and models["data"][0]["id"] == server.api.name


def test_a_tiny_top_p_keeps_the_likeliest_token_with_finite_logprobs(server):
    body = {"model": server.api.name, "prompt": "O", "max_tokens": 3, "logprobs": 2, "top_p": 1e-300, "seed": 0}
    status, payload = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, payload
    logprobs = payload["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"] and all(lp == 0.0 for lp in logprobs["token_logprobs"])  # each drawn surely


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"model": "tiny", "prompt": "O", "max_tokens": 1e400}', r"a number too large for JSON \(1e400\)"),
        (b'{"model": "tiny", "prompt": "O", "temperature": NaN}', "holds NaN, which is not a number JSON allows"),
        (b'{"model": "tiny", "prompt": "\\ud800"}', r"a lone surrogate '\\ud800', which is not text"),
        (b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"model": "tiny", "prompt": "O"', "We could not parse the JSON body of your request: it is not valid JSON"),
    ],
    ids=["1e400", "nan", "surrogate", "deep", "cut"],
)
def test_json_that_is_not_jsons_is_a_400_naming_why(server, body, message):
    status, payload = raw(server, "POST", "/v1/completions", body)
    assert status == 400 and re.search(message, payload["error"]["message"]), payload
    assert payload["error"]["type"] == "invalid_request_error" and "\n" not in payload["error"]["message"]


def test_slow_clients_neither_block_nor_stay(tiny_run):
    """20 connections that send half a request each: a normal request is answered while they
    are open (they hold no thread: one event loop reads every connection), and each is answered 408
    and closed at its deadline."""
    limits = Limits(timeout=3.0)
    with serving(tiny_run, limits) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        client.models.list()  # the client's own threads, and the server's, start here
        client.completions.create(model=tiny_run.name, prompt="O", max_tokens=3, seed=0)
        threads, slow = threading.active_count(), []
        for _ in range(20):
            s = socket.create_connection(server.server_address, timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            slow.append(s)
        r = client.completions.create(model=tiny_run.name, prompt="O", max_tokens=3, seed=0)
        assert r.choices[0].finish_reason in ("length", "stop")
        assert threading.active_count() == threads  # 20 open connections, not one thread more
        answered = len(server.logs)
        for s in slow:  # the server ends each with a 408 and closes it: read to end of file
            got = b"".join(iter(lambda s=s: s.recv(4096), b""))
            assert got.startswith(b"HTTP/1.1 408 "), got[:80]
            s.close()
        closed = [i for i, line in enumerate(server.logs) if "no complete request within 3 s" in line]
        assert len(closed) == 20 and answered <= min(closed)  # answered before any slow one was dropped


def hold_at(step):
    """on_token and on_finish hooks that hold each completion at its `step`-th token until
    .go is set, and record how every completion ended in .finished."""
    hooks = type("Hooks", (), {})()
    hooks.reached, hooks.go, hooks.done, hooks.finished = threading.Event(), threading.Event(), threading.Event(), []

    def on_token(cid, count):
        if count == step:
            hooks.reached.set()
            assert hooks.go.wait(30)

    def on_finish(summary):
        hooks.finished.append(summary)
        hooks.done.set()

    hooks.on_token, hooks.on_finish = on_token, on_finish
    return hooks


@pytest.mark.parametrize("stream", [True, False])
def test_a_closed_connection_stops_its_completion(tiny_run, loaded, stream):
    model, tok, cfg = loaded
    n = 50
    assert reference(loaded, "ROMEO:\n", max_new_tokens=n, temperature=0)[1] == [n]  # greedy runs all 50 tokens
    hooks = hold_at(3)
    with serving(tiny_run, on_token=hooks.on_token, on_finish=hooks.on_finish) as server:
        body = json.dumps(
            {"model": tiny_run.name, "prompt": "ROMEO:\n", "max_tokens": n, "temperature": 0, "stream": stream}
        )
        s = socket.create_connection(server.server_address, timeout=30)
        s.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        if stream:
            got = b""
            while b"data: " not in got:
                got += s.recv(4096)
        assert hooks.reached.wait(30)
        s.close()  # the client goes away mid-generation
        hooks.go.set()
        assert hooks.done.wait(30)
    (summary,) = hooks.finished
    assert summary["reason"] == "cancelled" and 3 <= summary["tokens"] < n


def test_busy_server_answers_503(tiny_run):
    hooks = hold_at(1)
    with serving(tiny_run, max_generations=1, wait=0, on_token=hooks.on_token, on_finish=hooks.on_finish) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        first = threading.Thread(
            target=lambda: client.completions.create(model=tiny_run.name, prompt="O", max_tokens=2, seed=0)
        )
        first.start()
        assert hooks.reached.wait(30)  # the only slot is taken
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=tiny_run.name, prompt="O", max_tokens=2)
        assert e.value.status_code == 503 and e.value.code == "busy"
        hooks.go.set()
        first.join(30)
    assert [f["reason"] for f in hooks.finished] == ["done"]


def test_command_line_mistakes_are_one_line(tiny_run, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        cases = [
            (["--run", str(tmp_path / "nope")], "does not exist"),
            (["--run", str(tiny_run), "--port", "99999"], "--port 99999 is out of range; use 1..65535"),
            (["--run", str(tiny_run), "--port", "-1"], "--port -1 is out of range; use 1..65535"),
            (["--run", str(tiny_run), "--port", str(port)], f"cannot serve on 127.0.0.1:{port}"),
        ]
        for args, words in cases:
            r = command("serve", *args)
            assert r.returncode == 2 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
            assert r.stderr.count("\n") == 1


def test_command_serves_on_a_free_port(tiny_run):
    p = spawned("scripts/serve.py", "--run", str(tiny_run), "--port", "0")
    try:
        line = p.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/v1", line).group(0)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        assert client.completions.create(model=tiny_run.name, prompt="O", max_tokens=2).usage.completion_tokens >= 1
        p.send_signal(2)  # Ctrl-C
        assert p.wait(30) == 0
    finally:
        p.kill()
        p.wait()


def test_a_request_is_answered_however_it_arrives(server):
    """A request that arrives a byte at a time is answered (bare LF line ends too), and a head past
    the bound (32 KiB) is refused with 400 before it ends."""
    for request in (
        b"POST /v1/tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /v1/models HTTP/1.1\nHost: 127.0.0.1\nConnection: close\n\n",
    ):
        with socket.create_connection(server.server_address, timeout=30) as s:
            for b in request:
                s.sendall(bytes([b]))
            assert re.match(rb"HTTP/1.1 (200|400|404) ", s.recv(100)), request
    with socket.create_connection(server.server_address, timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * (40 << 10))
        assert s.recv(100).startswith(b"HTTP/1.1 400 ")
    assert raw(server, "GET", "/v1/models")[0] == 200


def test_api_key(tiny_run):
    with serving(tiny_run, api_key="s3cret") as server:
        right = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        assert right.completions.create(model=tiny_run.name, prompt="O", max_tokens=2).usage.completion_tokens >= 1
        wrong = openai.OpenAI(base_url=server.url, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.models.list()
        assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


@pytest.mark.parametrize("timeout", ["inf", "nan", "0", "1e9"])
def test_a_timeout_that_cannot_work_is_refused_at_start(tiny_run, timeout):
    """--timeout inf was accepted, and the first connection then stopped the server."""
    r = command("serve", "--run", tiny_run, "--port", "0", "--timeout", timeout)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --timeout must be a number of seconds above 0, at most 86400, got ")
    assert r.stderr.count("\n") == 1
