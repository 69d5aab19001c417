"""Conversations in: JSONL files of OpenAI-style `messages`, or a Hugging Face dataset with a
`messages` column, each conversation checked before it is tokenized.

One conversation per line, as OpenAI's fine-tuning files and most chat datasets write them:

    {"messages": [{"role": "system", "content": "Be terse."},
                  {"role": "user", "content": "What is 2 plus 3?"},
                  {"role": "assistant", "content": "5"}]}

The roles go: an optional system message first, then user and assistant in turn, ending with the
assistant. Content is a non-empty string (or OpenAI's list of {"type": "text", "text": ...} parts,
joined); other keys of a message (name, ...) are ignored. A line may also give `"answer"`: the
exact text that counts as right for its last question (`{"messages": [...], "answer": "42"}`);
held out, such conversations are asked at every evaluation (train.eval_metric=exact_answers).
A conversation that breaks a rule is an error naming its file and line (`BadConversation`),
unless data.skip_invalid is set: then it is skipped, and the skipped ones are counted by reason
and said.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from ..errors import MinitfError

ROLES = ("system", "user", "assistant")
MAX_LINE_BYTES = 64 << 20  # one conversation; a longer line is not a conversation but a broken file
# one conversation's turns: more is not a conversation a model of any context learns from
MAX_MESSAGES = 10_000


class BadConversation(MinitfError):
    """A conversation that breaks a rule; `where` is "file:line" (or "dataset row N"), `why` the rule."""

    def __init__(self, where: str, why: str):
        super().__init__(
            f"{where}: {why}; fix that conversation, or set data.skip_invalid=true to skip (and count) such ones"
        )
        self.where, self.why = where, why


def check_messages(messages, where: str) -> list[dict]:
    """The conversation as a list of {"role", "content"} dicts with string content, or BadConversation
    (also raised when `messages` is one: a line that was not a conversation at all)."""
    if isinstance(messages, BadConversation):
        raise messages
    if not isinstance(messages, list) or not messages:
        raise BadConversation(where, '"messages" must be a non-empty list of {"role", "content"} objects')
    if len(messages) > MAX_MESSAGES:
        raise BadConversation(
            where, f"{len(messages):,} messages, more than the {MAX_MESSAGES:,} a conversation may hold"
        )
    out = []
    for i, m in enumerate(messages):
        what = f"message {i + 1}"
        if not isinstance(m, dict):
            raise BadConversation(where, f'{what} is not an object with "role" and "content"')
        role = m.get("role")
        if role not in ROLES:
            raise BadConversation(where, f"{what} has the unknown role {role!r} (roles: system, user, assistant)")
        content = _text(m.get("content"))
        if content is None:
            raise BadConversation(where, f"{what} ({role}) has no text content")
        if not content.strip():
            raise BadConversation(where, f"{what} ({role}) is empty")
        expected = _next_roles(out)
        if role not in expected:
            raise BadConversation(
                where, f"{what} is {role} where {' or '.join(expected)} must come (roles out of order)"
            )
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "assistant":
        has_answer = any(m["role"] == "assistant" for m in out)
        raise BadConversation(
            where, "it ends with a user turn, which nothing answers" if has_answer else "it has no assistant turn"
        )
    return out


def check_question(messages, where: str) -> list[dict]:
    """A conversation to answer (what chat and the server take): a training conversation's rules,
    except that it ends with the user's message, the one to answer; BadConversation otherwise."""
    if not isinstance(messages, list) or not messages:
        raise BadConversation(where, 'it must be a non-empty list of {"role", "content"} objects')
    if not isinstance(messages[-1], dict) or messages[-1].get("role") != "user":
        raise BadConversation(
            where,
            f"the last message (message {len(messages)}) must be the user's: a conversation to answer "
            "must end with a user message",
        )
    # the same rules, checked on the conversation with a stand-in answer after the question
    return check_messages([*messages, {"role": "assistant", "content": "."}], where)[:-1]


def _next_roles(so_far: list[dict]) -> tuple[str, ...]:
    if not so_far:
        return ("system", "user")
    return ("assistant",) if so_far[-1]["role"] == "user" else ("user",)


def _text(content) -> str | None:
    """A message's content as text: a string, or OpenAI's list of text parts joined."""
    if isinstance(content, str):
        return content
    if (
        isinstance(content, list)
        and content
        and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
    ):
        return "".join(p["text"] for p in content)
    return None


def jsonl_conversations(path: Path) -> Iterator[tuple[str, object, str | None]]:
    """("file:line", messages, answer) for each non-blank line of a JSONL file, read a line at a
    time (answer: the line's "answer", or None); for a line that is not UTF-8, not JSON, holds no
    "messages" or an answer that is not text, a BadConversation in place of the messages
    (check_messages raises it, or data.skip_invalid counts it)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(_lines(f, path), start=1):
            where = f"{path}:{number}"
            if not raw.strip():
                continue
            try:  # a file's first line may start with the byte order mark Windows Notepad writes
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield where, BadConversation(where, f"invalid UTF-8 at byte {e.start} of the line"), None
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                yield where, BadConversation(where, f"invalid JSON ({e.msg} at column {e.colno})"), None
                continue
            except RecursionError:  # [[[[...]]]] 100,000 deep: Python's parser gives up
                yield where, BadConversation(where, "invalid JSON (nested too deeply)"), None
                continue
            if not isinstance(record, dict) or "messages" not in record:
                yield where, BadConversation(where, 'each line must be a JSON object with a "messages" list'), None
                continue
            if _lone_surrogate(record):  # "\ud800": valid JSON, but no text any tokenizer encodes
                yield where, BadConversation(where, "a lone surrogate (\\ud800-\\udfff) that is no character"), None
                continue
            answer = record.get("answer")
            if answer is not None and not (isinstance(answer, str) and answer.strip()):
                why = '"answer" must be the text its last question is answered with, e.g. "answer": "42"'
                yield where, BadConversation(where, why), None
                continue
            yield where, record["messages"], answer


def _lone_surrogate(value) -> bool:
    """Whether a JSON value holds a string with a lone surrogate, which has no UTF-8 form."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _lines(f, path: Path) -> Iterator[bytes]:
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise MinitfError(f"{path}: a line longer than {MAX_LINE_BYTES >> 20} MiB is not one conversation")
        yield raw


class Skipped(Counter):
    """Conversations skipped under data.skip_invalid, counted by reason (the first place of each kept)."""

    def __init__(self):
        super().__init__()
        self.first: dict[str, str] = {}

    def add(self, bad: BadConversation) -> None:
        reason = bad.why.split(" (")[0]
        self[reason] += 1
        self.first.setdefault(reason, bad.where)

    def summary(self) -> str:
        parts = [f"{n} {reason} (first at {self.first[reason]})" for reason, n in self.most_common()]
        return f"skipped {sum(self.values())} invalid conversation(s): " + "; ".join(parts)
