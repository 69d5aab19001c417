"""Rewards: plain Python functions that score an answer, and the checks that keep a bad one loud.

A reward is `reward(messages, answer, expected) -> float`: the conversation that was asked (ending
with the user's question), the model's answer (its text, the end of turn left out) and the
prompt's expected answer (its "answer", or None where the prompts give none). rl.reward names it:

    exact                    1.0 when the answer, stripped, is the expected answer exactly, else 0.0
    mypackage.rewards:score  a function of your own module (importable, e.g. on PYTHONPATH)

exact gives no partial credit: a group learns as soon as one of its answers is right and another
is not (their advantages differ), and credit for a near miss (the right digits in the wrong order)
would pay for answers that are still wrong.

A reward that raises, returns something that is not a number, returns NaN or an infinity, or
takes longer than MAX_SECONDS is an error naming the prompt, never a silent zero: a run that
learns from a broken reward learns nothing, and says nothing of why.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import signal
import threading
import time
from collections.abc import Callable

from ..errors import ConfigError, MinitfError, first_line, shown

MAX_SECONDS = 5.0  # one answer's score: a reward is a check, not a computation


def exact(messages: list[dict], answer: str, expected: str | None) -> float:
    """1.0 for the expected answer exactly (whitespace around it aside), else 0.0."""
    return float(expected is not None and answer.strip() == expected.strip())


BUILT_IN = {"exact": exact}


def reward_function(name: str) -> Callable:
    """rl.reward's function: a built-in by name, or module:function imported (a ConfigError if not)."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ConfigError(
            f"rl.reward={name!r} is neither a built-in ({', '.join(BUILT_IN)}) nor module:function, "
            f"e.g. rl.reward=myrewards:score"
        )
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"rl.reward={name}: module {module!r} cannot be imported ({first_line(e, 120)})") from None
    except AttributeError:
        raise ConfigError(f"rl.reward={name}: module {module!r} has no {attr!r}") from None
    if not callable(fn):
        raise ConfigError(f"rl.reward={name} is not a function")
    return fn


def score(reward: Callable, name: str, messages: list[dict], answer: str, expected: str | None) -> float:
    """reward's float for one answer, checked: an error, a value that is not a finite number, or a
    call past MAX_SECONDS is a MinitfError naming the reward and the prompt."""
    where = f"rl.reward={name} on the prompt {shown(messages[-1]['content'], 60)} (answer {shown(answer, 40)})"
    started, late = time.monotonic(), False
    try:
        with _time_limit(MAX_SECONDS):
            value = reward(messages, answer, expected)
    except _TooLong:
        late = True
    except Exception as e:  # the user's function: any error is theirs to see, named
        raise MinitfError(f"{where} raised {type(e).__name__}: {first_line(e, 120)}") from None
    if late or time.monotonic() - started > MAX_SECONDS:
        raise MinitfError(f"{where} took more than {MAX_SECONDS:g} s; a reward must answer at once")
    if not isinstance(value, (int, float)):  # True and False are 1 and 0
        raise MinitfError(f"{where} returned {shown(value, 40)}, not a number; return a float (1.0 right, 0.0 wrong)")
    if not math.isfinite(value):
        raise MinitfError(f"{where} returned {value}; a reward must be a finite number")
    return float(value)


class _TooLong(BaseException):  # not an Exception: the reward's own `except Exception` cannot swallow it
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Interrupt the block after `seconds` (SIGALRM, in the main thread; elsewhere it is timed after)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def interrupt(*_):
        raise _TooLong

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
