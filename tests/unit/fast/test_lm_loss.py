"""The fused head's chunks: a CPU's as before, a GPU's far larger, and the same loss and gradients
at any chunk size (tests/unit/test_model.py checks the fused head against the model's plain path)."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from minitf.fast import lm_loss
from minitf.fast.lm_loss import CHUNK_ROWS, IGNORE, chunk_rows, cross_entropy_in_chunks, linear_cross_entropy


def test_a_cpu_keeps_its_cache_sized_chunks():
    assert CHUNK_ROWS == 256
    for vocab in (300, 4096, 50304):
        assert chunk_rows(torch.device("cpu"), vocab) == 256
    assert chunk_rows(torch.device("meta"), 4096) == 256


def test_a_gpu_takes_chunks_of_half_a_gigabyte_of_logits():
    """On a GPU each chunk rewrites the whole (V, C) gradient of W: few, large chunks."""
    gpu = torch.device("cuda", 0)
    assert chunk_rows(gpu, 4096) == 32768  # the default recipe's batch (8,192 rows) in one chunk
    assert chunk_rows(gpu, 50304) == 2668  # GPT-2's padded vocabulary: 512 MiB of float32 logits
    assert chunk_rows(gpu, 10**7) == 256  # never below the CPU's


def test_a_gpu_tensor_gets_the_gpu_chunks(monkeypatch):
    seen = []
    monkeypatch.setattr(lm_loss._LinearCrossEntropy, "apply", lambda x, w, t, rows, dtype: seen.append(rows))
    with FakeTensorMode(allow_non_fake_inputs=True):  # the shapes and device of a GPU's tensors, no GPU
        x, w = torch.empty(8, 16, device="cuda"), torch.empty(4096, 16, device="cuda")
        linear_cross_entropy(x, w, torch.zeros(8, dtype=torch.long, device="cuda"))
    linear_cross_entropy(torch.zeros(8, 16), torch.zeros(4096, 16), torch.zeros(8, dtype=torch.long))
    assert seen == [32768, 256]


@pytest.mark.parametrize("rows", [7, 256, 10**6], ids=["small", "cpu", "one-chunk"])
def test_any_chunk_size_gives_the_plain_loss_and_gradients(rows):
    torch.manual_seed(0)
    x = torch.randn(600, 16, requires_grad=True)  # (N, C)
    w = torch.randn(50, 16, requires_grad=True)  # (V, C)
    t = torch.randint(0, 50, (600,))
    t[::7] = IGNORE
    loss = lm_loss._LinearCrossEntropy.apply(x, w, t, rows, torch.float32)
    (loss * 3).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    plain = F.cross_entropy(x @ w.T, t, ignore_index=IGNORE)
    (plain * 3).backward()
    torch.testing.assert_close(loss, plain)
    torch.testing.assert_close(gx, x.grad)
    torch.testing.assert_close(gw, w.grad)
    assert plain.item() > 1.0 and gw.abs().sum() > 1.0


def autocast_case(head_trained: bool):
    """A batch as a bfloat16 run's head sees it: float32 hidden states, a large vocabulary's rows."""
    torch.manual_seed(0)
    x = torch.randn(600, 64, requires_grad=True)  # (N, C)
    w = (torch.randn(1000, 64) / 8).requires_grad_(head_trained)  # (V, C)
    t = torch.randint(0, 1000, (600,))
    t[::7] = IGNORE
    return x, w, t


def grads_of(loss_fn, x, w, t):
    x.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(x, w, t)
    (loss * 3).backward()
    return loss.detach(), x.grad, w.grad


def near(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to bfloat16's rounding, over the whole tensor (an element near zero may differ more)."""
    return bool((a - b).norm() < 4e-3 * b.norm())


def plain_head(x, w, t):
    return F.cross_entropy((x @ w.T).float(), t, ignore_index=IGNORE)  # the model's plain path


@pytest.mark.parametrize("head_trained", [True, False], ids=["trained-head", "frozen-head"])
def test_under_autocast_the_chunks_give_the_plain_paths_bfloat16_loss_and_gradients(head_trained):
    """Under a bfloat16 autocast the matmuls run in bfloat16, as the plain path's: the loss and
    gradients are its own up to the rounding of the gradient's scale, much nearer to it than the
    float32 head's loss is. A frozen head (LoRA) gets no gradient at all."""
    x, w, t = autocast_case(head_trained)
    loss, gx, gw = grads_of(linear_cross_entropy, x, w, t)
    plain, gx_plain, gw_plain = grads_of(plain_head, x, w, t)
    float32 = F.cross_entropy(x.detach() @ w.detach().T, t, ignore_index=IGNORE)
    assert abs(loss - plain) < 1e-5 < abs(float32 - plain)  # the bfloat16 matmul's loss, not float32's
    assert near(gx, gx_plain)
    if head_trained:
        assert near(gw, gw_plain)  # the plain path rounds the sum over all rows to bfloat16 once, here each chunk's
        assert gw.dtype == torch.float32 and gw.abs().sum() > 1.0
    else:
        assert gw is None and gw_plain is None
    assert gx.dtype == torch.float32 and gx.abs().sum() > 1.0


def test_a_bfloat16_head_gets_its_gradient_summed_in_bfloat16():
    """train.param_dtype=bfloat16: the head is held in bfloat16, and its gradient is summed over the
    chunks in bfloat16 (no float32 (V, C) beside it): the plain path's, up to bfloat16's rounding."""
    x, w, t = autocast_case(head_trained=True)
    w = w.detach().to(torch.bfloat16).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        held = linear_cross_entropy(x, w, t).grad_fn.saved_tensors  # (grad_x, grad_w), made in the forward
    assert held[1].dtype == torch.bfloat16  # no float32 (V, C)
    loss, gx, gw = grads_of(linear_cross_entropy, x, w, t)
    plain, gx_plain, gw_plain = grads_of(plain_head, x, w, t)
    assert gw.dtype == gw_plain.dtype == torch.bfloat16 and gw.abs().sum() > 1.0
    assert abs(loss - plain) < 1e-5 and near(gx, gx_plain)
    assert (gw.float() - gw_plain.float()).norm() < 8e-3 * gw_plain.float().norm()


def test_evaluations_chunks_give_the_plain_loss_in_float32_and_under_autocast():
    """With no gradient to find, the chunks give the plain path's loss (its bfloat16 matmul's under
    autocast, not float32's), ignored targets excluded; no target at all gives 0, not nan."""
    x, w, t = autocast_case(head_trained=False)
    x = x.detach()
    with torch.no_grad():
        torch.testing.assert_close(cross_entropy_in_chunks(x, w, t), F.cross_entropy(x @ w.T, t, ignore_index=IGNORE))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            chunked, plain = cross_entropy_in_chunks(x, w, t), plain_head(x, w, t)
    float32 = F.cross_entropy(x @ w.T, t, ignore_index=IGNORE)
    assert abs(chunked - plain) < 1e-5 < abs(float32 - plain) and chunked.item() > 1.0
    assert cross_entropy_in_chunks(x, w, torch.full_like(t, IGNORE)).item() == 0.0
