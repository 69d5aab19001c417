"""A chat run exported to GGUF carries its template and end-of-turn token: llama.cpp's own chat
(llama-cpp-python's create_chat_completion, which renders the file's tokenizer.chat_template)
gives minitf.chat's greedy answer, and ends it where minitf ends the turn."""

import pytest

import minitf
from minitf.chat_template import IM_END, TEMPLATE_FILE
from minitf.conversations.answer import chat
from tests.integration import test_gguf_llamacpp as gguf_tests
from tests.integration import test_hf_chat as hf_chat


@pytest.fixture(scope="module")
def llama_cpp():
    pytest.importorskip("gguf", reason=f"the gguf package is not installed ({gguf_tests.INSTALL})")
    return pytest.importorskip("llama_cpp", reason=f"llama-cpp-python is not installed ({gguf_tests.INSTALL})")


def test_the_file_carries_the_template_and_the_end_of_turn(llama_cpp, chat_run, tmp_path):
    _, tok, cfg = minitf.load_run(chat_run)
    llm = gguf_tests.load_llama(llama_cpp, gguf_tests.export(chat_run, tmp_path / "chat.gguf"), cfg.model.block_size)
    im_end = tok.backend.token_to_id(IM_END)
    assert llm.metadata["tokenizer.chat_template"] == (chat_run / TEMPLATE_FILE).read_text()
    assert llm.metadata["tokenizer.ggml.eot_token_id"] == str(im_end)
    assert llm.token_eos() == im_end and llm.token_bos() == tok.eot_id
    assert llm.chat_format == "chat_template.default"  # the file's own template, not a built-in guess


@pytest.mark.parametrize("ends", [False, True], ids=["as-trained", "ending-early"])
def test_llama_cpp_chat_gives_minitf_chats_answer(llama_cpp, chat_run, tmp_path, ends):
    """Greedy (temperature 0): the same text; "stop" where minitf.chat ended the turn before
    MAX_NEW tokens, "length" where it did not (the run changed to end early: test_hf_chat.py)."""
    from minitf.export.gguf import write_gguf

    model, tok, cfg = minitf.load_run(chat_run)
    if ends:
        model = hf_chat.ending_early(model, tok)
    path = tmp_path / "chat.gguf"
    write_gguf(model, tok, path)
    llm = gguf_tests.load_llama(llama_cpp, path, cfg.model.block_size)
    finishes = []
    for messages in hf_chat.CONVERSATIONS:
        want = chat(model, tok, messages, temperature=0.0, max_new_tokens=hf_chat.MAX_NEW)
        r = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=hf_chat.MAX_NEW)
        choice = r["choices"][0]
        assert choice["message"]["content"] == want
        assert r["usage"]["prompt_tokens"] == len(tok.chat_template.prompt_ids(tok, messages))
        said = r["usage"]["completion_tokens"]
        finishes.append((choice["finish_reason"], want))
        assert choice["finish_reason"] == ("stop" if said < hf_chat.MAX_NEW else "length")
    if ends:
        assert any(f == "stop" and text for f, text in finishes), finishes  # says something, then ends
