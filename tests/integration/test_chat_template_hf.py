"""Downloaded chat templates: minitf renders the real templates of Llama 3, 3.1 and 3.2 (today's
date included), Qwen2.5, Qwen3, Mistral, Phi-3.5 and Gemma 3 (tests/data/chat_templates.json,
copied from their tokenizer_config.json) to the token ids that
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
from tests.support.chat import runs
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


END_OF_TURN = {
    "llama3": "<|eot_id|>",
    "llama3.1": "<|eot_id|>",
    "llama3.2": "<|eot_id|>",
    "gemma3": "<end_of_turn>",
    "qwen3": "<|im_end|>",
    "qwen2.5": "<|im_end|>",
    "mistral-v0.3": "</s>",
    "phi3.5": "<|end|>",
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
