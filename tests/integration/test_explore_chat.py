"""The explorer's chat view: a chat run answers the page's messages as minitf.chat does, shows the
whole templated conversation token by token (so each answer token opens the views on it), and a
base run refuses messages in one line."""

import pytest

import minitf
from minitf.chat_template import IM_END
from minitf.web.explore.api import Explorer
from minitf.web.fields import BadRequest

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 3 plus 4?"}]


@pytest.fixture(scope="module")
def chat_ex(chat_run):
    return Explorer(chat_run)


def test_a_chat_turn_streams_minitf_chats_answer_over_the_templated_conversation(chat_ex):
    assert chat_ex.run_info()["chat"] is True
    with chat_ex.generation({"messages": MESSAGES, "temperature": 0, "max_new_tokens": 12}) as events:
        events = list(events)
    prompt = [t["id"] for t in events[0]["prompt"]]
    template = chat_ex.tok.chat_template
    assert prompt == template.prompt_ids(chat_ex.tok, MESSAGES)  # the conversation as the model reads it
    answer = "".join(e["token"]["text"] for e in events if "token" in e)
    expected = minitf.chat(chat_ex.model, chat_ex.tok, MESSAGES, temperature=0, max_new_tokens=12)
    assert answer == expected and IM_END not in answer
    ended_its_turn = events[-2]["token"]["id"] == template.end_of_turn(chat_ex.tok)
    assert events[-1] == {"done": "eot" if ended_its_turn else "length"}
    # an answer token, clicked: its attention over the whole conversation
    ids = prompt + [e["token"]["id"] for e in events if "token" in e]
    view = chat_ex.attention({"ids": ids, "query": len(prompt), "layer": 0, "head": 0})
    assert view["ids"] == ids[: len(view["ids"])] and view["query"] == len(prompt)
    assert len(view["grid"][0][0]) == len(prompt) + 1  # the answer's first token weighs the whole conversation


def test_messages_to_a_base_run_or_out_of_order_are_one_line(chat_ex, tiny_run):
    with pytest.raises(BadRequest, match="not a chat model"):
        with Explorer(tiny_run).generation({"messages": MESSAGES}):
            pass
    with pytest.raises(minitf.ConfigError, match="must end with a user message"):
        with chat_ex.generation({"messages": [*MESSAGES, {"role": "assistant", "content": "7"}]}):
            pass


def test_an_answer_ends_where_the_context_does(chat_ex):
    """A conversation that leaves 2 tokens of the model's context gets an answer of at most 2,
    whatever max_new_tokens asks ("context", the page says the context is full): past it the
    window would slide the conversation's start out of what the model reads."""
    block, tok = chat_ex.cfg.model.block_size, chat_ex.tok
    words = "one two three four five six seven eight nine ten".split()
    content, n = "", 0
    while True:  # the longest question that leaves at least 2 tokens for the answer
        longer = f"{content} {words[n % len(words)]}".strip()
        if len(tok.chat_template.prompt_ids(tok, [{"role": "user", "content": longer}])) > block - 2:
            break
        content, n = longer, n + 1
    messages = [{"role": "user", "content": content}]
    room = block - len(tok.chat_template.prompt_ids(tok, messages))
    with chat_ex.generation({"messages": messages, "temperature": 0, "max_new_tokens": 50}) as events:
        events = list(events)
    sampled = [e["token"]["id"] for e in events if "token" in e]
    assert 2 <= room <= 3 and len(sampled) <= room
    ended = sampled[-1] == tok.chat_template.end_of_turn(tok)
    assert events[-1] == {"done": "eot" if ended else "context"}
    assert ended or len(sampled) == room
