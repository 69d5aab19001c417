"""The chat template in this process: ChatML's loss mask learns each answer's end of turn whatever
its trailing whitespace, a conversation renders a fixed number of times, and what is not a
template's text is one line. Downloaded templates against transformers, which render in their
bounded worker process, are tests/integration/test_chat_template_hf.py's."""

import json

import pytest

import minitf
from minitf.chat_template import ChatTemplate
from minitf.errors import MinitfError
from tests.support import ROOT
from tests.support.chat import runs
from tests.support.corpus import make_play

TEMPLATES = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("answer", ["42\n", "42  ", "42\n\n", " 42 "])
def test_an_answer_with_trailing_whitespace_still_learns_its_end_of_turn(answer):
    """The content is found trimmed, and what the template writes after it up to the end-of-turn
    token is whitespace: learned with the token, or the model would never learn to stop."""
    from minitf.chat_template import add_chat_tokens, chatml

    tok = add_chat_tokens(minitf.Tokenizer.train([make_play(0)], 300))
    template = chatml()
    ids, learned = template.encode_conversation(
        tok, [{"role": "user", "content": "Q"}, {"role": "assistant", "content": answer}]
    )
    (run,) = runs(ids, learned)
    assert run[-1] == template.end_of_turn(tok) and tok.decode(run[:-1]).strip() == "42"
    assert tok.decode(run[:-1]) == answer  # from the generation prompt on, trailing whitespace too


def test_encoding_a_conversation_renders_it_a_fixed_number_of_times(monkeypatch):
    """Linear in its messages: the template is rendered as often for 200 messages as for 10 (it was
    once per answer, each render as long as the conversation: 4,000 messages took 3.5 s, 100,000
    never finished)."""
    from minitf.chat_template import add_chat_tokens, chatml

    tok = add_chat_tokens(minitf.Tokenizer.train([make_play(0)], 300))
    template = chatml()
    calls = []
    render = ChatTemplate.render
    monkeypatch.setattr(ChatTemplate, "render", lambda self, *a, **k: calls.append(1) or render(self, *a, **k))

    def renders(n: int) -> int:
        calls.clear()
        turns = [{"role": r, "content": f"{r} {i}"} for i in range(n // 2) for r in ("user", "assistant")]
        template.encode_conversation(tok, turns)
        return len(calls)

    renders(2)  # the template's own probes (its generation prompt, its end of turn), once
    assert renders(10) == renders(200) <= 3


def test_a_conversation_of_more_messages_than_the_bound_is_one_line():
    from minitf.conversations.rules import MAX_MESSAGES, BadConversation, check_messages

    turns = [{"role": r, "content": "x"} for _ in range(MAX_MESSAGES // 2 + 1) for r in ("user", "assistant")]
    with pytest.raises(BadConversation, match=f"chats.jsonl:3: {len(turns):,} messages, more than the 10,000"):
        check_messages(turns, "chats.jsonl:3")


# ---- a template from a download: read as text, guarded where that is cheap (the bounds: tests/integration)


@pytest.mark.parametrize(
    "kind, said",
    [
        ("fifo", "is not a regular file (a FIFO, a device, a folder or a broken link); put the model's chat template"),
        ("folder", "is not a regular file"),
        ("latin-1", "is not UTF-8 text (byte 3); save the chat template as UTF-8"),
        ("huge", "is over 1 MiB, not a chat template; fetch the model again"),
    ],
)
def test_a_template_file_that_is_not_a_templates_text_is_one_line(tmp_path, kind, said):
    """A FIFO in place of chat_template.jinja would never end (it was passed over for
    tokenizer_config.json's, without a word), bytes that are not UTF-8 were a traceback."""
    import os

    from minitf.chat_template import MAX_TEMPLATE_BYTES, TEMPLATE_FILE
    from minitf.conversations.template_files import load_template

    path = tmp_path / TEMPLATE_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"{# \xe9t\xe9 #}" if kind == "latin-1" else b" " * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(MinitfError) as e:
        load_template(tmp_path, {"chat_template": "{{ messages }}"})
    assert str(e.value).startswith(f"{path} {said}") and "\n" not in str(e.value), str(e.value)


def test_a_template_names_where_it_came_from(tmp_path):
    from minitf.chat_template import TEMPLATE_FILE
    from minitf.conversations.template_files import load_template

    assert load_template(tmp_path, {"chat_template": "{{ x }}"}).name == (
        f"the chat template from {tmp_path / 'tokenizer_config.json'}"
    )
    (tmp_path / TEMPLATE_FILE).write_text("{{ x }}")
    assert load_template(tmp_path).name == f"the chat template from {tmp_path / TEMPLATE_FILE}"
    assert ChatTemplate("{{ x }}").name == "the chat template"
    with pytest.raises(MinitfError, match=f"^the chat template from {tmp_path / TEMPLATE_FILE} is not valid Jinja"):
        ChatTemplate("{% for %}", origin=str(tmp_path / TEMPLATE_FILE))


@pytest.mark.parametrize(
    "source, said",
    [
        ("{{ 9 ** (9 ** 9) }}", "computes a power of more than 65,536 bits"),
        ("{{ 'x' * 10 ** 9 }}", "repeats a str to 1,000,000,000 items"),
        ("{{ [1, 2] * 10 ** 9 }}", "repeats a list to 2,000,000,000 items"),
    ],
)
def test_the_sandbox_refuses_a_huge_power_or_repetition_before_computing_it(source, said):
    """Each was one long operation in C (minutes, holding the GIL, or all memory); jinja2 would even
    fold 9 ** (9 ** 9) while compiling. Small ones are computed as before."""
    from minitf.conversations.sandbox import TooLarge, compile_template

    with pytest.raises(TooLarge, match=said):
        compile_template(source).render()
    assert compile_template("{{ 2 ** 10 }} {{ '-' * 3 }} {{ [0] * 2 }} {{ 3 * 4 }}").render() == "1024 --- [0, 0] 12"


def test_the_sandbox_has_no_lipsum():
    """lipsum(10**6) wrote a million paragraphs; no chat template calls it."""
    import jinja2

    from minitf.conversations.sandbox import compile_template

    with pytest.raises(jinja2.exceptions.UndefinedError, match="'lipsum' is undefined"):
        compile_template("{{ lipsum(10**6) }}").render()


def test_only_minitfs_own_template_renders_in_this_process():
    from minitf.chat_template import chatml
    from minitf.conversations.bounded import InProcess, Worker

    assert isinstance(chatml().renderer, InProcess)
    assert isinstance(ChatTemplate(TEMPLATES["qwen2.5"]["chat_template"]).renderer, Worker)
