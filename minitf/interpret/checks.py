"""The one check of what minitf.interpret is handed: token ids, and the integers that index into
them or into the model (a position, a token, a (layer, head) pair, a length, a seed).

Every tool of the package takes ids as a tensor, a numpy array or a (nested) list. A value that is
not integer ids (bools, floats, complex numbers, strings, None, rows of different lengths) would
reach torch's indexing and fail there with a traceback, or worse be read as what it is not: True
as token 1, 0.9 as layer 0, "01" as the pair (0, 1). Each is refused here in one line of one
shape, "<argument> is <what it got>; pass <what it takes>". The range of the ids is checked by
minitf.tokenizer.check_ids, so that message is the one the explorer and the server give too.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from ..errors import ConfigError, shown
from ..model import Transformer
from ..tokenizer import check_ids


def refuse(name: str, got: str, want: str) -> ConfigError:
    """The package's one message shape for an argument it cannot use."""
    return ConfigError(f"{name} is {got}; pass {want}")


def described(value) -> str:
    """A value as a message names it: its repr, and its type where the repr does not say it."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return repr(value)
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a numpy array of {value.dtype}, shape {value.shape}"
    kind = type(value).__name__
    return f"{shown(value)} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"


def as_int(value, name: str, want: str) -> int:
    """value as a Python int: an int, a numpy integer or a 0-d integer tensor. Bools (True is not
    1 here), floats (0.9 is not 0), strings and anything else are refused, naming `want`."""
    is_bool = isinstance(value, (bool, np.bool_)) or (torch.is_tensor(value) and value.dtype == torch.bool)
    if is_bool or (torch.is_tensor(value) and value.dim() != 0):
        raise refuse(name, described(value), want)
    try:
        return operator.index(value)
    except TypeError:
        raise refuse(name, described(value), want) from None


def index(value, name: str, low: int, high: int, what: str = "") -> int:
    """An int in low..high (both included); `what` says what the range is, for the message."""
    want = f"an int in {low}..{high}{what}"
    i = as_int(value, name, want)
    if not low <= i <= high:
        raise refuse(name, shown(i), want)
    return i


def at_least(value, name: str, low: int) -> int:
    """An int no smaller than low (a length, a count)."""
    i = as_int(value, name, f"an int >= {low}")
    if i < low:
        raise refuse(name, shown(i), f"an int >= {low}")
    return i


def token(model: Transformer, value, name: str) -> int:
    """One token id of the model's vocabulary (an answer, a token to attribute)."""
    V = model.config.vocab_size
    t = as_int(value, name, f"a token id: an int in 0..{V - 1}")
    check_ids([t], V, name)
    return t


def head_pairs(model: Transformer, heads) -> list[tuple[int, int]]:
    """(layer, head) pairs as sorted, distinct non-negative indices (negative ones count from the
    end, as in Python). Each pair is two ints: (0.9, 1.9) is not (0, 1), nor is "01"."""
    L, H = model.config.n_layer, model.config.n_head
    want = f"(layer, head) pairs of ints, layer 0..{L - 1} and head 0..{H - 1}, e.g. [(0, 1)]"
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise refuse("heads", described(heads), want)
    out = []
    for pair in heads:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise refuse("heads", f"a list holding {described(pair)}, not a (layer, head) pair", want)
        layer, head = (as_int(v, "heads", want) for v in pair)
        if not (-L <= layer < L and -H <= head < H):
            where = f"not in the model of {L} layers of {H} heads"
            raise refuse("heads", f"a list holding ({layer}, {head}), {where}", want)
        out.append((layer % L, head % H))
    return sorted(set(out))


def as_batch(model: Transformer, ids, name: str = "ids") -> torch.Tensor:
    """Token ids (T,) or (B, T) -> (B, T) int64 on the model's device. A tensor or numpy array of any
    integer type, or a (nested) list of ints; anything else, ids outside the vocabulary, or more
    tokens than the context, is refused in one line naming `name`."""
    V, block = model.config.vocab_size, model.config.block_size
    want = f"token ids of shape (T,) or (B, T): ints in 0..{V - 1}, e.g. tokenizer.encode(text)"
    if isinstance(ids, np.ndarray) and ids.dtype != object:
        ids = torch.from_numpy(np.ascontiguousarray(ids))
    if torch.is_tensor(ids):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise refuse(name, described(ids), want)
    elif isinstance(ids, (list, tuple, np.ndarray)):
        ids = _from_lists(ids, name, V, want)
    else:
        raise refuse(name, described(ids), want)
    if ids.dim() == 1:
        ids = ids[None]  # (1, T)
    if ids.dim() != 2 or ids.numel() == 0:
        raise refuse(name, f"of shape {tuple(ids.shape)}", want)
    if ids.size(1) > block:
        raise refuse(name, f"{ids.size(1)} tokens long, more than block_size={block}", f"at most {block} tokens")
    check_ids(ids, V, name)
    return ids.long().to(model.wte.weight.device)


def _from_lists(ids, name: str, V: int, want: str) -> torch.Tensor:
    """(T,) or (B, T) from a list of ints or a list of rows; each int checked by check_ids, so a
    bool or a float inside a list is refused rather than converted."""
    rows = [r.tolist() if hasattr(r, "tolist") else r for r in ids]
    nested = [isinstance(r, (list, tuple)) for r in rows]
    if any(nested) and not all(nested):
        raise refuse(name, "a list mixing ids and rows of ids", want)
    if any(nested):
        if len({len(r) for r in rows}) > 1:
            raise refuse(name, f"a ragged list (rows of {sorted({len(r) for r in rows})[:4]} ids)", want)
        flat = [v for r in rows for v in r]
    else:
        rows, flat = [rows], rows
    if any(isinstance(v, (list, tuple)) for v in flat):
        raise refuse(name, "a list nested more than two deep", want)
    flat = [int(v) if isinstance(v, np.integer) else v for v in flat]
    check_ids(flat, V, name)  # every entry an int (not a bool), in the vocabulary
    return torch.tensor(flat, dtype=torch.long).view(len(rows), -1) if flat else torch.zeros(len(rows), 0)
