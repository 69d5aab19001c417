"""The explorer's heads and attribution views (POST /api/heads, /api/attribution) over a trained
run: the numbers are minitf.interpret's on the window the model read, and bad input is one line."""

import pytest
import torch

from minitf.interpret import ablate, attribute, head_scores
from minitf.web.explore.api import BadRequest, Explorer


@pytest.fixture(scope="module")
def ex(tiny_run):
    return Explorer(tiny_run)


@pytest.fixture(scope="module")
def ids(ex):
    return ex.tok.encode("ROMEO: O love, sweet night! ROMEO: O love")


def test_heads_view_scores_and_switches_heads_off(ex, ids):
    m = ex.cfg.model
    position = len(ids) - 2
    window = ids[: position + 1]
    full = ex.heads({"ids": ids, "position": position})
    want = head_scores(ex.model, window)
    for name, s in want.items():
        torch.testing.assert_close(torch.tensor(full["scores"][name]), s, atol=1e-6, rtol=0)
    assert len(full["scores"]["induction"]) == m.n_layer and len(full["scores"]["induction"][0]) == m.n_head
    assert full["heads"] == [] and all(t["before"] == t["after"] for t in full["tokens"])
    assert full["loss"]["before"] == full["loss"]["after"] and full["token"]["id"] == ids[position]

    off = ex.heads({"ids": ids, "position": position, "heads": [[0, 1], [m.n_layer - 1, 0]], "mode": "mean", "top": 3})
    ab = ablate(ex.model, window, [(0, 1), (m.n_layer - 1, 0)], mode="mean")
    assert off["heads"] == [[0, 1], [m.n_layer - 1, 0]] and off["mode"] == "mean"
    assert off["loss"]["after"] == pytest.approx(ab.loss_after, abs=1e-6)
    assert 3 <= len(off["tokens"]) <= 6  # the top 3 of each run
    for t in off["tokens"]:
        assert t["before"] == pytest.approx(float(ab.probs_before[0, t["id"]]), abs=1e-6)
        assert t["after"] == pytest.approx(float(ab.probs_after[0, t["id"]]), abs=1e-6)
    assert [t["rank"] for t in off["tokens"][:3]] == [1, 2, 3]


def test_attribution_view_adds_up_to_the_logit_of_the_next_token(ex, ids):
    position = 5
    d = ex.attribution({"ids": ids, "position": position})
    assert d["target"]["id"] == ids[position + 1] == d["next"]["id"]  # by default, the token that follows
    a = attribute(ex.model, ids[: position + 1], ids[position + 1])
    assert d["logit"] == pytest.approx(a.logit, abs=1e-5)
    parts = sum(d["parts"].values()) + sum(map(sum, d["heads"])) + sum(d["attn_bias"]) + sum(d["ffn"])
    assert parts == pytest.approx(d["logit"], abs=1e-4)
    with torch.no_grad():
        logits, _ = ex.model(torch.tensor([ids[: position + 1]]))
    assert d["logit"] == pytest.approx(float(logits[0, -1, ids[position + 1]]), abs=1e-4)
    assert len(d["choices"]) == 5 and d["choices"][0]["id"] == int(logits[0, -1].argmax())
    # the last position has no next token on the page: the model's likeliest; a difference on request
    last = ex.attribution({"ids": ids, "position": len(ids) - 1})
    assert last["next"] is None and last["target"]["id"] == last["choices"][0]["id"]
    diff = ex.attribution({"ids": ids, "position": position, "token": 7, "against": 9})
    assert diff["logit"] == pytest.approx(attribute(ex.model, ids[: position + 1], 7, against=9).logit, abs=1e-5)


@pytest.mark.parametrize(
    "view, body, message",
    [
        ("heads", {"heads": [[9, 0]]}, "layer is 9; it must be 0..1"),
        ("heads", {"heads": [[0]]}, "a \\[layer, head\\] pair"),
        ("heads", {"heads": "all"}, "heads must be a list"),
        ("heads", {"mode": "resample"}, "mode must be 'zero' or 'mean'"),
        ("attribution", {"token": 10**6}, "token is 1000000; it must be 0.."),
        ("attribution", {"what": 1}, "unknown field 'what'"),
    ],
)
def test_bad_input_is_one_line(ex, ids, view, body, message):
    with pytest.raises(BadRequest, match=message):
        getattr(ex, view)({"ids": ids, "position": 3, **body})
