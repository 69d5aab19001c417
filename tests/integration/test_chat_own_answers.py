"""A user's own conversations, as the generated corpus is: held-out lines that give an "answer" are
asked at every evaluation (val_exact in metrics.jsonl), and data.val_fraction=0 trains on every
conversation, its val numbers then the training conversations' own."""

import json

import pytest

import minitf
from minitf.conversations.answer import exact_match
from minitf.corpus.split import val_rule
from minitf.run_dir import load_run
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    """60 sums; every other line gives the answer to check ("42" for "The sum is 42.")."""
    path = tmp_path_factory.mktemp("sums") / "sums.jsonl"
    rows = []
    for i in range(60):
        a, b = i % 9, i // 9
        row = {
            "messages": [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        rows.append({**row, "answer": str(a + b)} if i % 2 else row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def run_on(tmp_path, chat_run, path, *overrides):
    cfg = minitf.load_config(
        ROOT / "configs" / "chat.yaml",
        [
            f"run.out_dir={tmp_path / 'run'}",
            f"run.init_from={chat_run}",
            f"data.source=file:{path}",
            "train.max_steps=2",
            "train.max_seconds=null",
            "train.eval_every=2",
            "train.eval_batches=1",
            "train.batch_size=4",
            "train.dtype=float32",
            *overrides,
        ],
    )
    logged = []
    return minitf.train(cfg, log=logged.append), logged


def test_held_out_lines_with_an_answer_are_asked_at_every_evaluation(tmp_path, chat_run, sums):
    path, rows = sums
    run, logged = run_on(tmp_path, chat_run, path, "data.val_fraction=0.2")
    last = [r for r in read_rows(run / METRICS) if "val_loss" in r][-1]
    is_val = val_rule(None, 0.2)
    asked = [r["messages"] for i, r in enumerate(rows) if is_val(i) and "answer" in r]
    model, tok, _ = load_run(run)
    assert len(asked) == 6 and last["val_exact"] == exact_match(model, tok, asked)["all"]
    assert not any("not computed" in str(line) for line in logged)


def test_a_file_without_answers_says_the_metric_is_off(tmp_path, chat_run, sums):
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in sums[1]))
    run, logged = run_on(tmp_path, chat_run, path)
    assert any('give conversations an "answer"' in str(line) for line in logged)
    assert all("val_exact" not in r for r in read_rows(run / METRICS))


def test_val_fraction_zero_trains_on_every_conversation(tmp_path, chat_run, sums):
    run, logged = run_on(tmp_path, chat_run, sums[0], "data.val_fraction=0")
    last = [r for r in read_rows(run / METRICS) if "val_loss" in r][-1]
    assert last["val_loss"] == last["train_loss"]  # the same batches: nothing is held out
    assert any("nothing is held out" in str(line) for line in logged)
    assert "val_exact" in last  # asked of the training lines that give an answer
