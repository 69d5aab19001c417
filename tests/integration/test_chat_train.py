"""Chat fine-tuning, full and LoRA (train.lora_rank, through peft): an interrupted run resumes bit
for bit; a LoRA run trains only its adapters and says how many; its model.safetensors holds the
merged weights, which give the adapted model's logits; without peft it is one line naming the extra."""

import builtins
import json

import pytest
import torch
from safetensors.torch import load_file

import minitf
from minitf.conversations.sft import template_tokens
from minitf.run_dir import load_run
from minitf.training import lora
from minitf.training.metrics import METRICS, read_rows
from tests.support import ROOT
from tests.support.processes import script
from tests.support.runs import QUIET, train_with_snapshot

LORA = ("train.lora_rank=4", "train.lora_alpha=8", "train.lora_dropout=0.1")  # AdamW: chosen by LoRA itself
EMBEDDING = "lm_head.weight"  # a tied embedding's one name in a weights file


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """A small conversation file (OpenAI-style messages): no held-out exact-match questions to
    generate answers for at each evaluation, so the tests stay quick."""
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": str(a + b)},
            ]
        }
        for a in range(20)
        for b in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_config(run, init_from, chats, *overrides) -> minitf.Config:
    """configs/chat.yaml from init_from (a chat run: its ChatML tokens are there already) on the
    chats file, 4 steps, a checkpoint every 2, in float32."""
    return minitf.load_config(
        ROOT / "configs" / "chat.yaml",
        [
            f"run.out_dir={run}",
            f"run.init_from={init_from}",
            f"data.source=file:{chats}",
            "train.max_steps=4",
            "train.max_seconds=null",
            "train.eval_every=100",
            "train.ckpt_every=2",
            "train.eval_batches=1",
            "train.batch_size=4",
            "train.grad_accum=2",
            "train.warmup_steps=2",
            "train.dtype=float32",
            *overrides,
        ],
    )


def assert_same_weights(a, b):
    a, b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("method", [(), LORA], ids=["full", "lora"])
def test_sft_resumes_bit_identically(tmp_path, chat_run, chats, monkeypatch, method):
    if method:
        pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    snapshot = tmp_path / "at-step-2"
    straight = train_with_snapshot(
        sft_config(tmp_path / "straight", chat_run, chats, *method), snapshot, 2, monkeypatch
    )
    resumed = minitf.train(snapshot, resume=True, **QUIET)
    assert_same_weights(straight, resumed)
    assert [r["step"] for r in read_rows(resumed / METRICS)] == [4]
    # the run moved away from where it started (a LoRA run's adapters are not stuck at B = 0)
    start = load_file(chat_run / "model.safetensors")
    final = load_file(resumed / "model.safetensors")
    assert not torch.equal(start["blocks.0.attn.c_attn.weight"], final["blocks.0.attn.c_attn.weight"])
    if method:  # LoRA: ChatML's two rows learned, and resumed bit for bit; every other row is the base's
        new = template_tokens(load_run(resumed)[1])
        before, after = start[EMBEDDING], final[EMBEDDING]
        assert all(not torch.equal(before[i], after[i]) for i in new)
        first, last = new[0], new[-1]
        assert torch.equal(before[:first], after[:first]) and torch.equal(before[last + 1 :], after[last + 1 :])


def test_lora_trains_its_adapters_and_the_templates_rows_and_says_how_many(tmp_path, chat_run, chats):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    lines = []
    run = minitf.train(sft_config(tmp_path / "run", chat_run, chats, *LORA), log=lines.append)
    model, tokenizer, cfg = load_run(chat_run)
    # rank 4 on every linear layer of the blocks: A is (4, in), B (out, 4); and ChatML's two rows (tied head)
    adapted = [m for name, m in model.named_modules() if name.startswith("blocks.") and isinstance(m, torch.nn.Linear)]
    expected = sum(4 * (m.in_features + m.out_features) for m in adapted) + 2 * cfg.model.n_embd
    said = [line for line in lines if line.startswith("LoRA (peft)")]
    assert said and f"{expected:,} trainable parameters of" in said[0], lines
    assert "and the rows of tokens 300, 301 (the chat template's)" in said[0]
    # only the adapters and the two rows moved: every other weight is the base's, bit for bit
    base, merged = load_file(chat_run / "model.safetensors"), load_file(run / "model.safetensors")
    assert base.keys() == merged.keys()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    blocks = {k for k in changed if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))}
    assert blocks and changed == blocks | {EMBEDDING}, changed
    rows = [i for i in range(len(base[EMBEDDING])) if not torch.equal(base[EMBEDDING][i], merged[EMBEDDING][i])]
    assert rows == template_tokens(tokenizer) == [300, 301]
    state = torch.load(run / "state.pt", weights_only=True)
    adam = state["optimizer"]["state"]
    assert sum(s["exp_avg"].numel() for s in adam.values()) == expected  # AdamW's moments: adapters and rows only


def test_a_lora_chat_run_from_a_base_model_learns_to_end_its_turn(tmp_path, tiny_run):
    """A base model has no ChatML tokens: the run adds them, and under LoRA their rows must learn or
    no answer could end (before, <|im_end|>'s head row stayed at the mean, as <|im_start|>'s did, and
    greedy decoding chose <|im_start|> at every step: the answer ran to max_new_tokens). One
    conversation, a few steps: the answer begins as it should and ends. (How much of "hello" comes
    out is not the point: the 30-step base's frozen rows and norms give its words small logits.)"""
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    chats = tmp_path / "hi.jsonl"
    talk = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    chats.write_text((json.dumps(talk) + "\n") * 16)
    overrides = ("train.max_steps=40", "train.ckpt_every=40", "train.lr=2e-3", "train.min_lr=2e-4")  # x 5: LoRA's
    run = minitf.train(sft_config(tmp_path / "run", tiny_run, chats, *LORA, *overrides), **QUIET)
    model, tokenizer, _ = load_run(run)
    assert tokenizer.vocab_size == load_run(tiny_run)[1].vocab_size + 2  # the run added ChatML's two tokens
    info = {}
    answer = minitf.chat(model, tokenizer, talk["messages"][:1], temperature=0, max_new_tokens=20, info=info)
    assert answer and "hello".startswith(answer), answer
    assert info["tokens"][0] <= len(tokenizer.encode("hello")) + 1, (answer, info)  # ended by <|im_end|>


def test_lora_merged_weights_give_the_adapted_models_logits(chat_run):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    tc = minitf.load_config(None, ["train.lora_rank=4", "train.optimizer=adamw"]).train
    model = load_run(chat_run)[0]
    model = lora.adapt(model.float(), tc, log=lambda *a: None)
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # B = 0 would make the test vacuous: random adapters
        if ".lora_" in name:
            p.data.normal_(0, 0.05)
    idx = torch.randint(0, model.config.vocab_size, (2, 32))
    merged = lora.merged_model(model).eval()
    assert not lora.is_adapted(merged) and lora.is_adapted(model)
    with torch.no_grad():
        adapted_logits, plain_logits = model.eval()(idx)[0], merged(idx)[0]
    assert (adapted_logits - plain_logits).abs().max() <= 1e-5
    base = load_run(chat_run)[0]
    with torch.no_grad():
        assert (base.eval()(idx)[0] - plain_logits).abs().max() > 1e-2  # the adapters did change the model


def test_lora_without_peft_is_one_line_naming_the_extra(tmp_path, chat_run, chats, monkeypatch):
    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(minitf.MinitfError) as e:
        minitf.train(sft_config(tmp_path / "run", chat_run, chats, *LORA), **QUIET)
    assert str(e.value) == lora.NO_PEFT and "\n" not in str(e.value) and "'.[lora]'" in str(e.value)


def test_lora_with_muon_or_unknown_targets_is_refused(tmp_path, chat_run, chats):
    with pytest.raises(minitf.ConfigError, match="remove train.optimizer=muon"):
        sft_config(tmp_path / "a", chat_run, chats, "train.lora_rank=4", "train.optimizer=muon")
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    with pytest.raises(minitf.MinitfError, match=r"train.lora_targets='q_proj' names q_proj"):
        minitf.train(sft_config(tmp_path / "b", chat_run, chats, *LORA, "train.lora_targets=q_proj"), **QUIET)


@pytest.mark.slow
def test_the_lora_benchmark_measures_both_methods(tmp_path):
    """bench/lora.py end to end at a tiny size: a full and a LoRA process, each with its own peak
    and speed (timings are printed, never asserted), and LoRA with far fewer trainable parameters."""
    pytest.importorskip("peft", reason="LoRA needs the lora extra (pip install -e '.[lora]')")
    out = tmp_path / "lora.json"
    r = script("-m", "bench.lora", "--tiny", "--rounds", "1", "--steps", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    full, lora_run = result["runs"]
    assert (full["method"], lora_run["method"]) == ("full", "lora")
    assert lora_run["trainable"] < full["trainable"] / 3
    moments = 2 * 4 * lora_run["trainable"]  # AdamW's two float32 moments, of the adapters only (and a step count each)
    assert moments <= lora_run["held_bytes"]["adamw"] < moments + 1024
    assert all(run["peak_rss"] >= run["rss_before_model"] > 0 and run["tokens_per_s"] > 0 for run in (full, lora_run))
