"""A reward for the RL tests (rl.reward=tests.support.rewards:shorter): the tests' chat run is too
young to answer any question right, so exact's rewards are all 0 and it would learn nothing; this
one differs between any two answers of different lengths, so every group has something to learn."""


def shorter(messages: list[dict], answer: str, expected: str | None) -> float:
    return 1.0 / (1 + len(answer))
