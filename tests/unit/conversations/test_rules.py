"""Conversations in: every malformed case is one line naming the file and line; data.skip_invalid
skips them and says how many, by reason; the generated chat corpus is what its tasks say."""

import json

import pytest

import minitf
from minitf.chat_template import add_chat_tokens, chatml
from minitf.config import DataConfig
from minitf.conversations.cache import prepare_chat_data
from minitf.conversations.rules import BadConversation
from minitf.corpus import chat_corpus
from minitf.tokenizer import Tokenizer

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
BAD = {
    "roles out of order": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
    "unknown role": [{"role": "robot", "content": "a"}, {"role": "assistant", "content": "b"}],
    "is empty": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "b"}],
    "has no text content": [{"role": "user"}, {"role": "assistant", "content": "b"}],
    "has no assistant turn": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}],
    "ends with a user turn": [*GOOD["messages"], {"role": "user", "content": "c"}],
    "two users in a row": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}


@pytest.fixture(scope="module")
def tok():
    return add_chat_tokens(Tokenizer.train(["Hello there, what is it? " * 20], 300))


def _write(path, lines: list[bytes]):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _prepare(path, tok, **keys):
    return prepare_chat_data(
        DataConfig(source=f"file:{path}", format="chat", **keys), tok, chatml(), log=lambda line: None
    )


@pytest.mark.parametrize("why", sorted(BAD))
def test_a_malformed_conversation_is_one_line_naming_file_and_line(tmp_path, tok, why):
    good = json.dumps(GOOD).encode()
    path = _write(tmp_path / "chats.jsonl", [good, good, json.dumps({"messages": BAD[why]}).encode(), good])
    with pytest.raises(BadConversation) as e:
        _prepare(path, tok)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}:3: ")
    assert (why if why != "two users in a row" else "roles out of order") in message
    assert "data.skip_invalid=true" in message


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"messages": [', "invalid JSON"),
        (b'{"messages": "\xff\xfe"}', "invalid UTF-8"),
        (b"[1, 2]", 'a JSON object with a "messages" list'),
        (b"[" * 100_000 + b"]" * 100_000, r"invalid JSON \(nested too deeply\)"),  # a RecursionError, before
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "a lone surrogate"),
    ],
)
def test_bytes_that_are_not_a_conversation_name_the_line(tmp_path, tok, raw, why):
    path = _write(tmp_path / "chats.jsonl", [json.dumps(GOOD).encode(), raw])
    with pytest.raises(BadConversation, match=f"^{path}:2: .*{why}"):
        _prepare(path, tok)


def test_skip_invalid_skips_and_counts_by_reason(tmp_path, tok):
    good, lines = json.dumps(GOOD).encode(), []
    for i in range(20):
        lines.append(good)
        if i % 5 == 0:
            lines.append(json.dumps({"messages": BAD["unknown role"]}).encode())
    lines.append(b"not json")
    said = []
    data = prepare_chat_data(
        DataConfig(source=f"file:{_write(tmp_path / 'c.jsonl', lines)}", format="chat", skip_invalid=True),
        tok,
        chatml(),
        log=said.append,
    )
    splits = data.meta["splits"]
    assert splits["train"]["conversations"] + splits["val"]["conversations"] == 20
    assert data.meta["skipped"] == {"message 1 has the unknown role 'robot'": 4, "invalid JSON": 1}
    line = next(s for s in said if "skipped" in s)
    assert "skipped 5 invalid conversation(s)" in line and "first at" in line


def test_the_generated_corpus_answers_are_right():
    seen = set()
    for messages in chat_corpus.conversations()[:2000]:
        for q, a in zip(messages[-2::-2], messages[-1::-2]):
            task, question, answer = chat_corpus.task_of(q["content"]), q["content"], a["content"]
            seen.add(task)
            if task == "add":
                x, y = (int(w.rstrip("?")) for w in question.split() if w.rstrip("?").isdigit())
                assert answer == str(x + y)
            elif task == "bigger":
                x, y = (int(w.strip(",?")) for w in question.split() if w.strip(",?").isdigit())
                assert answer == str(max(x, y)) and x != y
            elif task == "last":
                assert answer == question.rstrip("?").split()[-1]
            else:
                assert answer == question.split(": ", 1)[1]
    assert seen == set(chat_corpus.TASKS)


def test_a_byte_order_mark_and_a_directory_of_jsonl_files_are_read(tmp_path, tok):
    """What Windows Notepad writes (a UTF-8 BOM before the first line) is read, not refused; and a
    directory given for conversations means its *.jsonl, as it means *.txt for text."""
    folder = tmp_path / "chats"
    folder.mkdir()
    lines = [
        json.dumps({"messages": [{"role": "user", "content": f"Hi {i}"}, GOOD["messages"][1]]}).encode()
        for i in range(40)
    ]
    _write(folder / "a.jsonl", [b"\xef\xbb\xbf" + lines[0], *lines[1:20]])
    _write(folder / "b.jsonl", lines[20:])
    (folder / "notes.txt").write_text("not a conversation")
    data = _prepare(folder, tok)
    splits = data.meta["splits"]
    assert splits["train"]["conversations"] + splits["val"]["conversations"] == 40


def test_a_file_edited_at_the_same_size_rebuilds_the_cache(tmp_path, tok):
    """The chat cache's key holds the files' content hash (corpus/sources.py's fingerprint), as the
    text cache's does: an edit that keeps the size, and even the modification time, is not reused."""
    import os

    lines = [json.dumps({"messages": [{"role": "user", "content": f"Hi {i}"}, GOOD["messages"][1]]}) for i in range(40)]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = _prepare(path, tok)
    stat = path.stat()
    path.write_text(path.read_text().replace("Hi 7", "Hi 8"))  # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same modification time
    after = _prepare(path, tok)
    assert after.meta["fingerprint"] != before.meta["fingerprint"]


def test_when_every_line_is_skipped_the_error_says_how_many_and_why(tmp_path, tok):
    lines = [b"not json"] * 5 + [json.dumps({"messages": BAD["unknown role"]}).encode()]
    path = _write(tmp_path / "c.jsonl", lines)
    with pytest.raises(minitf.MinitfError) as e:
        _prepare(path, tok, skip_invalid=True)
    assert "every conversation was skipped as invalid: skipped 6 invalid conversation(s): 5 invalid JSON" in str(
        e.value
    )
    assert "has the unknown role 'robot' (first at" in str(e.value) and "\n" not in str(e.value)
