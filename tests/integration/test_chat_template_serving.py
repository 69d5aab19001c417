"""A slow chat template where it is rendered for someone: the server and `minitf chat`. The server
answers its other routes while a render runs (it runs in a worker process: a big multiplication in
the template once held the interpreter's lock for minutes); a client that leaves, or a server that
stops, ends the render; one SIGTERM stops `minitf serve` mid-render; `minitf chat` says the bound
in one line."""

import http.client
import json
import signal
import threading
import time

import pytest

from minitf.chat_template import CHATML, TEMPLATE_FILE
from minitf.conversations import bounded
from minitf.conversations.answer import chat
from minitf.run_dir import load_run
from minitf.web.explore import Explorer, ExploreServer
from minitf.web.serve import Completions, CompletionServer
from tests.support.processes import child_pids, command, pid_exists, spawned
from tests.support.runs import copy_run
from tests.support.serving import raw, running, serving

SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# squaring a number of 4,096 bits, then its square, ...: each one operation in C, longer and longer
SQUARES = "{% set ns = namespace(n=2 ** 4096) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}"
QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]


def with_template(run, tmp_path, work: str):
    """A copy of the chat run whose template is ChatML after `work`, done when the last message is 'spin'."""
    copy = copy_run(run, tmp_path / run.name)
    (copy / TEMPLATE_FILE).write_text("{% if messages[-1]['content'] == 'spin' %}" + work + "{% endif %}" + CHATML)
    return copy


def ask(name, content: str) -> bytes:
    return json.dumps({"model": name, "messages": [{"role": "user", "content": content}], "max_tokens": 3}).encode()


def started(template) -> int:
    """The pid of the template's worker once it has started (its first render is under way)."""
    for _ in range(3000):
        if template.renderer.pid is not None:
            return template.renderer.pid
        time.sleep(0.01)
    raise AssertionError("the template's worker never started")


def ended(template, pid: int) -> bool:
    for _ in range(3000):
        if template.renderer.pid is None and not pid_exists(pid):
            return True
        time.sleep(0.01)
    return False


def said(logs: list[str], words: str) -> bool:
    """Whether a log line holds words, once it comes (a server thread writes it)."""
    for _ in range(3000):
        if any(words in line for line in logs):
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def long_renders(monkeypatch):
    """Renders bounded at two minutes, not one second: what ends them here is the server."""
    monkeypatch.setattr(bounded, "RENDER_SECONDS", 120.0)
    monkeypatch.setattr(bounded, "WAIT_SECONDS", 600.0)


def test_models_answers_during_a_render_and_a_client_that_leaves_ends_it(chat_run, tmp_path, long_renders):
    run = with_template(chat_run, tmp_path, SPIN)
    with serving(run) as server:
        template = server.api.tok.chat_template
        client = http.client.HTTPConnection(*server.server_address, timeout=60)
        client.request("POST", "/v1/chat/completions", ask(run.name, "spin"), {"Content-Type": "application/json"})
        pid = started(template)
        status, body = raw(server, "GET", "/v1/models")
        assert status == 200 and body["data"][0]["id"] == run.name
        assert template.renderer.pid == pid  # the render still runs (its bound is two minutes)
        client.close()  # the client leaves: its render is ended
        assert ended(template, pid)
        status, body = raw(server, "POST", "/v1/chat/completions", ask(run.name, "What is 2 plus 3?"))
        assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"  # a fresh worker


def test_the_explorer_answers_during_a_render_and_a_page_that_closes_ends_it(chat_run, tmp_path, long_renders):
    run = with_template(chat_run, tmp_path, SPIN)
    logs = []
    with running(ExploreServer(Explorer(run), "127.0.0.1", 0, log=logs.append)) as server:
        template = server.explorer.tok.chat_template
        page = http.client.HTTPConnection(*server.server_address, timeout=60)
        turn = json.dumps({"messages": [{"role": "user", "content": "spin"}], "max_new_tokens": 3}).encode()
        page.request("POST", "/api/generate", turn, {"Content-Type": "application/json"})
        pid = started(template)
        status, body = raw(server, "GET", "/api/run")
        assert status == 200 and body["chat"] is True
        assert template.renderer.pid == pid  # the render still runs (its bound is two minutes)
        page.close()  # the tab closes: its render is ended
        assert ended(template, pid)
        assert said(logs, "cancelled, as the page closed"), logs  # the handler logs it after the worker ended
        ask = {"messages": QUESTION, "max_new_tokens": 3}
        conn = http.client.HTTPConnection(*server.server_address, timeout=60)
        conn.request("POST", "/api/generate", json.dumps(ask).encode(), {"Content-Type": "application/json"})
        events = [json.loads(line) for line in conn.getresponse().read().splitlines()]
        conn.close()
        assert "prompt" in events[0] and events[-1]["done"] in ("length", "stop"), events  # a fresh worker rendered it


def test_a_server_that_stops_ends_the_render_under_way(chat_run, tmp_path, long_renders):
    """close() is what SIGTERM does in a server's main thread: the render ends, the client is
    answered 503 and the server returns, long before the render's own bound."""
    run = with_template(chat_run, tmp_path, SPIN)
    server = CompletionServer(Completions(run), "127.0.0.1", 0, log=lambda line: None)
    serving_thread = threading.Thread(target=server.serve_forever, daemon=True)
    serving_thread.start()
    answer = {}

    def client():
        answer["status"], answer["body"] = raw(server, "POST", "/v1/chat/completions", ask(run.name, "spin"))

    asking = threading.Thread(target=client)
    asking.start()
    template = server.api.tok.chat_template
    pid = started(template)
    server.close()
    serving_thread.join(30)
    asking.join(30)
    assert not serving_thread.is_alive() and ended(template, pid)
    assert answer["status"] == 503 and "shutting down" in answer["body"]["error"]["message"], answer


def test_one_sigterm_stops_minitf_serve_mid_render(chat_run, tmp_path):
    """The template squares a huge number, one multiplication in C after another: rendered in the
    server's own process, it held the interpreter's lock, and the signal's handler never ran."""
    run = with_template(chat_run, tmp_path, SQUARES)
    p = spawned("-m", "minitf", "serve", "--run", str(run), "--port", "0", "--device", "cpu")
    try:
        host, port = p.stdout.readline().split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        conn.request("POST", "/v1/chat/completions", ask(run.name, "spin"), {"Content-Type": "application/json"})
        for _ in range(3000):  # the render's worker is under way
            if child_pids(p.pid):
                break
            time.sleep(0.01)
        assert child_pids(p.pid), "the render never started a worker"
        p.send_signal(signal.SIGTERM)
        start = time.monotonic()
        out, err = p.communicate(timeout=60)
        assert time.monotonic() - start < 30  # before: never, while the multiplication held the lock
        assert p.returncode == 0 and "Traceback" not in err, err
    finally:
        p.kill()


def test_minitf_chat_says_the_bound_in_one_line_and_goes_on(chat_run, tmp_path):
    """The turn past the bound is one line and left out; the next question is answered as in a new
    conversation; the exit status says a turn failed."""
    run = with_template(chat_run, tmp_path, SPIN)
    question = QUESTION[0]["content"]
    r = command(
        "chat",
        "--run",
        str(run),
        "--device",
        "cpu",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        stdin=f"spin\n{question}\n",
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"error: the chat template from {run / TEMPLATE_FILE} ran past 1 s"), errors[0]
    model, tok, cfg = load_run(run)
    assert r.stdout == chat(model, tok, QUESTION, cfg.sample, max_new_tokens=8, temperature=0) + "\n"
