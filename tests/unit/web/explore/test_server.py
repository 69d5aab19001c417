"""minitf.web.explore.server's routes, in process: the FastAPI app over one Explorer, called
through Starlette's TestClient (no socket, no thread serving): each route answers what the
Explorer computes, and every error is {"error": "one line"} with its status."""

import json
import threading
from importlib import resources

import pytest
from fastapi.testclient import TestClient

import minitf
from minitf.web.explore import STATIC
from minitf.web.explore.api import Explorer
from minitf.web.explore.server import explorer_app
from minitf.web.stack import Limits


@pytest.fixture(scope="module")
def explorer(tiny_run):
    return Explorer(tiny_run)


@pytest.fixture(scope="module")
def client(explorer):
    logs = []
    client = TestClient(explorer_app(explorer, Limits(), threading.Event(), logs.append))
    client.logs = logs
    return client


def test_run_and_metrics_are_the_explorers_own(client, explorer):
    r = client.get("/api/run")
    assert r.status_code == 200 and r.json() == json.loads(json.dumps(explorer.run_info()))
    r = client.get("/api/metrics")
    assert r.status_code == 200 and r.json() == json.loads(json.dumps(explorer.loss_curve()))


def test_every_static_path_serves_its_file(client):
    for path, (name, kind) in STATIC.items():
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind.split(";")[0])
        assert r.headers["cache-control"] == "no-store"
        assert r.content == resources.files("minitf.web.explore").joinpath("static", name).read_bytes()


def test_generate_streams_the_tokens_of_minitf_generate(client, tiny_run):
    body = {"prompt": "ROMEO:", "max_new_tokens": 12, "seed": 5, "temperature": 1.0, "top_k": None}
    r = client.post("/api/generate", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in r.text.splitlines()]
    model, tok, _ = minitf.load_run(tiny_run)
    assert [t["id"] for t in events[0]["prompt"]] == tok.encode("ROMEO:")
    tokens = [e["token"] for e in events[1:-1]]
    text = minitf.generate(model, tok, "ROMEO:", max_new_tokens=12, seed=5, temperature=1.0, top_k=None)
    assert "".join(t["text"] for t in tokens) == text
    assert events[-1] == {"done": "eot" if tokens[-1]["id"] == tok.eot_id else "length"}


def test_a_view_answers_what_the_explorer_computes(client, explorer):
    ids = explorer.tok.encode("ROMEO: O love")
    body = {"ids": ids, "position": len(ids) - 1}
    r = client.post("/api/lens", json=body)
    assert r.status_code == 200 and r.json() == json.loads(json.dumps(explorer.lens(body)))


@pytest.mark.parametrize(
    "method, path, body, status, error",
    [
        ("GET", "/nowhere", None, 404, "no page '/nowhere' here"),
        ("POST", "/api/nowhere", b"{}", 404, "no endpoint '/api/nowhere' here"),
        ("GET", "/api/generate", None, 405, "GET is not allowed on /api/generate"),
        ("POST", "/api/lens", b"[1, 2]", 400, "the request body must be a JSON object"),
        (
            "POST",
            "/api/lens",
            b'{"ids": [1], "position": NaN}',
            400,
            "the request body holds NaN, which is not a number JSON allows; send a finite number",
        ),
        ("POST", "/api/generate", b"{", 400, "the request body is not valid JSON"),
    ],
)
def test_errors_are_one_line_with_their_status(client, method, path, body, status, error):
    r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and r.json() == {"error": error}


def test_a_body_not_sent_as_json_is_named(client):
    r = client.post("/api/lens", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    assert r.json() == {"error": "send the request as JSON (Content-Type: application/json)"}
