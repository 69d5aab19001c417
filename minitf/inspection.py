"""Every step of attention on your own model, as tensors, and the logit lens.

`inspect(model, tokenizer, text)` runs the model's own modules one step at a time and keeps what
each step made: per layer, the queries, keys and values of every head, the raw scores q·k, the
scaled scores, the causally masked scores, the softmax weights and the heads' outputs, then what
attention and the feed-forward network each add to the residual stream. Adding those pieces back
up reproduces the model's logits (tests/unit/test_inspection.py does exactly that).

`logit_lens(model, ins)` reads the residual stream after every block as if it were the last one
(final norm and LM head applied): what each layer would predict; the last layer's is the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import MinitfError
from .model import SandwichBlock, Transformer
from .system.runtime import eval_mode
from .tokenizer import Tokenizer, check_ids


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
    ids = tokenizer.encode(text) if isinstance(text, str) else list(text)
    _check_text_ids(ids, tokenizer, model.config.block_size)
    with eval_mode(model):
        idx = torch.tensor([ids], device=model.wte.weight.device)  # (1, T)
        layers, residuals, logits = run_blocks(model, idx)
    return Inspection(
        ids=ids,
        tokens=[tokenizer.decode([i]) for i in ids],
        embeddings=_one(residuals[0]),
        layers=[LayerSteps(**{name: _one(t) for name, t in steps.items()}) for steps in layers],
        logits=_one(logits),
        residuals=torch.stack([_one(r) for r in residuals]),
    )


def run_blocks(model: Transformer, idx: torch.Tensor, edit_heads=None, edit_resid=None, keep=None):
    """The model's forward pass on idx (B, T), block by block through its own modules, every step
    kept: (layers, residuals, logits (B, T, V)). layers[i] holds block i's attention steps (see
    CausalSelfAttention.steps) and what attention and the FFN add to the stream, attn_out and
    ffn_out (B, T, C); residuals, the stream at the embeddings and after each block.

    interpret's trace() edits the pass on the way: edit_heads(layer, heads) may return new head
    outputs, which then go through the output projection; edit_resid(point, x) a new stream at point
    0 or i + 1 (after block i); keep(i, steps) what of block i's steps to hold (default: all of them)."""
    x = model.embed(idx)  # (B, T, C): token embeddings plus positions
    if edit_resid is not None:
        x = edit_resid(0, x)
    layers, residuals = [], [x]
    for i, blk in enumerate(model.blocks):
        steps = blk.attn.steps(blk.ln_1(x), model.rope_of(i))  # the module's own math, every step kept
        if edit_heads is not None:
            steps["heads"] = edit_heads(i, steps["heads"])  # (B, H, T, D)
            steps["out"] = blk.attn.project(steps["heads"])
        sandwich = isinstance(blk, SandwichBlock)  # Gemma: each sub-layer's output is normalised before it is added
        out = steps.pop("out")  # (B, T, C)
        steps["attn_out"] = blk.after_attn(out) if sandwich else out
        x = x + steps["attn_out"]
        ffn = blk.mlp(blk.ln_2(x))  # (B, T, C)
        steps["ffn_out"] = blk.after_mlp(ffn) if sandwich else ffn
        x = x + steps["ffn_out"]
        if edit_resid is not None:
            x = edit_resid(i + 1, x)
        layers.append(steps := keep(i, steps) if keep else steps)  # the rest let go before the next block
        residuals.append(x)
    return layers, residuals, model.logits(x)  # ..., (B, T, V)


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


def _check_text_ids(ids: list[int], tokenizer: Tokenizer, block_size: int) -> None:
    check_ids(ids, tokenizer.vocab_size, "inspect's input")
    if not ids:
        raise MinitfError("the text to inspect is empty; pass at least one character, e.g. --text 'The cat'")
    if len(ids) > block_size:
        raise MinitfError(
            f"the text is {len(ids)} tokens but the model sees at most block_size={block_size}; shorten the text"
        )
