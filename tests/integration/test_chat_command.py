"""`minitf chat` (and scripts/chat.py) driven through standard input: for a seed, its answers are
minitf.chat's and the server's; a conversation goes on over turns, /reset and --system shape it;
Ctrl-C stops an answer or ends the chat cleanly; a base run is not a chat model, in one line."""

import io
import subprocess
import sys

import pytest

from minitf.cli import chat as chat_command
from minitf.conversations.answer import chat
from minitf.run_dir import load_run
from minitf.web.serve import Completions
from tests.support import ROOT
from tests.support.processes import command

Q1, Q2 = "What is 2 plus 3?", "And 4 plus 4?"


SCRIPT, MODULE = [str(ROOT / "scripts" / "chat.py")], ["-m", "minitf", "chat"]


def talk(run, lines: list[str], *args, front=None):
    """minitf chat over run, the lines its standard input (not a terminal): in this process, or in
    a process of its own started as front (SCRIPT, MODULE)."""
    stdin, args = "".join(line + "\n" for line in lines), ["--run", str(run), "--device", "cpu", *args]
    if front is None:
        return command("chat", *args, stdin=stdin)
    return subprocess.run([sys.executable, *front, *args], input=stdin, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def loaded(chat_run):
    return load_run(chat_run)


def user(text):
    return {"role": "user", "content": text}


def test_library_command_and_server_give_one_answer_for_a_seed(chat_run, loaded):
    model, tok, cfg = loaded
    settings = dict(max_new_tokens=25, temperature=0.9, top_k=30, seed=5)
    library = chat(model, tok, [user(Q1)], cfg.sample, **settings)
    api = Completions(chat_run)
    body = {"model": api.name, "messages": [user(Q1)], "max_tokens": 25, "temperature": 0.9, "top_k": 30, "seed": 5}
    served = api.chat(api.parse_chat(body))["choices"][0]["message"]["content"]
    out = talk(chat_run, [Q1], "--max-new-tokens", "25", "--temperature", "0.9", "--top-k", "30", "--seed", "5")
    assert out.returncode == 0, out.stderr
    assert out.stdout == library + "\n" and served == library and library
    assert "chatting with" in out.stderr and "Traceback" not in out.stderr


def test_turns_reset_and_system_prompt(chat_run, loaded):
    """Each answer continues the conversation so far; /reset forgets it (the system prompt kept)."""
    model, tok, cfg = loaded
    sampled = dict(max_new_tokens=12, temperature=1.0, seed=4)  # a seed whose answers have text: a turn keeps it
    system = {"role": "system", "content": "Answer briefly."}
    a1 = chat(model, tok, [system, user(Q1)], cfg.sample, **sampled)
    a2 = chat(model, tok, [system, user(Q1), {"role": "assistant", "content": a1}, user(Q2)], cfg.sample, **sampled)
    fresh = chat(model, tok, [system, user(Q2)], cfg.sample, **sampled)
    assert a2 != fresh  # the earlier turn changes the answer, so the test can tell the two apart
    lines = [Q1, Q2, "/help", "", "/reset", Q2, "/quit", Q1]
    out = talk(
        chat_run, lines, "--max-new-tokens", "12", "--temperature", "1", "--seed", "4", "--system", system["content"]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{a1}\n{a2}\n{fresh}\n"  # nothing after /quit
    assert "/reset" in out.stderr and "a new conversation" in out.stderr
    # piped: each question is shown (on stderr, where a typed prompt is) before its answer
    assert [line for line in out.stderr.splitlines() if line.startswith("> ")] == [f"> {Q1}", f"> {Q2}", f"> {Q2}"]


def test_the_script_is_the_command(chat_run):
    args = ("--max-new-tokens", "10", "--seed", "2")
    assert talk(chat_run, [Q1], *args, front=SCRIPT).stdout == talk(chat_run, [Q1], *args, front=MODULE).stdout != ""


def test_a_base_run_is_not_a_chat_model(tiny_run):
    out = talk(tiny_run, [Q1])
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "not a chat model" in out.stderr and "--config chat" in out.stderr


@pytest.mark.parametrize("args, words", [(["--system", " "], "--system is empty"), (["--top-p", "2"], "top_p")])
def test_bad_options_are_one_line(chat_run, args, words):
    out = talk(chat_run, [Q1], *args)
    assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1


class Keyboard:
    """A standard input (not a terminal) whose lines are given; Ctrl-C where a line is None."""

    def __init__(self, lines):
        self.lines, self.buffer = list(lines), self

    def isatty(self):
        return False

    def readline(self, limit=-1):
        if not self.lines:
            return b""
        line = self.lines.pop(0)
        if line is None:
            raise KeyboardInterrupt
        return line.encode() + b"\n"


def test_ctrl_c_stops_an_answer_then_ends_the_chat(chat_run, loaded, monkeypatch, capsys):
    """Ctrl-C during the first answer stops it and the chat goes on (the stopped turn left out:
    the next answer is that of a fresh conversation); Ctrl-C at the prompt ends it, exit 0."""
    model, tok, cfg = loaded
    real, calls = chat_command.chat_stream, []

    def interrupted_once(*args, **kw):
        calls.append(args[2])
        for k, piece in enumerate(real(*args, **kw)):
            if len(calls) == 1 and k == 2:
                raise KeyboardInterrupt
            yield piece

    monkeypatch.setattr(chat_command, "chat_stream", interrupted_once)
    monkeypatch.setattr(sys, "stdin", Keyboard([Q1, Q2, None, Q1]))
    chat_command.main(["--run", str(chat_run), "--device", "cpu", "--temperature", "0", "--max-new-tokens", "12"])
    out = capsys.readouterr()
    want = chat(model, tok, [user(Q2)], cfg.sample, temperature=0.0, max_new_tokens=12)
    assert out.out.endswith("\n" + want + "\n") and "[answer stopped]" in out.err
    assert calls == [[user(Q1)], [user(Q2)]]  # Q2 asked alone, and nothing read after the Ctrl-C at the prompt


def test_stdin_that_is_not_utf8_is_said_and_skipped(chat_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xff\xfe\n"), encoding="utf-8"))
    chat_command.main(["--run", str(chat_run), "--device", "cpu", "--max-new-tokens", "3"])
    assert "input line 1 is not valid UTF-8" in capsys.readouterr().err


def test_an_answers_control_characters_are_shown_on_a_terminal_and_exact_in_a_pipe(chat_run, monkeypatch):
    """An answer that writes ESC sequences (clear the screen, set the title, the clipboard), a
    carriage return or a bidi override reaches a terminal as escapes; a pipe gets the bytes."""
    real = chat_command.chat_stream
    written = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07a\rb\u202ec\x9b"

    def writes_controls(*args, **kw):
        yield from real(*args, **kw)
        yield written

    monkeypatch.setattr(chat_command, "chat_stream", writes_controls)
    args = ["--run", str(chat_run), "--device", "cpu", "--temperature", "0", "--max-new-tokens", "4"]
    shown = command("chat", *args, stdin=Q1 + "\n", tty=True)
    piped = command("chat", *args, stdin=Q1 + "\n")
    assert shown.returncode == piped.returncode == 0, shown.stderr
    assert piped.stdout.endswith(written + "\n")
    escaped = "\\x1b[2J\\x1b]0;owned\\x07\\x1b]52;c;ZWNobyBoaQ==\\x07a\\rb\\u202ec\\x9b"
    assert (
        shown.stdout.endswith(escaped + "\n") and piped.stdout[: -len(written) - 1] == shown.stdout[: -len(escaped) - 1]
    )
