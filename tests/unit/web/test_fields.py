"""minitf/web/fields.py: the one check of a request's numbers and flags, shared by the explorer and
the server; and http_io.error_answer, the one error answer, in each app's JSON shape."""

import json

import pytest

from minitf.errors import MinitfError
from minitf.web.fields import BadRequest, flag, number, whole
from minitf.web.http_io import error_answer


@pytest.mark.parametrize(
    "x, lo, hi, message",
    [
        (True, 0, 9, "n must be a whole number, got True"),
        (2.0, 0, 9, "n must be a whole number, got 2.0"),
        ("3", 0, 9, "n must be a whole number, got '3'"),
        (None, 0, 9, "n must be a whole number, got None"),
        (10, 0, 9, "n is 10; it must be 0..9"),
        (-1, 0, None, "n is -1; it must be >= 0"),
    ],
)
def test_whole_refuses_in_one_line_naming_the_field(x, lo, hi, message):
    with pytest.raises(BadRequest) as e:
        whole(x, "n", lo, hi)
    assert str(e.value) == message and e.value.param == "n" and e.value.status == 400


def test_whole_number_and_flag_take_what_they_should():
    assert whole(3, "n", 0, 9) == 3 and whole(-5, "n") == -5
    assert number(1, "t", 0, 2) == 1.0 and isinstance(number(1, "t", 0, 2), float)
    assert flag(None, "stream") is False and flag(True, "stream") is True


@pytest.mark.parametrize(
    "x, low_open, message",
    [
        ("hot", False, "t must be a number, got 'hot'"),
        (False, False, "t must be a number, got False"),
        (3, False, "t is 3; it must be in [0, 2]"),
        (0, True, "t is 0; it must be in (0, 2]"),
    ],
)
def test_number_refuses_in_one_line_naming_the_field(x, low_open, message):
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace("[", r"\[")):
        number(x, "t", 0, 2, low_open=low_open)


def test_flag_refuses_what_is_not_a_bool():
    with pytest.raises(BadRequest, match=r"^echo must be true or false, got 1$"):
        flag(1, "echo")


def test_error_answer_has_the_errors_status_and_the_apps_shape():
    shape = lambda error, status: {"error": str(error), "status": status}  # noqa: E731
    answer = error_answer(BadRequest("top is 500; it must be 1..100", "top"), shape)
    assert answer.status_code == 400
    assert json.loads(answer.body) == {"error": "top is 500; it must be 1..100", "status": 400}
    assert error_answer(MinitfError("no status"), shape).status_code == 400
    busy = MinitfError("busy")
    busy.status = 503
    assert error_answer(busy, shape).status_code == 503
