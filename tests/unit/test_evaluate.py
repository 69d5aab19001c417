"""minitf.evaluate: every held-out token predicted once, with the model's own loss."""

import math

import pytest
import torch

import minitf

# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_evaluate_predicts_every_token_once_with_the_models_own_loss(tiny_run, corpus):
    from minitf.evaluate import evaluate_text

    model, tok, cfg = minitf.load_run(tiny_run)
    res = evaluate_text(model, tok, cfg.data, batch_size=3, log=lambda *a: None)
    val_text = (corpus / "play3.txt").read_text()  # 4 documents, val_fraction 0.1: the last is val
    ids = tok.encode(val_text)
    block, total = cfg.model.block_size, 0.0
    for start in range(0, len(ids) - 1, block):  # the model's own mean loss, window by window
        w = torch.tensor([ids[start : start + block + 1]])
        total += model(w[:, :-1], w[:, 1:])[1].item() * (w.size(1) - 1)
    assert res["val"]["tokens"] == len(ids) - 1
    assert res["val"]["loss"] == pytest.approx(total / (len(ids) - 1), rel=1e-5)
    bytes_per_token = len(val_text.encode("utf-8")) / len(ids)  # counted from the file, not from the cache
    assert res["val"]["bits_per_byte"] == pytest.approx(res["val"]["loss"] / math.log(2) / bytes_per_token)
    assert res["val"]["perplexity"] == pytest.approx(math.exp(res["val"]["loss"]))
    assert res["all"]["tokens"] == res["train"]["tokens"] + res["val"]["tokens"]
