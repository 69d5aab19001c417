"""Rewards (minitf/rl/rewards.py): exact's rule, a function of the user's own module, and every
way a reward can go wrong as one line naming the reward and the prompt, never a silent zero."""

import math
import sys
import time

import pytest

from minitf.errors import ConfigError, MinitfError
from minitf.rl import rewards
from minitf.rl.rewards import reward_function, score

PROMPT = [{"role": "user", "content": "What is 17 plus 25?"}]


def test_exact_is_one_for_the_answer_and_zero_otherwise():
    exact = reward_function("exact")
    assert exact(PROMPT, "42", "42") == exact(PROMPT, " 42\n", "42") == 1.0
    assert exact(PROMPT, "41", "42") == exact(PROMPT, "42.", "42") == exact(PROMPT, "42", None) == 0.0


def test_a_users_own_module(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text(
        "def longer(messages, answer, expected):\n    return min(len(answer), 10) / 10\nNOT_A_FUNCTION = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = reward_function("myrewards:longer")
    assert score(fn, "myrewards:longer", PROMPT, "abcde", None) == 0.5
    for name, words in [
        ("nosuchmodule:f", "module 'nosuchmodule' cannot be imported"),
        ("myrewards:missing", "module 'myrewards' has no 'missing'"),
        ("myrewards:NOT_A_FUNCTION", "is not a function"),
        ("partial", r"is neither a built-in \(exact\) nor module:function"),
    ]:
        with pytest.raises(ConfigError, match=words):
            reward_function(name)
    sys.modules.pop("myrewards", None)


def boom(messages, answer, expected):
    raise ValueError("no digits in the answer")


@pytest.mark.parametrize(
    "fn, words",
    [
        (boom, "raised ValueError: no digits in the answer"),
        (lambda m, a, e: math.nan, "returned nan; a reward must be a finite number"),
        (lambda m, a, e: math.inf, "returned inf; a reward must be a finite number"),
        (lambda m, a, e: "1", "returned '1', not a number"),
        (lambda m, a, e: None, "returned None, not a number"),
    ],
)
def test_a_broken_reward_is_one_line_naming_the_prompt(fn, words):
    with pytest.raises(MinitfError) as e:
        score(fn, "mine:fn", PROMPT, "41", "42")
    message = str(e.value)
    assert message.startswith("rl.reward=mine:fn on the prompt 'What is 17 plus 25?' (answer '41') ")
    assert words in message and "\n" not in message


def test_a_reward_that_takes_too_long_is_stopped(monkeypatch):
    monkeypatch.setattr(rewards, "MAX_SECONDS", 0.2)

    def slow(messages, answer, expected):
        try:
            time.sleep(30)
        except Exception:  # a reward's own catch-all cannot keep it running
            time.sleep(30)
        return 1.0

    started = time.monotonic()
    with pytest.raises(MinitfError, match=r"took more than 0.2 s; a reward must answer at once"):
        score(slow, "mine:slow", PROMPT, "41", "42")
    assert time.monotonic() - started < 10  # interrupted, not waited for


def test_true_and_false_are_one_and_zero():
    assert score(lambda m, a, e: a == e, "mine:eq", PROMPT, "42", "42") == 1.0
    assert score(lambda m, a, e: a == e, "mine:eq", PROMPT, "41", "42") == 0.0
