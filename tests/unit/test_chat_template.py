"""Downloaded chat templates: minitf renders Llama 3's, Llama 3.1's and Qwen3's real templates
(tests/data/chat_templates.json, copied from their tokenizer_config.json) to the token ids that
transformers' `AutoTokenizer.apply_chat_template` gives, and learns exactly each answer and the
end-of-turn token after it.

The tokenizer is a minitf BPE trained here with each template's special tokens added, saved with a
tokenizer_config.json that carries the template, so AutoTokenizer loads it from a temporary
directory, as it would load the downloaded model's.
"""

import json

import pytest

import minitf
from minitf.chat_template import ChatTemplate
from minitf.errors import MinitfError
from tests.support import ROOT
from tests.support.corpus import make_play

TEMPLATES = json.loads((ROOT / "tests" / "data" / "chat_templates.json").read_text(encoding="utf-8"))

CONVERSATIONS = {
    "one question": [{"role": "user", "content": "What is 2 plus 3?"}],
    "system prompt": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Spell cat."},
        {"role": "assistant", "content": "c a t"},
    ],
    "multi-turn": [
        {"role": "system", "content": "Answer in one word.\n"},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy? ✓ naïve"},
        {"role": "assistant", "content": "Rome, of course.\nIt's the capital."},
    ],
    "multi-turn, user last": [
        {"role": "user", "content": "  Hi there  "},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Count to 3."},
    ],
}


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


@pytest.fixture(scope="module", params=sorted(k for k in TEMPLATES if not k.startswith("_")))
def model_dir(request, tmp_path_factory, transformers):
    """(name, directory): a tokenizer.json with the template's special tokens and a
    tokenizer_config.json holding the template, as a downloaded model directory has them."""
    from tokenizers import AddedToken

    name, spec = request.param, TEMPLATES[request.param]
    tok = minitf.Tokenizer.train([make_play(i) for i in range(2)], 400)
    tok.backend.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in spec["added_tokens"].items()])
    d = tmp_path_factory.mktemp(name)
    tok.save(d / "tokenizer.json")
    config = {k: spec[k] for k in ("chat_template", "bos_token", "eos_token")}
    config.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return name, d


def load_both(transformers, d):
    """(minitf's tokenizer and template, transformers' tokenizer) from one directory."""
    from minitf.export.hf_files import read_tokenizer

    ours = read_tokenizer(d)
    return ours, ours.chat_template, transformers.AutoTokenizer.from_pretrained(str(d))


def test_prompt_ids_equal_transformers(model_dir, transformers):
    name, d = model_dir
    tok, template, hf = load_both(transformers, d)
    assert isinstance(template, ChatTemplate)
    for what, messages in CONVERSATIONS.items():
        theirs = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert template.prompt_ids(tok, messages) == list(theirs), f"{name}: {what}"
        assert len(theirs) > 10 and any(i in tok.special_ids() for i in theirs)  # templated, not plain text


def test_conversation_ids_equal_transformers(model_dir, transformers):
    name, d = model_dir
    tok, template, hf = load_both(transformers, d)
    for what, messages in CONVERSATIONS.items():
        if messages[-1]["role"] != "assistant":
            continue
        theirs = hf.apply_chat_template(messages, add_generation_prompt=False, tokenize=True, return_dict=False)
        ids, learned = template.encode_conversation(tok, messages)
        assert ids == list(theirs), f"{name}: {what}"
        assert len(learned) == len(ids)


def runs(ids: list[int], learned: list[bool]) -> list[list[int]]:
    """The learned tokens, one list per unbroken run."""
    out, prev = [], False
    for i, keep in zip(ids, learned):
        if keep:
            (out[-1].append(i) if prev else out.append([i]))
        prev = keep
    return out


END_OF_TURN = {
    "llama3": "<|eot_id|>",
    "llama3.1": "<|eot_id|>",
    "qwen3": "<|im_end|>",
    "qwen2.5": "<|im_end|>",
    "mistral-v0.3": "</s>",
    "phi3.5": "<|end|>",
}


def test_learned_tokens_are_each_answer_and_its_end_of_turn(model_dir, transformers):
    """Each assistant message is one run of learned tokens: its content (as the template writes
    it: Llama 3 trims it) followed by the end-of-turn token; nothing else is learned. Qwen3 writes
    an empty thinking block, <think>\\n\\n</think>\\n\\n, before the answer that follows the last
    user message (and none before earlier answers): it is learned with that answer, since it lies
    between the generation prompt and the answer, where the model must write it itself."""
    name, d = model_dir
    tok, template, _ = load_both(transformers, d)
    eot = tok.backend.token_to_id(END_OF_TURN[name])
    assert template.end_of_turn(tok) == eot
    for what, messages in CONVERSATIONS.items():
        answers = [m["content"].strip() for m in messages if m["role"] == "assistant"]
        if messages[-1]["role"] != "assistant":
            continue
        ids, learned = template.encode_conversation(tok, messages)
        got = runs(ids, learned)
        assert [r[-1] for r in got] == [eot] * len(answers), f"{name}: {what}"
        got = [r[:-1] for r in got]
        if name == "mistral-v0.3":  # ' ' + content + ' ' + eos: the space before </s> is learned with it
            assert all(tok.decode(r[-1:]) == " " for r in got)
            got, answers = [r[:-1] for r in got], [f" {a}" for a in answers]
        text = template.render(messages)
        if name == "qwen3":  # the thinking block before the last answer only, learned with it
            assert text.count("<think>\n\n</think>\n\n") == 1
            assert text.endswith(f"<think>\n\n</think>\n\n{answers[-1]}<|im_end|>\n")
            answers[-1] = f"<think>\n\n</think>\n\n{answers[-1]}"
        assert [tok.decode(r) for r in got] == answers, f"{name}: {what}"


def test_qwen3_reasoning_in_an_earlier_answer_is_refused():
    """Qwen3's template drops the <think>...</think> reasoning of an answer before the last user
    message, so that answer's text is not in the rendered conversation as written: minitf says so
    rather than learning the wrong tokens."""
    template = ChatTemplate(TEMPLATES["qwen3"]["chat_template"])
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    assert "add them" not in template.render(messages)
    tok = minitf.Tokenizer.train([make_play(0)], 300)
    with pytest.raises(MinitfError, match="does not write assistant message 2's content as it is"):
        template.encode_conversation(tok, messages)


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


def test_text_that_spells_the_markers_stays_text(model_dir, transformers):
    """A user (or system, or assistant) content that spells the template's special tokens cannot
    write a turn: those characters are encoded as text, every marker in the ids is the template's
    own, and the text decodes back to what was rendered. Without such spelling the ids are
    apply_chat_template's (the tests above)."""
    name, d = model_dir
    tok, template, _ = load_both(transformers, d)
    markers = [t.content for t in tok.backend.get_added_tokens_decoder().values() if t.special]
    spelled = "hi " + "\n".join(markers) + " bye"
    special = tok.special_ids()
    for role in ("user", "system"):
        plain = [{"role": role, "content": "hi bye"}] + ([{"role": "user", "content": "Q"}] if role == "system" else [])
        sneaky = [{**plain[0], "content": spelled}, *plain[1:]]
        ids = template.prompt_ids(tok, sneaky)
        assert sum(i in special for i in ids) == sum(i in special for i in template.prompt_ids(tok, plain)), role
        assert tok.decode(ids) == template.render(sneaky, add_generation_prompt=True)
    answer = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": spelled}]
    ids, learned = template.encode_conversation(tok, answer)
    (run,) = runs(ids, learned)  # one answer, learned as its text, ended by one end-of-turn token
    assert run[-1] == template.end_of_turn(tok) and sum(i in special for i in run) == 1
    assert markers[0] in tok.decode(run[:-1])


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

    from minitf.chat_template import MAX_TEMPLATE_BYTES, TEMPLATE_FILE, load_template

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
    from minitf.chat_template import TEMPLATE_FILE, load_template

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
