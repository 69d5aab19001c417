"""What a run logs (metrics.jsonl, steps.jsonl, TensorBoard), fine-tuning from a local GPT-2
directory (run.init_from), and the note when a time budget bought far fewer steps than usual."""

import json
import math

import pytest
import torch

import minitf
from minitf.export import hf as minitf_hf
from minitf.training import setup
from minitf.training.metrics import METRICS, STEPS, read_rows

from .helpers import tiny_config, tiny_gpt2_config


def test_steps_are_logged_every_log_every_and_resume_drops_the_future(tmp_path, corpus):
    run = minitf.train(tiny_config(tmp_path / "run", corpus), log=lambda *a: None)  # 8 steps, log_every 2
    rows = read_rows(run / STEPS)
    assert [r["step"] for r in rows] == [2, 4, 6, 8]
    assert all(math.isfinite(r["loss"]) and r["lr"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["lr"] != rows[-1]["lr"]  # the schedule moved
    assert [r["step"] for r in read_rows(run / METRICS)] == [4, 8]  # evaluations stay in metrics.jsonl
    # a resume from step 4 (as after a kill) drops the rows past it, then logs them anew
    (run / STEPS).write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 10, "lo')  # a cut line
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["step"] == 8
    minitf.train(run, resume=True, overrides=["train.max_steps=12"], log=lambda *a: None)
    assert [r["step"] for r in read_rows(run / STEPS)] == [2, 4, 6, 8, 10, 12]


def test_tensorboard_event_files_hold_the_curves(tmp_path, corpus):
    pytest.importorskip("tensorboard", reason="pip install -e '.[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = minitf.train(tiny_config(tmp_path / "run", corpus, "train.logger=tensorboard"), log=lambda *a: None)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "eval/val_loss", "eval/val_bpb"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6, 8]
    steps = read_rows(run / STEPS)
    assert [e.value for e in events.Scalars("train/lr")] == pytest.approx([r["lr"] for r in steps])
    evals = read_rows(run / METRICS)
    assert [e.value for e in events.Scalars("eval/val_bpb")] == pytest.approx([r["val_bpb"] for r in evals])


def _gpt2_dir(tmp_path, corpus):
    """A small randomly initialised GPT-2 saved by transformers, with a tokenizer in GPT-2's own
    files (vocab.json + merges.txt): what a user has after downloading a model with their tools."""
    tf = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    tok = minitf.Tokenizer.train(texts, vocab_size=300)
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tiny_gpt2_config(tf, tok))
    out = tmp_path / "gpt2"
    hf.save_pretrained(out)
    tok.backend.model.save(str(out))  # vocab.json, merges.txt
    return out, hf, tok


def test_fine_tune_from_a_local_gpt2_then_sample_and_export(tmp_path, corpus):
    gpt2, hf, tok = _gpt2_dir(tmp_path, corpus)
    model, loaded_tok = minitf_hf.load_pretrained(gpt2)
    assert loaded_tok.encode("Romeo.\nO soft<|endoftext|>") == tok.encode("Romeo.\nO soft<|endoftext|>")
    ids = torch.tensor([tok.encode("But soft, what light")])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids)[0], hf.eval()(ids).logits, atol=1e-4, rtol=1e-4)
    # model.* in the config is replaced by the pretrained model's shape
    cfg = tiny_config(tmp_path / "ft", corpus, f"run.init_from={gpt2}", "model.n_layer=7", "data.vocab_size=999")
    lines = []
    run = minitf.train(cfg, log=lines.append)
    assert any(f"init_from {gpt2}" in line for line in lines)
    said = "fine-tune rates: lr 0.003, min_lr 0.0003, muon_lr 0.015 (train.lr, train.min_lr as set; "
    assert any(line.startswith(said) for line in lines)  # configs/tiny.yaml's lr and min_lr
    tuned, tuned_tok, tuned_cfg = minitf.load_run(run)
    assert tuned_cfg.train.muon_lr == pytest.approx(0.015)  # config.yaml keeps the rates a resume goes on with
    assert tuned_cfg.model.n_layer == 2 and tuned_cfg.model.block_size == 32 and tuned_tok.hash == tok.hash
    first = read_rows(run / METRICS)[0]
    assert first["train_loss"] < math.log(300) + 0.3  # trained from the pretrained weights, and they moved:
    assert not torch.equal(tuned.wte.weight[:300], model.wte.weight[:300])
    assert len(minitf.generate(tuned, tuned_tok, "Romeo.\n", max_new_tokens=10, seed=0)) > 0
    back = minitf_hf.to_hf_gpt2(tuned, tuned_tok, tmp_path / "back")
    tf = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    again = tf.GPT2LMHeadModel.from_pretrained(back).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, tuned(ids)[0], atol=1e-4, rtol=1e-4)
    resumed = minitf.train(run, resume=True, overrides=["train.max_steps=10"], log=lambda *a: None)
    assert torch.load(resumed / "state.pt", weights_only=True)["step"] == 10


@pytest.mark.parametrize(
    "overrides, rates",
    [
        ((), (1e-4, 1e-5, 5e-4)),  # every group lowered alike: Muon keeps the recipe's 5x lr
        (("train.lr=2e-4",), (2e-4, 2e-5, 1e-3)),  # the docs' command sets lr alone: muon_lr follows it
        (("train.lr=2e-4", "train.muon_lr=0.001", "train.min_lr=0"), (2e-4, 0.0, 1e-3)),  # the user's, kept
    ],
)
def test_a_fine_tune_gets_fine_tuning_rates_for_every_group(overrides, rates):
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", *overrides])
    line = setup.finetune_rates(cfg.train, cfg.given)
    assert (cfg.train.lr, cfg.train.min_lr, cfg.train.muon_lr) == pytest.approx(rates)
    assert line.startswith(f"fine-tune rates: lr {rates[0]:.3g}, min_lr {rates[1]:.3g}, muon_lr {rates[2]:.3g} (")
    assert ("as set" in line) == bool(overrides)


def test_a_recipe_floor_above_the_fine_tune_rate_is_one_line():
    cfg = minitf.load_config(overrides=["run.init_from=gpt2", "train.min_lr=3e-4"])
    with pytest.raises(minitf.ConfigError, match=r"train.min_lr=0.0003 is above a fine-tune's train.lr=0.0001; set"):
        setup.finetune_rates(cfg.train, cfg.given)


def test_init_from_mistakes_are_one_line(tmp_path, corpus):
    with pytest.raises(minitf.MinitfError, match="is not a directory"):
        minitf.train(tiny_config(tmp_path / "a", corpus, f"run.init_from={tmp_path / 'nope'}"), log=lambda *a: None)
    gpt2, _, _ = _gpt2_dir(tmp_path, corpus)
    (gpt2 / "vocab.json").unlink()
    with pytest.raises(minitf.MinitfError, match="holds no tokenizer"):
        minitf.train(tiny_config(tmp_path / "b", corpus, f"run.init_from={gpt2}"), log=lambda *a: None)


def test_a_short_budget_says_so(tmp_path, corpus):
    lines = []
    minitf.train(
        tiny_config(
            tmp_path / "run", corpus, "train.max_seconds=0.5", "train.max_steps=100000", "train.typical_steps=1000000"
        ),
        log=lines.append,
    )
    note = next(line for line in lines if line.startswith("note:"))
    assert (
        "under half the ~2381" in note
    )  # the 1000000 steps of 210 s, scaled to 0.5 s and "train.max_seconds=1" in note and "--resume" in note
    lines.clear()
    minitf.train(tiny_config(tmp_path / "b", corpus, "train.typical_steps=8"), log=lines.append)  # max_steps ends it
    assert not any(line.startswith("note:") for line in lines)
