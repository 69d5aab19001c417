"""The loss mask and the batches of supervised fine-tuning: only the answers (and the end of each
turn) are learned, a row is one conversation from its start, micro-batches count by learned
tokens, and a base model's new ChatML rows start at the mean."""

import json

import pytest
import torch

from minitf.chat_template import IM_END, add_chat_tokens, chatml
from minitf.config import DataConfig, ModelConfig
from minitf.conversations.cache import prepare_chat_data
from minitf.conversations.sft import grow_vocab
from minitf.data import IGNORE
from minitf.model import Transformer
from minitf.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And the assistant says?"},
    {"role": "assistant", "content": "assistant"},  # its own role's name: the mask must not take the header's
]


@pytest.fixture(scope="module")
def tok():
    return add_chat_tokens(Tokenizer.train(["What is 2 plus 3? Be terse, assistant. " * 30], 320))


def test_chatml_renders_as_qwen_writes_it():
    assert chatml().render(CONVERSATION[:3], add_generation_prompt=False) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n"
    )
    assert chatml().render(CONVERSATION[:2], add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_the_mask_learns_each_answer_and_its_end_of_turn_only(tok):
    ids, learned = chatml().encode_conversation(tok, CONVERSATION)
    assert tok.decode(ids) == chatml().render(CONVERSATION)
    runs, run = [], []
    for i, flag in zip(ids, learned):
        if flag:
            run.append(i)
        elif run:
            runs, run = [*runs, tok.decode(run)], []
    assert runs == [f"5{IM_END}", f"assistant{IM_END}"]
    assert chatml().end_of_turn(tok) == tok.backend.token_to_id(IM_END)


def test_chat_tokens_are_added_after_the_vocabulary_and_split_text_as_before(tok):
    base = Tokenizer.train(["What is 2 plus 3? Be terse, assistant. " * 30], 320)
    assert tok.vocab_size == base.vocab_size + 2
    text = "What is 2 plus 3?\nBe terse."
    assert tok.encode(text) == base.encode(text)
    assert tok.encode(IM_END) == [base.vocab_size + 1]
    assert add_chat_tokens(tok).vocab_size == tok.vocab_size  # twice: nothing more


def test_a_batch_row_is_one_conversation_with_only_answers_as_targets(tmp_path, tok):
    lines = [{"messages": CONVERSATION}, {"messages": CONVERSATION[1:3]}] * 10
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = prepare_chat_data(DataConfig(source=f"file:{tmp_path}/c.jsonl", format="chat"), tok, chatml(), log=str)
    x, y = data.get_batch("train", 6, 256, torch.Generator().manual_seed(0))
    full, _ = chatml().encode_conversation(tok, CONVERSATION)
    short, _ = chatml().encode_conversation(tok, CONVERSATION[1:3])
    assert x.shape == y.shape == (6, len(full) - 1)  # the longest row of the batch, not block_size
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        ids = full if row_x[: len(full) - 1] == full[:-1] else short
        assert row_x[: len(ids) - 1] == ids[:-1]  # from the conversation's first token
        kept = [t for t in row_y if t != IGNORE]
        assert tok.decode(kept) == ("5" + IM_END + "assistant" + IM_END if ids is full else "5" + IM_END)
    x, y = data.get_batch("train", 6, 8, torch.Generator().manual_seed(0))
    assert x.shape == (6, 8)  # cut at block_size


def test_grown_rows_start_at_the_mean_and_old_logits_keep_their_order():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=16)).eval()
    grown = grow_vocab(model, 66).eval()
    w = grown.wte.weight
    assert torch.equal(w[:64], model.wte.weight[:64])
    assert torch.allclose(w[64], model.wte.weight[:64].mean(0)) and torch.equal(w[64], w[65])
    idx = torch.randint(64, (1, 10))
    old, new = model(idx)[0], grown(idx)[0]  # (1, 10, 64), (1, 10, 66)
    assert torch.allclose(new[..., :64], old, atol=1e-6)  # the same function of the old tokens
