"""A chat request's conversation is checked by the training rules, ending with the user's message
(one-line 400s naming messages), and the engine's logprobs become OpenAI's chat entries."""

import math
import re
from pathlib import Path

import pytest

from minitf.web.serve.chat_request import checked_messages, not_a_chat_model
from minitf.web.serve.chat_shape import content_logprobs
from minitf.web.serve.request import APIError


def test_a_conversation_ending_with_the_users_message_is_kept_as_text():
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 plus 3?"}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}]
    assert checked_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 plus 3?"},
    ]


@pytest.mark.parametrize(
    "messages, words",
    [
        ("hi", "non-empty list"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "must be the user's"),
        ([{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}], "out of order"),
        ([{"role": "tool", "content": "a"}, {"role": "user", "content": "b"}], "unknown role 'tool'"),
        ([{"role": "user", "content": ""}], "is empty"),
        ([{"role": "user", "content": 3}], "no text content"),
    ],
)
def test_bad_conversations_are_one_line_400s_naming_messages(messages, words):
    with pytest.raises(APIError) as e:
        checked_messages(messages)
    assert e.value.status == 400 and e.value.param == "messages" and words in str(e.value)
    assert "\n" not in str(e.value) and "skip_invalid" not in str(e.value)


def test_logprobs_become_chat_entries_likeliest_first():
    engine = {
        "tokens": ["Hi", "é"],
        "token_logprobs": [math.log(0.5), math.log(0.1)],
        "top_logprobs": [{"Yo": math.log(0.3), "Hi": math.log(0.5)}, {"a": math.log(0.6), "é": math.log(0.1)}],
    }
    first, second = content_logprobs(engine, 1)
    assert first == {
        "token": "Hi", "logprob": math.log(0.5), "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": math.log(0.5), "bytes": [72, 105]}],
    }  # fmt: skip
    assert second["bytes"] == [0xC3, 0xA9] and [t["token"] for t in second["top_logprobs"]] == ["a"]
    assert [t["token"] for t in content_logprobs(engine, 2)[1]["top_logprobs"]] == ["a", "é"]
    assert content_logprobs(None, 3) == []


def test_the_readme_refuses_chat_completions_for_a_base_run_only():
    """The README's sentence on /v1/chat/completions says what the server does: a chat run answers,
    a base run (no template: trained without data.format=chat) gets the 404 quoted."""
    paragraphs = (Path(__file__).resolve().parents[4] / "README.md").read_text(encoding="utf-8").split("\n\n")
    sentences = [s for p in paragraphs for s in re.split(r"(?<=\.) ", " ".join(p.split()))]
    said = [s for s in sentences if "/v1/chat/completions" in s and '"not a chat model"' in s]
    assert len(said) == 1, said
    assert "a chat run" in said[0] and "`data.format=chat`" in said[0] and "for a base run" in said[0], said[0]
    refusal = not_a_chat_model()
    assert refusal.status == 404 and str(refusal).startswith("This is not a chat model and thus not supported")
