"""minitf.web.serve.server's routes, in process: the FastAPI app over one Completions, called
through Starlette's TestClient (no socket, no thread serving): completions equal minitf.generate's
text, streams join to it, the tokenizer routes are the run's tokenizer, and errors have OpenAI's shape."""

import json
import threading

import pytest
from fastapi.testclient import TestClient

import minitf
from minitf.web.serve import Completions
from minitf.web.serve.server import completions_app
from minitf.web.stack import Limits


@pytest.fixture(scope="module")
def api(tiny_run):
    return Completions(tiny_run)


@pytest.fixture(scope="module")
def client(api):
    return TestClient(completions_app(api, Limits(), threading.Event(), lambda *a: None))


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return minitf.load_run(tiny_run)


def test_models_name_the_run(client, api, tiny_run):
    assert client.get("/v1/models").json() == {"object": "list", "data": [api.model_card()]}
    assert api.model_card()["id"] == api.name and api.name == tiny_run.name
    assert client.get(f"/v1/models/{api.name}").json() == api.model_card()


def test_a_completion_is_minitfs_text(client, api, loaded):
    model, tok, _ = loaded
    body = {"model": api.name, "prompt": "ROMEO:", "max_tokens": 10, "temperature": 0, "seed": 0}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200
    answer = r.json()
    expected = minitf.generate(model, tok, "ROMEO:", max_new_tokens=10, temperature=0)
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == expected
    assert answer["usage"]["prompt_tokens"] == len(tok.encode("ROMEO:"))
    r = client.post("/v1/completions", json={**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    lines = [line[len("data: ") :] for line in r.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    assert "".join(json.loads(x)["choices"][0]["text"] for x in lines[:-1]) == expected


def test_tokenize_and_detokenize_are_the_runs_tokenizer(client, api, loaded):
    tok = loaded[1]
    ids = tok.encode("O gentle night")
    r = client.post("/tokenize", json={"prompt": "O gentle night"})
    assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": api.block}
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "O gentle night"}
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|endoftext|>" and info["vocab_size"] == tok.vocab_size


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("GET", "/v1/nowhere", None, 404, "Invalid URL (GET /v1/nowhere)"),
        ("GET", "/v1/completions", None, 405, "GET is not allowed on /v1/completions; POST a JSON request"),
        ("POST", "/v1/models", b"{}", 405, "POST is not allowed on /v1/models; GET it"),
        ("POST", "/tokenize", b"[1]", 400, "the request body must be a JSON object"),
        ("POST", "/tokenize", b"{", 400, "We could not parse the JSON body of your request: it is not valid JSON"),
        ("POST", "/tokenize", b'{"prompt": 3}', 400, "prompt must be a string, got int"),
    ],
)
def test_errors_have_openais_shape(client, method, path, body, status, message):
    r = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    error = r.json()["error"]
    assert error["message"] == message and set(error) >= {"message", "type", "code"}
