"""A chat run exported to Hugging Face carries its template: transformers' apply_chat_template gives
minitf's prompt ids, and greedy `generate` stops at the end of the turn with minitf.chat's answer."""

import json

import pytest
import torch

import minitf
from minitf.chat_template import IM_END, TEMPLATE_FILE
from minitf.conversations.answer import chat

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 plus 3?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Spell dog."}],
    [
        {"role": "user", "content": "What is 4 plus 4?"},
        {"role": "assistant", "content": "8"},
        {"role": "user", "content": "What is 1 plus 2?"},
    ],
]
MAX_NEW = 60


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")


def test_the_export_carries_the_template_and_the_end_of_turn(chat_run, tf, tmp_path):
    from minitf.export.hf import to_hf

    model, tok, _ = minitf.load_run(chat_run)
    exported, _ = to_hf(model, tok, tmp_path / "hf")
    source = (chat_run / TEMPLATE_FILE).read_text()
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["chat_template"] == source == (exported / TEMPLATE_FILE).read_text()
    assert config["eos_token"] == IM_END
    im_end = tok.backend.token_to_id(IM_END)
    assert tf.GenerationConfig.from_pretrained(exported).eos_token_id == [im_end, tok.eot_id]
    hf_tok = tf.AutoTokenizer.from_pretrained(exported)
    assert hf_tok.eos_token == IM_END and hf_tok.eos_token_id == im_end
    for messages in CONVERSATIONS:
        theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert list(theirs) == tok.chat_template.prompt_ids(tok, messages)


def ending_early(model, tok):
    """The chat run, changed so that a greedy answer ends after a few tokens: its head is untied
    from the embedding (prompts read as before) and <|im_end|>'s output row becomes 1.001 times the
    row of a token that some answer gives after a different first token, so <|im_end|> wins there."""
    for messages in CONVERSATIONS:
        ids = tok.encode(chat(model, tok, messages, temperature=0.0, max_new_tokens=MAX_NEW))
        later = [i for i in ids[1:] if i != ids[0]]
        if later:
            break
    else:
        pytest.fail("every greedy answer of the chat run repeats one token: none can end after saying something")
    head = model.lm_head.weight.detach().clone()  # (padded V, C)
    head[tok.backend.token_to_id(IM_END)] = 1.001 * head[later[0]]
    model.lm_head.weight = torch.nn.Parameter(head)
    model.config.tie_embeddings = False
    return model


@pytest.mark.parametrize("ends", [False, True], ids=["as-trained", "ending-early"])
def test_greedy_generate_gives_minitf_chats_answer(tf, chat_run, tmp_path, ends):
    """Greedy decoding in transformers, from apply_chat_template's prompt, gives minitf.chat's greedy
    answer: the trained run's, cut at MAX_NEW tokens, and a run whose answers end early, where
    generate stops at <|im_end|> exactly where minitf.chat ends the turn."""
    from minitf.export.hf import to_hf

    model, tok, _ = minitf.load_run(chat_run)
    if ends:
        model = ending_early(model, tok)
    exported, _ = to_hf(model, tok, tmp_path / "hf")
    hf = tf.AutoModelForCausalLM.from_pretrained(exported).eval()
    hf_tok = tf.AutoTokenizer.from_pretrained(exported)
    im_end, lengths, stops = tok.backend.token_to_id(IM_END), [], []
    for messages in CONVERSATIONS:
        want = chat(model, tok, messages, temperature=0.0, max_new_tokens=MAX_NEW)
        prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = hf.generate(**prompt, do_sample=False, max_new_tokens=MAX_NEW)
        new = out[0, prompt["input_ids"].shape[1] :].tolist()  # (new tokens,)
        ended = new[-1] == im_end
        assert hf_tok.decode(new, skip_special_tokens=True) == want
        assert tok.decode(new[:-1] if ended else new) == want
        assert (ended or len(new) == MAX_NEW) and im_end not in new[:-1]  # it stops at the end of the turn only
        stops.append(ended)
        lengths.append(len(new))
    if ends:
        assert any(n >= 2 for n, stop in zip(lengths, stops) if stop), lengths  # an answer says something, then ends
