"""A downloaded chat template is untrusted code that runs bounded (conversations/bounded.py): in a
worker process of its own, ended past a second of CPU time, a megabyte of text or a gigabyte of
memory, each one line naming the template and the bound, within seconds; the worker starts again
for the next render. Real templates render there exactly as in this process, and a render is
cancelled by ending its worker."""

import json
import pickle
import threading
import time

import pytest

from minitf.chat_template import ChatTemplate
from minitf.conversations import bounded, sandbox
from minitf.conversations.bounded import RenderCancelled
from minitf.errors import MinitfError
from tests.support import ROOT
from tests.support.processes import pid_exists

TEMPLATES = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))
ORIGIN = "/models/x/chat_template.jinja"
NAME = f"the chat template from {ORIGIN}"
HELLO = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"  # no output, no call

RUNAWAY = {  # each hung (or filled) the process that rendered it, which was minitf's own
    "lipsum": ("{{ lipsum(10**6) }}", "refused the conversation ('lipsum' is undefined)"),
    "a huge power": ("{{ 9 ** (9 ** 9) }}", "computes a power of more than 65,536 bits"),
    "a loop that writes nothing": (SPIN, "ran past 1 s, the bound on a render's time"),
    "100 MB of text": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "wrote more than 1,0"),
    "recursion two ways deep": (
        "{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
        "ran past 1 s",
    ),
    # its memory passes 1 GiB after about a second of copying: on a slow machine the time bound comes first
    "a string doubled": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        ("needed more than 1,024 MiB, the bound on a render's memory", "ran past 1 s, the bound on a render's time"),
    ),
}


@pytest.mark.parametrize("case", RUNAWAY, ids=str)
def test_a_runaway_template_is_one_line_naming_it_and_its_bound(case):
    source, said = RUNAWAY[case]
    template = ChatTemplate(source, origin=ORIGIN)
    start = time.monotonic()
    with pytest.raises(MinitfError) as e:
        template.render(HELLO)
    assert time.monotonic() - start < 30  # it did not hang (each takes about a second)
    message = str(e.value)
    said = (said,) if isinstance(said, str) else said  # any of them: the one bound this machine reaches first
    assert message.startswith(NAME) and any(s in message for s in said) and "\n" not in message, message


def test_the_worker_starts_again_after_it_is_ended():
    """A render past its time ends the worker; the next render starts a fresh one and answers."""
    template = ChatTemplate("{% if messages[0].content == 'spin' %}" + SPIN + "{% endif %}{{ messages[0].content }}")
    assert template.render([{"role": "user", "content": "hi"}]) == "hi"
    first = template.renderer.pid
    with pytest.raises(MinitfError, match="^the chat template ran past 1 s"):
        template.render([{"role": "user", "content": "spin"}])
    assert template.renderer.pid is None and not pid_exists(first)
    assert template.render([{"role": "user", "content": "again"}]) == "again"
    assert template.renderer.pid not in (None, first)


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 plus 3?"}],
    [
        {"role": "system", "content": "Answer in one word.\n"},
        {"role": "user", "content": "Capital of France? ✓ naïve \ud800 \x00"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome, of course.\nIt's the capital."},
    ],
]


@pytest.mark.parametrize("name", sorted(k for k in TEMPLATES if not k.startswith("_")))
def test_a_real_template_renders_in_its_worker_as_in_this_process(name):
    """Llama 3's, Qwen3's, Mistral's, ... templates: the worker's text is the in-process sandbox's,
    character for character (a lone surrogate and a NUL included), with or without the prompt."""
    spec = TEMPLATES[name]
    special = {k: spec[k] for k in ("bos_token", "eos_token")}
    template = ChatTemplate(spec["chat_template"], special)
    assert isinstance(template.renderer, bounded.Worker)
    here = sandbox.compile_template(spec["chat_template"])
    for messages in CONVERSATIONS:
        for prompt in (False, True):
            if messages[-1]["role"] == "assistant" or prompt:
                want = here.render(messages=messages, add_generation_prompt=prompt, **special)
                assert template.render(messages, prompt) == want, (name, prompt)


def test_a_render_is_cancelled_by_ending_its_worker(monkeypatch):
    """cancelled() becoming true ends the render under way (RenderCancelled) and its process; a
    render waiting for its turn is cancelled as well; the next render starts a fresh worker."""
    monkeypatch.setattr(bounded, "RENDER_SECONDS", 120.0)  # the render would run on for minutes
    monkeypatch.setattr(bounded, "WAIT_SECONDS", 600.0)
    template = ChatTemplate("{% if messages[0].content == 'spin' %}" + SPIN + "{% endif %}{{ messages[0].content }}")
    stop, outcome = threading.Event(), {}

    def spin():
        try:
            with template.cancelled_by(stop.is_set):
                template.render([{"role": "user", "content": "spin"}])
        except RenderCancelled as e:
            outcome["error"] = e

    thread = threading.Thread(target=spin)
    thread.start()
    for _ in range(3000):  # its worker started (then the render is under way)
        if template.renderer.pid is not None:
            break
        time.sleep(0.01)
    pid = template.renderer.pid
    assert pid is not None
    stop.set()
    thread.join(30)
    assert not thread.is_alive() and "was cancelled" in str(outcome["error"])
    assert not pid_exists(pid) and template.renderer.pid is None
    assert template.render([{"role": "user", "content": "next"}]) == "next"


def test_a_copy_renders_with_a_worker_of_its_own():
    """A template travels with its tokenizer (pickled to a process, deep-copied): the copy starts its own."""
    template = ChatTemplate(TEMPLATES["llama3"]["chat_template"], {"bos_token": "<|begin_of_text|>"})
    want = template.render(HELLO)
    copy = pickle.loads(pickle.dumps(template))
    assert copy.render(HELLO) == want and copy.renderer.pid != template.renderer.pid


def test_what_json_cannot_carry_is_one_line():
    template = ChatTemplate("{{ messages[0].content }}", origin=ORIGIN)
    with pytest.raises(MinitfError, match=f"^{NAME} can be given JSON values only .*; pass the conversation as"):
        template.render([{"role": "user", "content": object()}])


def test_a_template_that_is_not_a_chat_template_is_one_line(tmp_path):
    """`{{ messages }}` writes the messages' Python form, no marker: minitf.chat says what it is
    and what to do, whether it comes as chat()'s argument or in a model directory."""
    import minitf
    from minitf.conversations.template_files import load_template
    from tests.support.corpus import make_play
    from tests.support.models import spread_model

    tok = minitf.Tokenizer.train([make_play(0)], 300)
    model = spread_model(vocab_size=tok.vocab_size, block_size=128)
    with pytest.raises(MinitfError) as e:
        minitf.chat(model, tok, [{"role": "user", "content": "Hi"}], template="{{ messages }}")
    assert str(e.value).startswith("the chat template from chat()'s template argument writes no special token")
    assert "it is not a chat template" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(minitf.ConfigError, match=r"^chat\(\): template must be a ChatTemplate or a Jinja source"):
        minitf.chat(model, tok, [{"role": "user", "content": "Hi"}], template=42)
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    tok.chat_template = load_template(tmp_path)
    with pytest.raises(MinitfError, match=f"^the chat template from {tmp_path / 'chat_template.jinja'} writes no"):
        minitf.chat(model, tok, [{"role": "user", "content": "Hi"}])
