"""Reinforcement learning in the one loop (data.format=rl, configs/rl.yaml) from the tests' chat
run: the answers are sampled as the library samples them, a run steps and reports its rewards,
resumes bit for bit (the sampling included), steps with LoRA, and a reward that breaks or a batch
that does not hold whole groups is one line."""

import json

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.config import SampleConfig
from minitf.generate import generate_tokens
from minitf.rl.rollouts import sample_group
from minitf.run_dir import load_run
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.processes import command
from tests.support.runs import QUIET, train_with_snapshot

QUESTION = [{"role": "user", "content": "What is 3 plus 4?"}]


def rl_overrides(run, chat_run, *more) -> list[str]:
    """configs/rl.yaml from the chat run on its own 2,000 conversations: 4 steps of 2 prompts x 4
    answers of up to 8 tokens, one evaluation at the end, in float32; shorter answers rewarded
    (tests/support/rewards.py: the tests' young chat run answers nothing right)."""
    return [
        f"run.out_dir={run}",
        f"run.init_from={chat_run}",
        "data.max_documents=2000",
        "data.skip_invalid=true",
        "rl.group_size=4",
        "rl.answer_tokens=8",
        "train.batch_size=8",
        "train.max_steps=4",
        "train.max_seconds=null",
        "train.eval_every=100",
        "train.ckpt_every=2",
        "train.eval_batches=1",
        "train.lr=1e-3",
        "train.dtype=float32",
        "rl.reward=tests.support.rewards:shorter",
        *more,
    ]


def rl_config(run, chat_run, *more) -> minitf.Config:
    return minitf.load_config(ROOT / "configs" / "rl.yaml", rl_overrides(run, chat_run, *more))


def test_a_group_is_what_the_librarys_sampler_draws_for_the_seed(chat_run):
    model, tok, _ = load_run(chat_run)
    template = tok.chat_template
    ids = template.prompt_ids(tok, QUESTION)
    settings = SampleConfig(temperature=1.0, top_k=None, max_new_tokens=10, seed=7)
    drawn = torch.stack(list(generate_tokens(model, ids, settings, num_samples=6)), dim=1).tolist()  # (6, 10)
    # each answer ends at its end of turn (kept); the tests' chat run is too young to write one, so a
    # token it does write stands in as the end too
    for end in (template.end_of_turn(tok), drawn[0][3]):
        group = sample_group(model, ids, 6, 10, end, torch.Generator().manual_seed(7))
        assert group == [d[: d.index(end) + 1] if end in d else d for d in drawn]
    assert len(group[0]) == 4 and group[0][-1] == end


def test_an_rl_run_steps_and_reports_its_rewards(tmp_path, chat_run):
    run = minitf.train(rl_config(tmp_path / "run", chat_run), **QUIET)
    (last,) = [r for r in read_rows(run / METRICS) if "val_loss" in r]
    assert last["step"] == 4 and 0 <= last["reward_mean"] <= 1 and 0 <= last["val_exact"] <= 1
    assert 0 <= last["groups_learning"] <= last["groups_rewarded"] or last["groups_learning"] <= 1
    assert 1 <= last["answer_tokens"] <= 8
    start, end = load_file(chat_run / "model.safetensors"), load_file(run / "model.safetensors")
    assert any(not torch.equal(start[k], end[k]) for k in start)  # it learned something
    assert load_run(run)[1].chat_template is not None  # still a chat model: minitf chat talks to it
    from minitf.web.explore.api import Explorer  # the explorer's run panel draws the reward beside the loss

    curve = Explorer(run).loss_curve()
    assert curve["points"][-1]["reward_mean"] == last["reward_mean"]
    # the watched prompts' groups at that evaluation: each answer's advantage is its reward less the group's mean
    ((step, groups),) = [(w["step"], w["groups"]) for w in curve["watched"]]
    assert step == 4 and len(groups) == 3
    for group in groups:
        rewards = [a["reward"] for a in group["answers"]]
        assert len(rewards) == 4 and all(r == 1 / (1 + len(a["text"])) for r, a in zip(rewards, group["answers"]))
        mean = sum(rewards) / 4
        assert [a["advantage"] for a in group["answers"]] == [round(r - mean, 4) for r in rewards]
        assert all("".join(a["tokens"]) == a["text"] for a in group["answers"])


def test_rl_resumes_bit_identically(tmp_path, chat_run, monkeypatch):
    snapshot = tmp_path / "at-step-2"
    straight = train_with_snapshot(rl_config(tmp_path / "straight", chat_run), snapshot, 2, monkeypatch)
    resumed = minitf.train(snapshot, resume=True, **QUIET)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [r for r in read_rows(resumed / METRICS) if "reward_mean" in r]
    assert [r["step"] for r in rows] == [4]


def test_lora_rl_trains_its_adapters_only(tmp_path, chat_run):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    run = minitf.train(rl_config(tmp_path / "run", chat_run, "train.lora_rank=4"), **QUIET)
    base, merged = load_file(chat_run / "model.safetensors"), load_file(run / "model.safetensors")
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    adapted = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
    rows = ("wte.weight", "lm_head.weight")  # the rows of the template's tokens, which LoRA trains too
    assert {k for k in changed if k.endswith(adapted)} and all(k.endswith(adapted + rows) for k in changed), changed


def test_a_broken_reward_or_a_split_group_is_one_line(tmp_path, chat_run, monkeypatch):
    (tmp_path / "badreward.py").write_text("def score(messages, answer, expected):\n    return float('nan')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["--config", "rl", *rl_overrides(tmp_path / "a", chat_run, "rl.reward=badreward:score")]
    r = command("train", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines[-1].startswith("error: rl.reward=badreward:score on the prompt '"), r.stderr
    assert lines[-1].endswith("returned nan; a reward must be a finite number") and "Traceback" not in r.stderr
    r = command("train", "--config", "rl", *rl_overrides(tmp_path / "b", chat_run, "train.batch_size=6"))
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: train.batch_size=6 answers per micro-batch is not a multiple of rl.group_size=4; "
        "set train.batch_size to a multiple (e.g. 8)"
    )


def test_your_own_prompts_with_answers(tmp_path, chat_run):
    path = tmp_path / "prompts.jsonl"
    rows = [
        {
            "messages": [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": "?"}],
            "answer": str(a + b),
        }
        for a in range(6)
        for b in range(5)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = []
    own = (f"data.source=file:{path}", "train.max_steps=2", "rl.reward=exact")
    run = minitf.train(rl_config(tmp_path / "run", chat_run, *own), log=lines.append)
    (last,) = [r for r in read_rows(run / METRICS) if "val_loss" in r]
    assert "reward_mean" in last and "val_exact" in last
    assert any("prompts x 4 sampled answers of up to 8 tokens" in str(line) for line in lines)


def test_prompts_without_an_answer_need_a_reward_of_your_own(tmp_path, chat_run):
    path = tmp_path / "plain.jsonl"
    line = {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]}
    path.write_text((json.dumps(line) + "\n") * 20)
    r = command(
        "train",
        "--config",
        "rl",
        *rl_overrides(tmp_path / "a", chat_run, f"data.source=file:{path}", "rl.reward=exact"),
    )
    assert r.returncode == 2 and "holds no prompt with an answer to check, which rl.reward=exact needs" in r.stderr
    run = minitf.train(rl_config(tmp_path / "b", chat_run, f"data.source=file:{path}", "train.max_steps=1"), **QUIET)
    assert [r["step"] for r in read_rows(run / METRICS) if "reward_mean" in r] == [
        1
    ]  # shorter's rewards: no answer needed
