"""The questions a chat run's evaluation asks (train.eval_metric=exact_answers): the held-out
conversations of the generated corpus, and those of a user's file that give an "answer"; and
data.val_fraction=0, which holds nothing out and says the val numbers are the training ones."""

import json

import pytest

import minitf
from minitf.chat_template import add_chat_tokens, chatml
from minitf.config import DataConfig
from minitf.conversations.cache import prepare_chat_data
from minitf.conversations.rules import BadConversation
from minitf.corpus import chat_corpus
from minitf.corpus.split import val_rule
from minitf.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok():
    return add_chat_tokens(Tokenizer.train(["Hello there, what is 12 plus 30? 42 " * 20], 300))


def sums(n: int, answer_every: int = 3) -> list[dict]:
    """n conversations "What is a plus b?" -> "The sum is a+b.", every answer_every-th giving "answer": "a+b"."""
    rows = []
    for i in range(n):
        row = {
            "messages": [
                {"role": "user", "content": f"What is {i} plus 2?"},
                {"role": "assistant", "content": f"The sum is {i + 2}."},
            ]
        }
        if i % answer_every == 0:
            row["answer"] = str(i + 2)
        rows.append(row)
    return rows


def prepare(tmp_path, tok, rows, logged=None, data_format="chat", **keys):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = logged.append if logged is not None else lambda line: None
    return prepare_chat_data(DataConfig(source=f"file:{path}", format=data_format, **keys), tok, chatml(), log=log)


def test_the_generated_corpus_asks_every_held_out_conversation(tok):
    data = prepare_chat_data(DataConfig(source="chat", format="chat", max_documents=100), tok, chatml(), log=print)
    every, is_val = chat_corpus.conversations(), val_rule(None, 0.1)
    held = [c for i, c in enumerate(every[:100]) if is_val(i)]
    assert len(held) == 10 and held[0] is every[5] and held[1] is every[15]  # one in ten, spread evenly
    assert data.questions == [{"messages": c[:-1], "answer": c[-1]["content"]} for c in held]
    trained = [c for i, c in enumerate(every[:100]) if not is_val(i)]  # RL's prompts: never a held-out one
    assert data.prompts == [{"messages": c[:-1], "answer": c[-1]["content"]} for c in trained]


def test_a_users_file_is_asked_its_held_out_lines_with_an_answer(tmp_path, tok):
    rows = sums(60)
    data = prepare(tmp_path, tok, rows)
    is_val = val_rule(None, 0.1)
    want = [
        {"messages": r["messages"][:1], "answer": r["answer"]}
        for i, r in enumerate(rows)
        if is_val(i) and "answer" in r
    ]
    assert want and data.questions == want  # lines 5, 15, 25, ...: those of them that give an answer
    assert prepare(tmp_path / "none", tok, sums(60, answer_every=10**9)).questions == []  # no answer: nothing to ask


@pytest.mark.parametrize("answer", [42, "", "  ", ["4", "2"], None])
def test_an_answer_that_is_not_text_is_one_line_naming_the_line(tmp_path, tok, answer):
    rows = sums(20)
    rows[3]["answer"] = answer
    if answer is None:  # "answer": null is no answer at all
        assert prepare(tmp_path, tok, rows).meta["splits"]["train"]["conversations"] == 18
        return
    with pytest.raises(BadConversation) as e:
        prepare(tmp_path, tok, rows)
    assert str(e.value).startswith(f'{tmp_path / "chats.jsonl"}:4: "answer" must be the text its last question')


def test_val_fraction_zero_holds_nothing_out_and_says_so(tmp_path, tok):
    logged = []
    data = prepare(tmp_path, tok, sums(30), logged, val_fraction=0)
    assert data.meta["splits"]["val"]["conversations"] == 0
    assert data.meta["splits"]["train"]["conversations"] == 30
    assert any("nothing is held out" in line for line in logged)
    import torch

    a = data.get_batch("val", 4, 64, torch.Generator().manual_seed(0))
    b = data.get_batch("train", 4, 64, torch.Generator().manual_seed(0))
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # val reads the training conversations
    assert data.bytes_per_token("val") == data.bytes_per_token("train")
    assert [q["answer"] for q in data.questions] == [str(i + 2) for i in range(0, 30, 3)]  # asked of training lines
    with pytest.raises(minitf.ConfigError, match=r"0, nothing held out, is for conversations: data.format=chat"):
        DataConfig(val_fraction=0).validate()


def test_rl_takes_questions_alone_beside_whole_conversations(tmp_path, tok):
    """data.format=rl: a line that ends with the user's question is a prompt to answer (with its
    "answer", or none for a reward of your own), never tokenized for imitation; for fine-tuning
    (data.format=chat) the same line is a conversation with no answer, one line naming it."""
    rows = sums(30)
    asks = [{"messages": [{"role": "user", "content": f"Name a number bigger than {n}."}]} for n in range(10)]
    rows = rows[:10] + asks + rows[10:]
    data = prepare(tmp_path, tok, rows, data_format="rl")
    conversations = data.meta["splits"]["train"]["conversations"] + data.meta["splits"]["val"]["conversations"]
    assert conversations == 30  # the questions alone are not imitated
    is_val = val_rule(None, 0.1)
    asked = [r["messages"] for i, r in enumerate(rows) if "Name" in r["messages"][-1]["content"] and not is_val(i)]
    assert [
        p["messages"] for p in data.prompts if p["answer"] is None and "Name" in p["messages"][-1]["content"]
    ] == asked
    with pytest.raises(BadConversation, match=r"chats.jsonl:11: it has no assistant turn"):
        prepare(tmp_path / "chat", tok, rows)
