"""Scoring's edges (echo with logprobs): a one-token prompt is scored (no 500) and its stream ends
with [DONE]; multi-byte text gives tokens that join back into the text with offsets inside it; the
work one request may ask for is bounded (the bound named in the error); scoring stops between
windows when its client leaves or the server stops; and the tokenizer routes wait for a slot as
generation does."""

import http.client
import itertools
import json

import pytest

from minitf.web.serve.engine import Cancelled
from minitf.web.serve.request import SCORED_CONTEXTS
from tests.support.serving import raw, serving

pytest.importorskip("openai", reason="the OpenAI client is not installed: pip install -e '.[serve]'")

MULTIBYTE = "héllo 日本 ✓ ï"  # within the tiny run's 32-token context


@pytest.fixture(scope="module")
def server(tiny_run):
    with serving(tiny_run) as s:
        yield s


def score(server, prompt, **more):
    body = {"model": server.api.name, "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 0, **more}
    return raw(server, "POST", "/v1/completions", json.dumps(body).encode())


def one_token_text(tok) -> str:
    """A text that is a single token of the run's tokenizer."""
    return next(t for i in range(tok.vocab_size) if len(tok.encode(t := tok.decode([i]))) == 1 and t.strip())


def test_a_one_token_prompt_is_scored(server):
    """ "", [0] and a one-token text have one entry each, null (nothing predicts a first token); one
    such prompt in a batch leaves the others' entries as they are alone."""
    tok = server.api.tok
    for prompt in ("", [0], one_token_text(tok)):
        status, got = score(server, prompt)
        assert status == 200, got
        lp = got["choices"][0]["logprobs"]
        assert lp["token_logprobs"] == [None] and lp["text_offset"] == [0] and len(lp["tokens"]) == 1
    status, both = score(server, ["a", "hello there"])
    assert status == 200, both
    alone = score(server, "hello there")[1]["choices"][0]["logprobs"]
    assert both["choices"][1]["logprobs"]["token_logprobs"] == alone["token_logprobs"]
    assert both["choices"][0]["logprobs"]["token_logprobs"][0] is None


def test_a_one_token_prompt_streamed_ends_with_done(server):
    body = {"model": server.api.name, "prompt": "", "echo": True, "logprobs": 1, "max_tokens": 2, "stream": True}
    conn = http.client.HTTPConnection(*server.server_address, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    events = [e.removeprefix("data: ") for e in r.read().decode().split("\n\n") if e]
    assert r.status == 200 and events[-1] == "[DONE]"
    assert not any("error" in json.loads(e) for e in events[:-1]), events


@pytest.mark.parametrize("as_ids", [False, True])
def test_echo_tokens_join_into_multibyte_text(server, as_ids):
    """Each token carries the characters its bytes complete (a token ending inside a character has
    ""): the tokens join into the text, each offset is the character its token begins in (inside the
    text), and each scored token's own entry is in its top_logprobs under the same text."""
    tok = server.api.tok
    ids = tok.encode(MULTIBYTE)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some of its tokens end inside a character
    status, got = score(server, ids if as_ids else MULTIBYTE, logprobs=3)
    assert status == 200, got
    choice = got["choices"][0]
    lp, text = choice["logprobs"], choice["text"]
    assert text == MULTIBYTE and "".join(lp["tokens"]) == text and len(lp["tokens"]) == len(ids)
    assert lp["text_offset"] == list(itertools.accumulate(map(len, lp["tokens"][:-1]), initial=0))
    assert all(0 <= o < len(text) for o in lp["text_offset"])
    for token, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:]):
        assert token in top


def test_the_scoring_work_of_a_request_is_bounded(server):
    """Past SCORED_CONTEXTS x block_size prompt tokens, echo with logprobs is a 400 that names the
    bound; the same prompt without logprobs (nothing to score) is completed."""
    block = server.api.block
    ids = [5] * (SCORED_CONTEXTS * block + 1)
    status, got = score(server, ids)
    assert status == 400 and got["error"]["param"] == "prompt", got
    assert f"at most {SCORED_CONTEXTS * block} prompt tokens" in got["error"]["message"]
    status, got = score(server, [[5] * (SCORED_CONTEXTS * block // 2)] * 2)  # the bound is the request's, at the limit
    assert status == 200, got
    status, got = score(server, [[5] * (SCORED_CONTEXTS * block // 2 + 1)] * 2)
    assert status == 400 and str(SCORED_CONTEXTS * block) in got["error"]["message"]
    body = {"model": server.api.name, "prompt": ids, "echo": True, "max_tokens": 1}
    assert raw(server, "POST", "/v1/completions", json.dumps(body).encode())[0] == 200


def test_scoring_stops_between_windows_when_cancelled(server):
    """A long prompt is scored in several forward passes; cancelled() (a client that left, a server
    that stops) is asked before each, so one pass is the most that runs after it turns true."""
    engine, block = server.api.engine, server.api.block
    ids = [5] * (4 * block)
    passes = []
    hook = engine.model.register_forward_hook(lambda *a: passes.append(1))
    try:
        with pytest.raises(Cancelled):
            engine._prompt_logprobs(ids, 1, "cmpl-x", lambda: len(passes) >= 1)
        assert len(passes) == 1
        passes.clear()
        engine._prompt_logprobs(ids, 1, "cmpl-x", lambda: False)
        assert len(passes) > 2  # uncancelled, the same prompt takes several windows
    finally:
        hook.remove()


@pytest.mark.parametrize("path, body", [("/tokenize", {"prompt": "hello"}), ("/detokenize", {"tokens": [5, 6]})])
def test_the_tokenizer_routes_wait_for_a_slot(tiny_run, path, body):
    """With every generation slot taken, /tokenize and /detokenize wait and then answer 503 busy,
    as a completion does; once a slot is free they answer."""
    with serving(tiny_run, max_generations=1, wait=0.3) as server:
        slots = server.api.engine.slots
        assert slots.acquire(timeout=5)
        try:
            status, got = raw(server, "POST", path, json.dumps(body).encode())
            assert status == 503 and got["error"]["code"] == "busy", got
        finally:
            slots.release()
        assert raw(server, "POST", path, json.dumps(body).encode())[0] == 200
