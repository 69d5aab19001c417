"""minitf.interpret.checks: every tool of the package meets what is not token ids, or not an
integer where it indexes, with one line of one shape, never torch's traceback or a silent guess."""

import numpy as np
import pytest
import torch

import minitf
from minitf.interpret import (
    ablate,
    attribute,
    head_scores,
    in_context_score,
    mean_head_outputs,
    patch_heads,
    patch_residual,
    repeated_tokens,
)
from tests.interpret_models import SLOT, induction_model

IDS = repeated_tokens(SLOT, 6, batch=1)[0]  # (12,)
WANT_IDS = "pass token ids of shape (T,) or (B, T): ints in 0..15, e.g. tokenizer.encode(text)"

# every entry point that reads ids, with the argument's name in its messages
TOOLS = {
    "head_scores": (lambda m, ids: head_scores(m, ids), "ids"),
    "ablate": (lambda m, ids: ablate(m, ids, [(1, 0)]), "ids"),
    "mean_head_outputs": (lambda m, ids: mean_head_outputs(m, ids), "reference"),
    "attribute": (lambda m, ids: attribute(m, ids, 3), "ids"),
    "in_context_score": (lambda m, ids: in_context_score(m, ids), "ids"),
    "patch_residual": (lambda m, ids: patch_residual(m, ids, IDS, 3, 4), "clean"),
    "patch_heads": (lambda m, ids: patch_heads(m, IDS, ids, 3, 4), "corrupted"),
}

NOT_IDS = {
    "bool tensor": (IDS > 3, "a torch.bool tensor of shape (12,)"),
    "float tensor": (IDS.float(), "a torch.float32 tensor"),
    "complex tensor": (IDS.to(torch.complex64), "a torch.complex64 tensor"),
    "float array": (IDS.numpy().astype(np.float64), "a torch.float64 tensor"),
    "ragged lists": ([[1, 2, 3], [4, 5]], "a ragged list (rows of [2, 3] ids)"),
    "a string": ("the cat sat", "'the cat sat' (a str)"),
    "None": (None, "None"),
    "a bare int": (5, "5 (an int)"),
    "three deep": ([[[1, 2]]], "a list nested more than two deep"),
    "mixed": ([1, [2, 3]], "a list mixing ids and rows of ids"),
    "empty": ([], "of shape (1, 0)"),
}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("case", NOT_IDS)
def test_what_is_not_token_ids_is_refused_in_one_line_naming_the_argument(tool, case):
    call, name = TOOLS[tool]
    value, got = NOT_IDS[case]
    with pytest.raises(minitf.ConfigError) as e:
        call(induction_model(), value)
    message = str(e.value)
    assert message.startswith(f"{name} is ") and got in message and message.endswith(WANT_IDS), message
    assert "\n" not in message


@pytest.mark.parametrize("tool", TOOLS)
def test_bools_and_floats_inside_a_list_are_refused_not_read_as_ids(tool):
    call, name = TOOLS[tool]
    for value, got in (([1, True, 3] * 4, "holds True"), ([[1.0, 2.0] * 6], "holds 1.0")):
        with pytest.raises(minitf.ConfigError, match=rf"^{name} {got}, which is not a token id \(an int in 0..15\)"):
            call(induction_model(), value)


def test_ids_of_any_integer_type_give_the_same_numbers():
    model = induction_model()
    want = head_scores(model, IDS)
    for ids in (IDS.to(torch.uint8), IDS.to(torch.int16), IDS.int(), IDS.numpy().astype(np.int8), IDS.tolist()):
        got = head_scores(model, ids)
        assert all(torch.equal(got[k], want[k]) for k in want)
    as_rows = [np.int64(i) for i in IDS.tolist()]  # numpy's own integers, as iterating an array gives them
    torch.testing.assert_close(
        ablate(model, [as_rows], [(1, 0)]).logits_after, ablate(model, IDS, [(1, 0)]).logits_after
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: attribute(m, IDS, True), r"^token is True; pass a token id: an int in 0..15$"),
        (lambda m: attribute(m, IDS, 1.5), r"^token is 1.5 \(a float\); pass a token id"),
        (lambda m: attribute(m, IDS, torch.tensor([1, 2])), r"^token is a torch.int64 tensor of shape \(2,\); pass"),
        (lambda m: attribute(m, IDS, 3, against="4"), r"^against is '4' \(a str\); pass a token id"),
        (lambda m: attribute(m, IDS, 3, position=1.5), r"^position is 1.5 \(a float\); pass an int in -12..11"),
        (lambda m: attribute(m, IDS, 3, position=True), r"^position is True; pass an int in -12..11"),
        (lambda m: patch_residual(m, IDS, IDS.flip(0), 3.5, 4), r"^the answer token is 3.5 \(a float\); pass"),
        (lambda m: patch_heads(m, IDS, IDS.flip(0), 3, None), r"^the wrong token is None; pass a token id"),
        (lambda m: in_context_score(m, IDS, early=2.0), r"^early is 2.0 \(a float\); pass an int in 0..10"),
        (lambda m: in_context_score(m, IDS, late=-1), r"^late is -1; pass an int in 0..10"),
        (lambda m: repeated_tokens(64, 2.5), r"^length is 2.5 \(a float\); pass an int >= 1$"),
        (lambda m: repeated_tokens(64, 4, batch=0), r"^batch is 0; pass an int >= 1$"),
        (lambda m: repeated_tokens(1, 4), r"^vocab_size is 1; pass an int >= 2$"),
        (lambda m: repeated_tokens(64, 4, seed=None), r"^seed is None; pass an int$"),
        (lambda m: ablate(m, IDS, [(1, 0)], mode=None), r"^mode is None; pass 'zero' or 'mean'$"),
        (lambda m: head_scores(m, IDS, budget=0.5), r"^budget is 0.5 \(a float\); pass an int >= 1$"),
    ],
)
def test_an_index_that_is_not_an_int_in_range_is_refused_in_one_line(call, message):
    with pytest.raises(minitf.ConfigError, match=message):
        call(induction_model())


def test_integers_of_any_kind_index_as_ints():
    model = induction_model()
    a = attribute(model, IDS, 3, position=-2)
    b = attribute(model, IDS, np.int64(3), position=torch.tensor(-2))
    assert (a.token, a.position, a.logit) == (b.token, b.position, b.logit) == (3, 10, a.logit)
    assert isinstance(b.token, int) and type(b.position) is int


def test_answer_and_wrong_the_same_token_blames_the_tokens_not_the_prompts():
    with pytest.raises(minitf.ConfigError) as e:
        patch_residual(induction_model(), IDS, IDS.flip(0), 3, 3)
    assert str(e.value).startswith("the wrong token is 3, the answer token too; pass another token")
    assert "prompts" not in str(e.value)
