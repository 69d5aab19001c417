"""What the chat tests read of an encoded conversation."""


def runs(ids: list[int], learned: list[bool]) -> list[list[int]]:
    """The learned tokens, one list per unbroken run."""
    out, prev = [], False
    for i, keep in zip(ids, learned):
        if keep:
            (out[-1].append(i) if prev else out.append([i]))
        prev = keep
    return out
