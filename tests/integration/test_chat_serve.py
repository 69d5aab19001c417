"""/v1/chat/completions over a chat run, spoken to by the official `openai` client: its answers are
minitf.chat's for a seed (streamed or not, n of them), they end at the end of the turn, its
logprobs are the model's own in OpenAI's chat shape, and a bad conversation is a one-line 400."""

import json

import pytest
import torch

from minitf.conversations.answer import chat
from minitf.generate import generate_tokens, sample_settings
from minitf.run_dir import load_run
from tests.support.serving import raw, serving

openai = pytest.importorskip("openai", reason="the OpenAI client is not installed: pip install -e '.[serve]'")

QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture(scope="module")
def server(chat_run):
    """The chat run served, with an openai client on it (.client) and the run loaded here (.loaded)."""
    with serving(chat_run) as s:
        s.client, s.loaded = openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0), load_run(chat_run)
        yield s


@pytest.fixture
def client(server):
    return server.client


@pytest.fixture
def loaded(server):
    return server.loaded


def as_json(body: dict) -> bytes:
    return json.dumps(body).encode()


def answers(loaded, messages, n=1, **settings):
    """minitf.chat's answers (a list of n) under the run's own sampling settings, as the server samples."""
    model, tok, cfg = loaded
    out = chat(model, tok, messages, cfg.sample, num_samples=n, **settings)
    return [out] if n == 1 else out


def test_the_openai_client_gets_minitf_chats_answer(client, loaded, chat_run):
    ask = dict(model=chat_run.name, messages=QUESTION, max_tokens=30, temperature=0.9, top_p=0.95, seed=7)
    r = client.chat.completions.create(**ask)
    (want,) = answers(loaded, QUESTION, max_new_tokens=30, temperature=0.9, top_p=0.95, seed=7)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == chat_run.name
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(loaded[1].chat_template.prompt_ids(loaded[1], QUESTION))

    pieces, finish, roles = [], None, []
    for chunk in client.chat.completions.create(**ask, stream=True):
        assert chunk.object == "chat.completion.chunk" and len(chunk.choices) == 1
        roles += [chunk.choices[0].delta.role] if chunk.choices[0].delta.role else []
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == want and finish == r.choices[0].finish_reason and roles == ["assistant"]


def test_an_answer_stops_at_the_end_of_turn(client, loaded, chat_run):
    """For a seed whose draws hold <|im_end|>, the answer is the tokens before it: finish_reason
    "stop", one completion token more than the answer's (the end of turn counts), no <|im_end|>
    in the text; cut by max_tokens, "length"."""
    model, tok, cfg = loaded
    ids, end = tok.chat_template.prompt_ids(tok, QUESTION), tok.chat_template.end_of_turn(tok)
    ask = dict(max_new_tokens=60, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    draws = {
        s: [int(t) for t in generate_tokens(model, ids, sample_settings(cfg.sample, seed=s, **ask))] for s in range(20)
    }
    seed = next(s for s, new in draws.items() if end in new[1:])  # the chat run ends its turn, for some seeds
    answer = draws[seed][: draws[seed].index(end)]
    r = client.chat.completions.create(
        model=chat_run.name, messages=QUESTION, max_tokens=60, temperature=1.0, top_p=1.0, seed=seed,
        extra_body={"top_k": 0, "repetition_penalty": 1.0},
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.message.content == tok.decode(answer) and "<|im_end|>" not in choice.message.content
    assert choice.finish_reason == "stop" and r.usage.completion_tokens == len(answer) + 1
    cut = client.chat.completions.create(model=chat_run.name, messages=QUESTION, max_tokens=1, seed=seed)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 1


def test_n_answers_are_chats_num_samples(client, loaded, chat_run):
    messages = [{"role": "system", "content": "Answer briefly."}, *QUESTION]
    r = client.chat.completions.create(
        model=chat_run.name, messages=messages, n=3, max_completion_tokens=20, seed=3, temperature=1.0
    )
    want = answers(loaded, messages, n=3, max_new_tokens=20, seed=3, temperature=1.0)
    assert [c.index for c in r.choices] == [0, 1, 2] and [c.message.content for c in r.choices] == want
    assert len(set(want)) > 1  # three samples, not one answer copied

    texts = ["", "", ""]
    for chunk in client.chat.completions.create(
        model=chat_run.name, messages=messages, n=3, max_tokens=20, seed=3, temperature=1.0, stream=True
    ):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == want


def test_logprobs_are_the_models_in_chats_shape(client, loaded, chat_run):
    """Each entry's logprob is log_softmax of the model's logits at the temperature, from one plain
    forward pass over the templated conversation and the answer; top_logprobs the 3 likeliest."""
    model, tok, cfg = loaded
    n, temperature = 10, 0.8
    r = client.chat.completions.create(
        model=chat_run.name, messages=QUESTION, max_tokens=n, seed=9, temperature=temperature, top_p=1.0,
        logprobs=True, top_logprobs=3, extra_body={"top_k": 0, "repetition_penalty": 1.0},
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    ids = tok.chat_template.prompt_ids(tok, QUESTION)
    settings = sample_settings(
        cfg.sample, max_new_tokens=n, temperature=temperature, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=9
    )
    end = tok.chat_template.end_of_turn(tok)
    new = [int(t) for t in generate_tokens(model, ids, settings)]  # the sampler's own draws
    new = new[: new.index(end)] if end in new else new  # the end of turn has no entry
    with torch.no_grad():
        logits = model(torch.tensor([ids + new]))[0][0, len(ids) - 1 : len(ids) - 1 + len(new)]  # (len(new), V)
    want = (logits / temperature).log_softmax(dim=-1)  # (len(new), V)
    assert [e.token for e in content] == [tok.decode([i]) for i in new]
    assert [e.logprob for e in content] == pytest.approx([float(want[k, i]) for k, i in enumerate(new)], abs=1e-4)
    for k, e in enumerate(content):
        assert e.bytes == list(e.token.encode("utf-8"))
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(want[k].topk(3).values.tolist(), abs=1e-4)
        assert [t.token for t in e.top_logprobs][0] == tok.decode([int(want[k].argmax())])
    if "\ufffd" not in r.choices[0].message.content:  # every token whole characters: they join to the answer
        assert "".join(e.token for e in content) == r.choices[0].message.content


@pytest.mark.parametrize(
    "messages, words",
    [
        ([], "non-empty list"),
        ([{"role": "assistant", "content": "hi"}], "must be the user's"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "must be the user's"),
        ([{"role": "robot", "content": "x"}, {"role": "user", "content": "hi"}], "unknown role 'robot'"),
        ([{"role": "user", "content": "   "}], "is empty"),
        ([{"role": "user"}], "no text content"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "out of order"),
        ([{"role": "system", "content": "s"}, {"role": "system", "content": "s"}, QUESTION[0]], "out of order"),
        ([{"role": "user", "content": "go " * 400}], "context length"),
    ],
)
def test_bad_messages_are_one_line_400s(server, chat_run, messages, words):
    status, body = raw(server, "POST", "/v1/chat/completions", as_json({"model": chat_run.name, "messages": messages}))
    error = body["error"]
    assert (
        status == 400
        and error["param"] == "messages"
        and words in error["message"].replace("maximum context", "context")
    )
    assert "\n" not in error["message"] and "skip_invalid" not in error["message"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"temperature": 5}, "temperature"),
        ({"n": 100}, "n"),
        ({"prompt": "x"}, "prompt"),
        ({"stop": 3}, "stop"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(server, chat_run, fields, param):
    body = {"model": chat_run.name, "messages": QUESTION, **fields}
    status, answer = raw(server, "POST", "/v1/chat/completions", as_json(body))
    assert status == 400 and answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"


def test_a_base_run_is_not_a_chat_model(tiny_run, chat_run):
    with serving(tiny_run) as base:
        client = openai.OpenAI(base_url=base.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model=tiny_run.name, messages=QUESTION, seed=0)
        assert "not a chat model" in e.value.message
        with pytest.raises(openai.NotFoundError) as e:  # the model's name is checked first, as before
            client.chat.completions.create(model=chat_run.name, messages=QUESTION)
        assert e.value.code == "model_not_found"
