"""The token embedding of a model whose LM head is the same matrix (model.tie_embeddings): while
training, its backward gives the gradient of the rows it read, not of the whole table.

Why: the tied matrix gets two gradients, the head's, a whole (V, C) (every row's logit has one),
and the embedding's, nonzero only in the rows of the batch's tokens. Computed whole, the
embedding's is a second (V, C), made at the end of backward when every other gradient is already
held, and then added to the head's: a Qwen3's is 311 MB in bfloat16 (622 MB in float32), the
largest tensor a full fine-tune makes at its peak. As rows (a sparse tensor: the token ids and
one (C,) gradient each, 1 MB for 514 tokens) autograd adds it into the head's gradient in place,
row by row, each row by one thread in token order (the same sum every run: resume stays exact).

For a downloaded model's vocabulary (from 32,768 tokens, as for the fused head) on a CPU, the
laptop this memory matters on. The default model's 4,096 x 128 table is 2 MB and keeps torch's
dense gradient (its step was no faster either way, measured in turns), as does every other device
(MPS has no sparse tensors, and how a GPU adds the rows, in which order, is not what this file
checks). Only while training with gradients on, and only on a plain weight: evaluation and
sampling get torch's dense gradient, as does a weight that LoRA computes from its parts
(training/lora.py's new-token rows), whose backward takes a dense one. A training backward that
never reached the head would leave the rows alone as the weight's gradient, which optimizers do
not take; minitf's loss always goes through the head."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from .lm_loss import LARGE_VOCAB

ROWS_FROM = LARGE_VOCAB  # a vocabulary this large or larger: below it the dense (V, C) is a few MB


class TiedEmbedding(nn.Embedding):
    """nn.Embedding whose training backward on a CPU is sparse (its rows), for the head's dense
    gradient to take in place. DDP reads nn.Embedding.sparse to expect a sparse gradient: it stays
    False, as the weight's gradient, the sum, is dense."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = (
            self.num_embeddings >= ROWS_FROM
            and idx.device.type == "cpu"
            and self.training
            and torch.is_grad_enabled()
            and self.weight.requires_grad
            and not parametrize.is_parametrized(self)
        )
        w, pad = self.weight, self.padding_idx  # (V, C)
        return F.embedding(idx, w, pad, self.max_norm, self.norm_type, self.scale_grad_by_freq, rows)  # (B, T, C)
