"""LoRA fine-tuning through peft (train.lora_rank > 0): low-rank adapters on the frozen model.

`adapt` injects peft's LoRA layers into the Transformer in place (`peft.inject_adapter_in_model`):
each targeted nn.Linear becomes a peft layer computing W x + (alpha / r) B A x, with W frozen and
only A (r x in) and B (out x r, zero at first, so step 0 is the pretrained model) trained. The
model stays a Transformer, so the loop, evaluation and the checkpoint code do not change: the
optimizer gets only the parameters that require a gradient (optim.make_optimizer), and AdamW's two
moments are kept for the adapters alone (and a template's new rows, below), which is where LoRA
saves memory.

What is saved: state.pt holds the adapted model's own state (the frozen weights under peft's
`base_layer` names beside the adapters, and the new tokens' rows below), so a resume continues bit
for bit. Every safetensors file (model.safetensors, best.safetensors, snapshots) holds the merged
weights W + (alpha / r) B A, and the embedding with its trained rows, under the plain model's names
(`merged_model`), so generate, serve, export and every other reader of the run load an ordinary
model and never meet peft.

A chat template's new tokens (`tokens`: ChatML's two markers, which a base model has never seen,
conversations/sft.py) train too, or the model could never learn to write <|im_end|> and end its
turn: their rows of the embedding, and of the head (the same rows when it is tied, its own when
not), are read from a small trainable copy (`TokenRows`, a torch parametrization) and every other
row stays frozen, bit for bit. peft's own `trainable_token_indices` does not fit a Transformer: it
wraps the embedding alone (peft learns of a tied head from a transformers config, which a
Transformer has not), and the fused loss reads `lm_head.weight` itself, past any wrapper. The head
is no LoRA target: tied, its adapter could be saved in no file apart from the embedding; untied,
the fused loss would read its matrix past the adapter, which would never train.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from ..config import TrainConfig
from ..errors import MinitfError
from ..model import Transformer
from ..system.streamed_safetensors import Entry
from .precision import rows_as_float32

ADAPTER = "default"  # peft's name for the one adapter a run trains
NO_PEFT = (
    "train.lora_rank needs the peft package, which is not installed; pip install -e '.[lora]' (or pip install peft)"
)


def adapt(
    model: Transformer, tc: TrainConfig, log=print, dtype: torch.dtype = torch.float32, tokens: Sequence[int] = ()
) -> Transformer:
    """model with LoRA adapters on tc.lora_targets and everything else frozen but the rows of
    `tokens` (a chat template's new tokens) in the embedding and head; unchanged when
    train.lora_rank is 0. Says the trainable parameter count.

    Under a 16-bit autocast (dtype: the training's, resolved) the frozen weights of the adapted
    linear layers are stored in that dtype: autocast casts them to it at every use anyway, so the
    steps compute exactly what they would, and those weights take half the memory. A download held
    in that dtype brings its embedding so too (hf_tensors.minitf_weights): its rows come out as
    float32, where the residual stream begins, so nothing it computes changes either."""
    if not tc.lora_rank:
        return model
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise MinitfError(NO_PEFT) from None
    targets = [t.strip() for t in tc.lora_targets.split(",")]
    _check_targets(model, tc, targets)
    config = LoraConfig(r=tc.lora_rank, lora_alpha=tc.lora_alpha, lora_dropout=tc.lora_dropout, target_modules=targets)
    model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)  # in place; freezes the rest
    if dtype in (torch.bfloat16, torch.float16):
        for name, module in model.named_modules():
            if name.endswith(".base_layer") and isinstance(module, nn.Linear):  # frozen, read through autocast
                module.weight.data = module.weight.data.to(dtype)
    rows_as_float32(model)
    rows = ""
    if tokens:
        train_rows(model, list(tokens))
        rows = f", and the rows of tokens {', '.join(map(str, tokens))} (the chat template's)"
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in dict.fromkeys(model.parameters()))  # tied weights once
    log(
        f"LoRA (peft): rank {tc.lora_rank}, alpha {tc.lora_alpha:g} on {', '.join(targets)}{rows}: "
        f"{trainable:,} trainable parameters of {total:,} ({100 * trainable / total:.2f}%), trained by AdamW at "
        f"lr {tc.lr * tc.rate_scale:.3g} to {tc.min_lr * tc.rate_scale:.3g} (train.lr and min_lr x "
        f"train.lora_lr_scale={tc.lora_lr_scale:g})"
    )
    return model


def _check_targets(model: Transformer, tc: TrainConfig, targets: list[str]) -> None:
    """Refuse targets that are no linear layer, the LM head, or a rank as wide as a layer, before
    any adapter is made."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in linears)]  # peft's rule
    if missing:
        raise MinitfError(
            f"train.lora_targets={tc.lora_targets!r} names {', '.join(missing) or 'nothing'}, which is no linear "
            "layer of the model; name some of c_attn (q, k, v), attn.c_proj, c_fc, mlp.c_proj, c_proj (both)"
        )
    if "lm_head" in targets:
        why = (
            "tied to the token embedding (model.tie_embeddings=true), so no saved file could hold its adapter"
            if model.config.tie_embeddings
            else "read whole by the training loss (the fused head), past any adapter, which would never train"
        )
        raise MinitfError(
            f"train.lora_targets={tc.lora_targets!r} names lm_head, {why}; remove lm_head (LoRA adapts the "
            "blocks' layers, and the rows of a chat template's new tokens train anyway)"
        )
    adapted = [
        m
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)
    ]
    narrowest = min(min(m.in_features, m.out_features) for m in adapted)
    if tc.lora_rank > narrowest:  # B A would be no lower in rank than W, and cost more than training W itself
        raise MinitfError(
            f"train.lora_rank={tc.lora_rank} is above the narrowest adapted layer's {narrowest} inputs or outputs; "
            f"LoRA's rank is far below a layer's width (8 to 64 is usual)"
        )


class TokenRows(nn.Module):
    """A parametrization of a frozen (V, C) embedding or head matrix: the rows of `ids` come from
    `rows`, a trainable float32 copy (k, C); the others are the matrix's own, never changed."""

    def __init__(self, weight: torch.Tensor, ids: list[int]):
        super().__init__()
        self.register_buffer("ids", torch.tensor(ids, device=weight.device), persistent=False)
        self.rows = nn.Parameter(weight.detach()[self.ids].float())  # (k, C): indexing copies

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.index_copy(0, self.ids, self.rows.to(weight.dtype))  # (V, C), a new tensor


def train_rows(model: Transformer, ids: list[int]) -> None:
    """The rows of ids train, in the embedding and the head: one TokenRows for both when the head
    is tied (so it stays the embedding), one each when it is not. Each step then builds the whole
    matrix afresh, as peft's trainable tokens do: the price of the head's rows learning."""
    rows = TokenRows(model.wte.weight, ids)
    parametrize.register_parametrization(model.wte, "weight", rows)
    if not model.config.tie_embeddings:
        rows = TokenRows(model.lm_head.weight, ids)
    parametrize.register_parametrization(model.lm_head, "weight", rows)  # tied: the same rows, the same original


def is_adapted(model: nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


def is_plain(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether model's weights are already what its readers take: no adapter, every one in dtype."""
    return not is_adapted(model) and all(p.dtype == dtype for p in model.parameters())


def merged_entries(model: nn.Module, dtype: torch.dtype = torch.float32) -> list[Entry]:
    """The adapted model's weights with each adapter folded in, under the plain model's names, in
    dtype, each made only when asked for (a weights file is written one at a time, never holding a
    second copy of the model): blocks.0.attn.c_attn.base_layer.weight + its delta ->
    blocks.0.attn.c_attn.weight, and wte.parametrizations.weight.original with its trained rows ->
    wte.weight. Each sum is made in float32 and rounded once to dtype; a tensor already in dtype is
    given as it is, not copied."""
    adapted = {}
    if is_adapted(model):  # a full fine-tune's model is only cast: peft need not be installed
        from peft.tuners.lora import LoraLayer

        adapted = {f"{n}.base_layer.weight": m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    with_rows = {  # the modules whose matrix is the frozen rows and the trained ones (TokenRows)
        f"{name}.parametrizations.weight.original": module
        for name, module in model.named_modules()
        if parametrize.is_parametrized(module, "weight")
    }
    entries = []
    for key, value in model.state_dict().items():
        if ".lora_" in key or ".parametrizations.weight.0." in key:  # lora_A, lora_B; TokenRows' rows
            continue
        name = key.replace(".parametrizations.weight.original", ".weight").replace(".base_layer.", ".")
        out = dtype if value.is_floating_point() else value.dtype
        make = functools.partial(_merged, value, adapted.get(key), with_rows.get(key), out)
        entries.append(Entry(name, tuple(value.shape), out, make))
    return entries


@torch.no_grad()
def _merged(value: torch.Tensor, layer, rows: nn.Module | None, dtype: torch.dtype) -> torch.Tensor:
    """One weight of merged_entries: value with its trained rows (rows: the parametrized module)
    and its adapter's delta (layer: peft's LoRA layer), in dtype."""
    if rows is not None:
        value = rows.weight  # the matrix as the model reads it
    if layer is not None:  # one float32 delta at a time, (out, in): (alpha / r) B A, gone once rounded
        value = value.float() + layer.get_delta_weight(ADAPTER).float()
    return value.to(dtype)


def merged_state_dict(model: nn.Module, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """merged_entries, every tensor made."""
    return {e.name: e.make() for e in merged_entries(model, dtype)}


def merged_model(model: nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """model itself, or a plain Transformer holding its weights merged (an adapted one) and in
    dtype: the model every reader of the run expects, in the dtype its weights files are written in
    (run.weights_dtype). The tensors already as they must be are shared, not copied."""
    if is_plain(model, dtype):
        return model
    with torch.device("meta"):  # no memory, no init: every tensor comes from the merged weights
        whole = Transformer(model.config)
    whole.load_state_dict(merged_state_dict(model, dtype), assign=True)
    tables = dict(model.named_buffers())  # rope's and sinusoidal's tables: in no state dict, still on meta
    for name, buffer in list(whole.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            whole.get_submodule(owner).register_buffer(leaf, tables[name], persistent=False)
    if model.config.tie_embeddings:  # assign gave the head its own tensor; tied, it is the embedding
        whole.lm_head.weight = whole.wte.weight
    return whole
