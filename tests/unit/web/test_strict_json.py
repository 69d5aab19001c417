"""minitf.web.strict_json: request bodies read strictly (one line saying what is wrong) and answers
that are always valid JSON, worked out by hand."""

import json

import pytest

from minitf.web.strict_json import dumps, loads


def test_loads_reads_ordinary_json():
    assert loads(b'{"prompt": "O", "n": 2, "temperature": 0.5, "stop": ["\\n"], "echo": false}') == {
        "prompt": "O",
        "n": 2,
        "temperature": 0.5,
        "stop": ["\n"],
        "echo": False,
    }


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"t": 1e400}', "the request body holds a number too large for JSON (1e400); send a finite number"),
        (b'{"t": NaN}', "the request body holds NaN, which is not a number JSON allows; send a finite number"),
        (b"[-Infinity]", "the request body holds -Infinity, which is not a number JSON allows; send a finite number"),
        (
            b'{"n": ' + b"9" * 101 + b"}",
            f"the request body holds a number too large for JSON ({'9' * 40}...); send a smaller one",
        ),
        (
            b'{"p": "\\ud800"}',
            "the request body holds a lone surrogate '\\ud800', which is not text; send valid Unicode",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "the request body's JSON is nested too deeply; send at most a few levels"),
        (b'{"p": ', "the request body is not valid JSON"),
        (b"\xff\xfe", "the request body is not valid JSON"),
    ],
    ids=["huge", "nan", "infinity", "long-int", "surrogate", "deep", "cut", "not-utf8"],
)
def test_loads_refuses_in_one_line_naming_why(raw, message):
    with pytest.raises(ValueError) as e:
        loads(raw)
    assert str(e.value) == message


def test_a_hundred_digits_are_still_a_number():
    assert loads(b"[" + b"9" * 100 + b"]") == [int("9" * 100)]


def test_dumps_leaves_non_finite_numbers_out_of_objects_and_null_in_lists():
    payload = {
        "loss": float("nan"),
        "step": 3,
        "curve": [1.5, float("inf"), -float("inf")],
        "nested": {"x": float("nan")},
    }
    assert json.loads(dumps(payload)) == {"step": 3, "curve": [1.5, None, None], "nested": {}}
    assert dumps({"a": [1, 2.5], "b": "ü"}) == b'{"a": [1, 2.5], "b": "\\u00fc"}'  # finite: Python's json as it is
    assert dumps((float("nan"), 1)) == b"[null, 1]"
