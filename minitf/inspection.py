"""Look inside a model: every textbook step of attention, for every layer and head, on real text.

`inspect(model, tokenizer, text)` runs the model's own modules one step at a time and keeps what
each step made: per layer, the queries, keys and values of every head, the raw scores q·k, the
scaled scores, the causally masked scores, the softmax weights and the heads' outputs, then what
attention and the feed-forward network each add to the residual stream. Adding those pieces back
up reproduces the model's logits (tests/test_inspect.py does exactly that).

`logit_lens(model, ins)` reads the residual stream after every block as if it were the last one
(final norm and LM head applied): what each layer would predict; the last layer's is the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import MinitfError
from .model import Transformer
from .system.runtime import eval_mode
from .tokenizer import Tokenizer


@dataclass
class LayerSteps:
    """One block, step by step: attention head by head, then the FFN (H heads, T tokens, head size D, width C)."""

    q: torch.Tensor  # (H, T, D) queries; for rope, after the rotation
    k: torch.Tensor  # (H, T, D) keys; for rope, after the rotation; with n_kv_head, the query head's group's
    v: torch.Tensor  # (H, T, D) values; with n_kv_head, the query head's group's
    scores: torch.Tensor  # (H, T, T) raw scores q @ k^T
    scaled: torch.Tensor  # (H, T, T) scores / sqrt(D)
    masked: torch.Tensor  # (H, T, T) scaled, with -inf where a query would see a later key
    weights: torch.Tensor  # (H, T, T) softmax of each row of masked: every row sums to 1
    heads: torch.Tensor  # (H, T, D) weights @ v, each head's output
    attn_out: torch.Tensor  # (T, C) heads side by side, through the output projection c_proj
    ffn_out: torch.Tensor  # (T, C) the feed-forward network's output


@dataclass
class Inspection:
    """What `inspect` returns. The residual stream starts at `embeddings`, and block i adds
    layers[i].attn_out, then layers[i].ffn_out; the final norm and LM head then give `logits`."""

    ids: list[int]
    tokens: list[str]  # each token decoded on its own (a leading space is part of the token)
    embeddings: torch.Tensor  # (T, C) token embeddings plus learned or sinusoidal positions
    layers: list[LayerSteps]
    logits: torch.Tensor  # (T, vocab_size)
    # (n_layer + 1, T, C): the residual stream as the model summed it, at the embeddings and after
    # each block; the last is what the final norm and LM head read
    residuals: torch.Tensor

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    @property
    def n_head(self) -> int:
        return self.layers[0].q.size(0)


@torch.no_grad()
def inspect(model: Transformer, tokenizer: Tokenizer, text: str | list[int]) -> Inspection:
    """Run `text` through `model` keeping every intermediate step; tensors come back on the CPU.

    text: a string, or token ids (e.g. a prompt's and the ones sampled after it, exactly as
    generated: re-encoding the decoded text can split it differently).
    The model is put in eval mode for the pass (dropout off) and restored after.
    """
    ids = list(text) if not isinstance(text, str) else tokenizer.encode(text) if text else []
    bad = [i for i in ids if isinstance(i, bool) or not (isinstance(i, int) and 0 <= i < tokenizer.vocab_size)]
    if bad:
        raise MinitfError(f"token id {bad[0]!r} is not in the vocabulary (0..{tokenizer.vocab_size - 1})")
    if not ids:
        raise MinitfError("the text to inspect is empty; pass at least one character, e.g. --text 'The cat'")
    block = model.config.block_size
    if len(ids) > block:
        raise MinitfError(
            f"the text is {len(ids)} tokens but the model sees at most block_size={block}; shorten the text"
        )
    with eval_mode(model):
        idx = torch.tensor([ids], device=model.wte.weight.device)  # (1, T)
        x = model.embed(idx)  # (1, T, C): token embeddings plus positions
        embeddings, layers, residuals = x, [], [x]
        for blk in model.blocks:
            steps = blk.attn.steps(blk.ln_1(x), model.rope)  # the module's own math, every step kept
            steps["attn_out"] = steps.pop("out")  # (1, T, C)
            x = x + steps["attn_out"]
            steps["ffn_out"] = blk.mlp(blk.ln_2(x))  # (1, T, C)
            x = x + steps["ffn_out"]
            residuals.append(x)
            layers.append(LayerSteps(**{name: _one(t) for name, t in steps.items()}))
        logits = model.logits(x)  # (1, T, V)
    return Inspection(
        ids=ids,
        tokens=[tokenizer.decode([i]) for i in ids],
        embeddings=_one(embeddings),
        layers=layers,
        logits=_one(logits),
        residuals=torch.stack([_one(r) for r in residuals]),
    )


@torch.no_grad()
def logit_lens(model: Transformer, ins: Inspection) -> torch.Tensor:
    """(n_layer + 1, T, vocab_size): the logits each point of the residual stream would give if the
    model stopped there, at the embeddings and after every block, through the model's own final
    norm and LM head (`model.logits`). The last row is the model's logits."""
    w = model.lm_head.weight
    with eval_mode(model):
        return model.logits(ins.residuals.to(w.device, w.dtype)).float().cpu()  # (L + 1, T, V)


def _one(t: torch.Tensor) -> torch.Tensor:
    """Drop the batch dimension of one; float32 on the CPU, ready to plot or print."""
    return t[0].float().cpu()


def check_layer_head(ins: Inspection, layer: int, head: int | None) -> tuple[int, int | None]:
    """Layer and head as non-negative indices (negative ones count from the end, as in Python)."""
    if not -ins.n_layer <= layer < ins.n_layer:
        raise MinitfError(
            f"layer {layer} is out of range: the model has {ins.n_layer} layers, pass --layer 0..{ins.n_layer - 1}"
        )
    if head is not None and not -ins.n_head <= head < ins.n_head:
        raise MinitfError(
            f"head {head} is out of range: the model has {ins.n_head} heads per layer, pass --head 0..{ins.n_head - 1}"
        )
    return layer % ins.n_layer, None if head is None else head % ins.n_head


def token_label(token: str, width: int | None = None) -> str:
    """A token as a readable label: spaces as ␣ and newlines as ↵, so ' cat' and 'cat' differ."""
    label = token.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u2192").replace("\r", "")
    label = label or "\u2205"  # a token that decodes to nothing on its own (half a character)
    return label if width is None or len(label) <= width else label[: width - 1] + "\u2026"


def format_weights(ins: Inspection, layer: int, head: int) -> str:
    """One head's attention weights as a text table: a row per query token, a column per key."""
    layer, head = check_layer_head(ins, layer, head)
    w = ins.layers[layer].weights[head]  # (T, T)
    labels = [token_label(t, 8) for t in ins.tokens]
    col = max(6, max(len(s) for s in labels) + 1)
    lines = [
        f"layer {layer}, head {head}: attention weights (row: query token, column: key token; "
        f"blank = masked, a later token)",
        " " * col + "".join(s.rjust(col) for s in labels),
    ]
    for i, row_label in enumerate(labels):
        cells = "".join(f"{w[i, j]:.2f}".rjust(col) for j in range(i + 1))
        lines.append(row_label.ljust(col) + cells)
    return "\n".join(lines)
