"""What a scoring client (lm-evaluation-harness's local-completions) asks of the server: prompts
as token ids, the prompt's own logprobs (echo with logprobs) equal to the model's log-softmax, and
the tokenizer routes at the server's root; a bad id is a 400 in OpenAI's shape."""

import json

import pytest
import torch

from minitf.run_dir import load_run
from tests.support.serving import raw, serving

pytest.importorskip("openai", reason="the OpenAI client is not installed: pip install -e '.[serve]'")


@pytest.fixture(scope="module")
def server(tiny_run):
    with serving(tiny_run) as s:
        yield s


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return load_run(tiny_run)


def post(server, path, body):
    return raw(server, "POST", path, json.dumps(body).encode())


def complete(server, **body):
    status, payload = post(server, "/v1/completions", {"model": server.api.name, **body})
    assert status == 200, payload
    return payload


def log_softmax(model, ids):
    """The model's own log-probabilities after each id, (T, V), in float32."""
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0].float().log_softmax(dim=-1)  # (T, V)


def test_token_id_prompts_complete_as_their_text(server, loaded):
    _, tok, _ = loaded
    ids = tok.encode("ROMEO:\nO love")
    ask = dict(max_tokens=8, temperature=0.8, seed=3)
    want = complete(server, prompt="ROMEO:\nO love", **ask)["choices"][0]["text"]
    assert complete(server, prompt=ids, **ask)["choices"][0]["text"] == want
    both = complete(server, prompt=[ids, tok.encode("JULIET:\n")], **ask)
    assert both["choices"][0]["text"] == want and len(both["choices"]) == 2
    assert both["usage"]["prompt_tokens"] == len(ids) + len(tok.encode("JULIET:\n"))


def test_echo_with_logprobs_is_the_models_log_softmax(server, loaded):
    """As the harness asks (max_tokens 1, logprobs 1, temperature 0): one entry per prompt token,
    the first null, then the generated token's; each equals the model's log-softmax, and the top
    entry of a token that is the argmax equals its own value exactly."""
    model, tok, _ = loaded
    ids = tok.encode("ROMEO:\nO love, what art")
    choice = complete(server, prompt=[ids], max_tokens=1, temperature=0, logprobs=1, echo=True, seed=1)["choices"][0]
    lp = choice["logprobs"]
    want = log_softmax(model, ids)  # (T, V)
    assert lp["tokens"][: len(ids)] == [tok.decode([i]) for i in ids] and len(lp["tokens"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = torch.tensor(lp["token_logprobs"][1 : len(ids)])
    assert torch.allclose(got, want[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-6, rtol=0)
    for k in range(1, len(ids)):
        top = lp["top_logprobs"][k]
        assert max(top.values()) == pytest.approx(want[k - 1].max().item(), abs=1e-6)
        assert (lp["token_logprobs"][k] == max(top.values())) == (want[k - 1].argmax().item() == ids[k])
    assert choice["text"].startswith(tok.decode(ids))
    assert lp["token_logprobs"][-1] == pytest.approx(want[-1].max().item(), abs=1e-5)  # greedy: the argmax

    alone = complete(server, prompt=[ids], max_tokens=0, logprobs=0, echo=True)
    assert alone["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"][:-1]
    assert alone["choices"][0]["text"] == tok.decode(ids) and alone["usage"]["completion_tokens"] == 0


def test_a_generated_endoftext_has_its_entry_with_echo(server, loaded):
    """A scoring client counts one entry per generated token, <|endoftext|> included; without echo
    it has none (no text in the completion)."""
    model, tok, _ = loaded
    api, eot = server.api, tok.eot_id
    probs = log_softmax(model, [eot, eot])[-1].exp()  # (V,)
    for echo in (True, False):
        req = api.parse({"model": api.name, "prompt": "O", "logprobs": 1, "echo": echo, "temperature": 0})
        entry = api.engine._logprobs(probs, eot, 1, req)
        if echo:
            assert entry["tokens"] == ["<|endoftext|>"] and entry["text_offset"] == [1]
            assert entry["token_logprobs"][0] == pytest.approx(probs[eot].log().item(), abs=1e-6)
        else:
            assert entry["tokens"] == [] and entry["token_logprobs"] == []


def test_a_long_token_prompt_keeps_its_last_block_size(server, loaded):
    """Its last block_size tokens are scored as the harness's hf backend scores a left-truncated
    context (one window: the block_size ids before the last), the tokens before them in strided
    windows that each see at least block_size / 2 ids; its completion is that of its last
    block_size ids."""
    model, tok, cfg = loaded
    block = cfg.model.block_size
    ids = (tok.encode("ROMEO:\nO love, what art thou? ") * 8)[: 2 * block + 5]
    lp = complete(server, prompt=ids, max_tokens=0, logprobs=1, echo=True)["choices"][0]["logprobs"]
    got = lp["token_logprobs"]
    assert got[0] is None and len(got) == len(ids) and None not in got[1:]
    last = log_softmax(model, ids[-block - 1 : -1])  # (block, V)
    want = last.gather(1, torch.tensor(ids[-block:])[:, None])[:, 0]  # (block,)
    assert torch.allclose(torch.tensor(got[-block:]), want, atol=1e-6, rtol=0)
    for i in range(1, len(ids) - block):  # each the model's prediction after at least block / 2 ids
        seen = range(min(i, block), min(i, block // 2) - 1, -1)
        assert any(abs(got[i] - log_softmax(model, ids[i - k : i])[-1, ids[i]].item()) < 1e-6 for k in seen), i
    ask = dict(max_tokens=6, temperature=0.8, seed=4)
    whole, last = (complete(server, prompt=p, **ask)["choices"][0]["text"] for p in (ids, ids[-block:]))
    assert whole == last


def test_the_tokenizer_routes(server, loaded):
    _, tok, cfg = loaded
    status, info = raw(server, "GET", "/tokenizer_info")
    assert status == 200 and info["eos_token"] == info["bos_token"] == "<|endoftext|>"
    assert info["model_max_length"] == cfg.model.block_size
    text = "ROMEO:\nO love<|endoftext|>"
    status, out = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and out["tokens"] == tok.encode(text) and out["tokens"][-1] == tok.eot_id
    assert out["count"] == len(out["tokens"])
    status, back = post(server, "/detokenize", {"tokens": out["tokens"], "model": server.api.name})
    assert status == 200 and back == {"prompt": text}


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [1], "skip_special_tokens": True}, "skip_special_tokens"),
        ("/tokenize", {"prompt": 7}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "O", "model": "gpt-4"}, "model"),
        ("/v1/completions", {"prompt": [[5, 6], [7, 10**6]], "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"prompt": "O", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ],
)
def test_bad_ids_and_fields_are_a_400_naming_them(server, path, body, param):
    if path == "/v1/completions":
        body = {"model": server.api.name, **body}
    status, payload = post(server, path, body)
    error = payload["error"]
    assert status == (404 if param == "model" else 400) and error["param"] == param, payload
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    if "1000000" in json.dumps(body):  # the id is named
        assert "1000000" in error["message"]
