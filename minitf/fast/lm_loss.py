"""The training loss of the language-model head, fused: the mean cross-entropy of the logits
x @ W^T against the next tokens, with the gradients of x and W found in the same pass.

Why: with a 4,096-token vocabulary the logits of one batch (2,048 tokens x 4,096 floats) are 32 MB,
and the plain path (logits, then log-softmax, then the loss) writes and reads that tensor about ten
times over a step: log-softmax's output, the zero-filled gradient the loss's backward scatters
into, the softmax gradient. On a CPU these passes over memory cost as much as the head's matmuls
themselves. Here the rows go through in chunks small enough to stay in the cache: for each chunk,
its logits, their log-sum-exp, the loss, then in place the gradient softmax - one_hot(target),
which meets W and x at once. Backward only scales the two saved gradients by the incoming one.
On a GPU the cache argument does not hold, and each chunk costs a rewrite of W's whole (V, C)
gradient and a dozen kernel launches: there the chunks are as large as GPU_CHUNK_BYTES of
logits allow (all rows at once for a 4,096-token vocabulary), see chunk_rows.
The loss and gradients are the plain path's up to float rounding (tests/unit/test_model.py checks).
Under autocast (for a large vocabulary, Transformer.fused_loss_applies) the matmuls run in its
dtype as the plain path's would, the softmax in float32; a frozen head (LoRA's) gets no gradient,
where the plain path's logits, their float32 copy, log-softmax and gradient would each be whole.

Training uses it (`Transformer.forward(..., logits=False)`). Evaluation asks for the loss alone too:
for a large vocabulary it goes through the same chunks without gradients (`cross_entropy_in_chunks`),
as the plain path's whole logits would be a LoRA run's largest tensors (a Qwen3's 151,936 per token,
bf16, then float32, then log-softmax: 0.8 GB for 2 rows of 257). Sampling wants the logits: the plain path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data import IGNORE  # noqa: F401 (targets equal to this count neither in the loss nor in the mean)

CHUNK_ROWS = 256  # rows per chunk on a CPU: 256 x 4,096 float32 logits are 4 MB, about a core's L2
# a downloaded model's vocabulary (GPT-2's 50,257; Llama 3's 128,256; Qwen's 151,936): its logits are
# fused under autocast too, for memory (a Llama 3's float32 logits of 1,200 tokens are 0.6 GB, held several times)
LARGE_VOCAB = 32768
GPU_CHUNK_BYTES = 512 * 2**20  # float32 logits per chunk on a GPU: a bounded memory, a few chunks at most


def chunk_rows(device: torch.device, vocab: int) -> int:
    """Rows per chunk: CHUNK_ROWS on a CPU (and elsewhere as before); on a CUDA GPU as many as
    GPU_CHUNK_BYTES of float32 logits hold, e.g. 32,768 rows for 4,096 tokens, 2,668 for GPT-2's 50,304."""
    if device.type != "cuda":
        return CHUNK_ROWS
    return max(CHUNK_ROWS, GPU_CHUNK_BYTES // (4 * vocab))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int, dtype) -> torch.Tensor:
        # x (N, C) float32, weight (V, C), targets (N,) ids or IGNORE; rows per chunk; dtype: the
        # matmuls' (float32, or autocast's 16 bits, as the plain path's head would run them)
        with torch.autocast(x.device.type, enabled=False):  # the casts below are the ones autocast makes
            return _fused(ctx, x, weight, targets, rows, dtype)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        # scaled in place: a (V, C) gradient is not held twice (a Llama 3's head: 1 GB in float32)
        return grad_x.mul_(grad_loss), grad_w.mul_(grad_loss) if grad_w.numel() else None, None, None, None


def _fused(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int, dtype) -> torch.Tensor:
    """The loss, with x's gradient, and weight's where it is trained (a LoRA run's head is frozen:
    no (V, C) gradient at all), saved on ctx for backward."""
    keep = targets != IGNORE  # (N,)
    count = keep.sum().clamp(min=1)  # the mean's denominator (no target at all: loss 0, not 0/0)
    ids = torch.where(keep, targets, 0)  # (N,) a valid row to gather from for ignored targets
    # on a CPU, asking whether any target is ignored costs nothing; on a GPU it would wait for the device
    everyone = x.device.type == "cpu" and bool(keep.all())
    w = weight.to(dtype)  # (V, C) the head as the matmuls read it (itself in float32)
    grad_x = torch.empty_like(x)  # (N, C)
    trained = ctx.needs_input_grad[1]
    # summed in the head's own dtype: float32, or bfloat16 where it is held so (train.param_dtype),
    # with no float32 (V, C) beside it that autograd would then have to copy into the head's dtype
    grad_w = torch.zeros_like(weight) if trained else weight.new_empty(0)  # (V, C)
    total = x.new_zeros(())
    for start in range(0, x.size(0), rows):
        chunk = slice(start, start + rows)
        xc, idc = x[chunk].to(dtype), ids[chunk].unsqueeze(1)  # (n, C), (n, 1)
        logits = (xc @ w.T).float()  # (n, V) float32 (no copy when the matmul was)
        lse = torch.logsumexp(logits, dim=1, keepdim=True)  # (n, 1)
        nll = lse - logits.gather(1, idc)  # (n, 1): -log p(target)
        grad = logits.sub_(lse).exp_()  # (n, V) softmax, in the logits' memory
        grad.scatter_add_(1, idc, torch.full_like(nll, -1.0))  # softmax - one_hot(target)
        if not everyone:  # ignored rows add nothing to the loss or the gradients
            k = keep[chunk].unsqueeze(1).to(grad.dtype)  # (n, 1)
            nll, grad = nll * k, grad.mul_(k)
        total += nll.sum()
        grad = grad.to(dtype)  # (n, V) as the plain path's backward multiplies it
        grad_x[chunk] = grad @ w  # (n, C)
        if not trained:
            continue
        if grad_w.dtype == dtype:
            grad_w.addmm_(grad.T, xc)  # (V, C), in place
        else:
            grad_w += grad.T @ xc  # (V, C) summed in float32 over the chunks
    count = count.to(x.dtype)
    ctx.save_for_backward(grad_x.div_(count), grad_w.div_(count))
    return total / count


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean over targets != -100 of cross_entropy(x @ weight.T, targets): x (N, C), weight (V, C),
    targets (N,). Its backward gives x's and weight's gradients (computed already, in the forward).
    Under autocast the matmuls run in its dtype and the softmax in float32, as the plain path's."""
    return _LinearCrossEntropy.apply(x, weight, targets, chunk_rows(x.device, weight.size(0)), _matmul_dtype(x))


@torch.no_grad()
def cross_entropy_in_chunks(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """linear_cross_entropy's loss with no gradient (evaluation): x (N, C), weight (V, C), targets (N,),
    the matmuls in autocast's dtype where it is on, the softmax in float32; 0 where no target counts."""
    dtype = _matmul_dtype(x)
    w = weight.to(dtype)  # (V, C)
    rows = chunk_rows(x.device, weight.size(0))
    total = torch.zeros((), dtype=torch.float32, device=x.device)
    with torch.autocast(x.device.type, enabled=False):
        for start in range(0, x.size(0), rows):
            logits = (x[start : start + rows].to(dtype) @ w.T).float()  # (n, V)
            total += F.cross_entropy(logits, targets[start : start + rows], ignore_index=IGNORE, reduction="sum")
    return total / (targets != IGNORE).sum().clamp(min=1)


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmuls run in: autocast's where it is on (as the plain path's would), else x's."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
