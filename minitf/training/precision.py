"""Weights held in 16 bits while the residual stream stays float32: a LoRA run's frozen matrices
(lora.py), and train.param_dtype=bfloat16's whole model, which BF16AdamW (fast/bf16_adamw.py)
updates with stochastic rounding.

Under a bfloat16 autocast every matrix product reads its weights in bfloat16 anyway, so holding
them so changes no product; what must not change is the residual stream, which the norms and the
additions keep in float32: the embedding's 16-bit rows are read out as float32."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..config import TrainConfig
from ..errors import ConfigError


def rows_as_float32(model: nn.Module) -> None:
    """Where model's embedding is 16-bit, its rows come out as float32 (exactly its values), where
    the residual stream begins."""
    if model.wte.weight.dtype != torch.float32:
        model.wte.register_forward_hook(_as_float32)


def _as_float32(module: nn.Module, args, out: torch.Tensor) -> torch.Tensor:
    return out.float()  # (B, T, C)


def held_dtype(tc: TrainConfig, compute: torch.dtype) -> torch.dtype | None:
    """The dtype a download's matrices are loaded in (compute: train.dtype, resolved).
    train.param_dtype=bfloat16: bfloat16, which needs bfloat16 compute (a float32 product cannot
    read bfloat16 weights), checked here before anything is loaded. A LoRA run: the training's
    dtype for its frozen matrices where it is 16-bit (autocast reads them so at every use).
    Otherwise None (float32)."""
    if tc.param_dtype == "bfloat16":
        if compute != torch.bfloat16:
            raise ConfigError(
                f"train.param_dtype=bfloat16 needs bfloat16 compute, but train.dtype resolved to "
                f"{str(compute).split('.')[-1]} here; set train.dtype=bfloat16, or train.param_dtype=float32"
            )
        return torch.bfloat16
    return compute if tc.lora_rank and compute in (torch.bfloat16, torch.float16) else None


def hold(model: nn.Module, tc: TrainConfig) -> None:
    """train.param_dtype=bfloat16: the matrices of model (its embeddings, the linear layers'
    weights; a tied head is the embedding's one parameter, cast once) in bfloat16, in place;
    float32 leaves model as it is.

    The vectors stay float32: the norms' gains and biases (a layer norm on a CPU takes float32
    input with float32 parameters only) and the linear layers' biases, a ten-thousandth of a
    model's size. So do the buffers, such as the rotary tables."""
    if tc.param_dtype != "bfloat16":
        return
    for p in model.parameters():
        if p.dim() >= 2:
            p.data = p.data.to(torch.bfloat16)
    rows_as_float32(model)
