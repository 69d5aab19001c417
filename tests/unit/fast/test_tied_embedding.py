"""TiedEmbedding: a tied model's training backward never makes a second (V, C) for the embedding's
rows, and the tied matrix's gradient is the one the dense embedding gives."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import minitf
from minitf.fast import tied_embedding
from minitf.fast.tied_embedding import TiedEmbedding
from tests.support.models import model_and_batch


class NewTensorsOfShape(TorchDispatchMode):
    """Lists the ops that make a new dense tensor of one shape (a sparse one holds its rows alone)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.made = torch.Size(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.shape == self.shape and out.layout == torch.strided:
            given = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and not a.is_sparse}
            if out.untyped_storage().data_ptr() not in given:  # not a view of an input, nor written in place
                self.made.append(func.overloadpacket.__name__)
        return out


def _gradient(model, x, y, training: bool, dtype) -> tuple[torch.Tensor, list[str]]:
    """The tied matrix's gradient after one backward, and the ops of that backward that made a (V, C)."""
    model.train(training)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
        loss = model(x, y, logits=False)[1]
    with NewTensorsOfShape(model.wte.weight.shape) as seen:
        loss.backward()
    return model.wte.weight.grad, seen.made


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tied_gradient_is_the_dense_one_with_no_vocabulary_sized_embedding_gradient(dtype, monkeypatch):
    monkeypatch.setattr(tied_embedding, "ROWS_FROM", 64)  # the rows path, as for a downloaded model's vocabulary
    model, _, _ = model_and_batch(0)  # dropout 0: training and evaluation compute the same
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (3, 15), generator=g), torch.randint(0, 64, (3, 15), generator=g)  # 45 rows, not V
    assert isinstance(model.wte, TiedEmbedding)
    dense, dense_made = _gradient(model, x, y, training=False, dtype=dtype)  # torch's dense embedding gradient
    dense = dense.clone()
    rows, rows_made = _gradient(model, x, y, training=True, dtype=dtype)
    assert rows.layout == torch.strided  # the sum is dense: what optimizers and DDP take
    torch.testing.assert_close(rows, dense, rtol=1e-6, atol=1e-7)
    # the dense path makes the embedding's whole (V, C) as well; here the rows go into the head's.
    # (Both also list an "add": the references this mode holds keep autograd from adding in place.)
    assert "embedding_dense_backward" in dense_made and "embedding_dense_backward" not in rows_made
    assert len(rows_made) == len(dense_made) - 1


def test_a_small_vocabulary_keeps_the_dense_gradient():
    model, x, y = model_and_batch(0)  # 64 tokens: the default path, bit for bit as before
    assert "embedding_dense_backward" in _gradient(model, x[:3, :15], y[:3, :15], training=True, dtype=torch.float32)[1]


def test_an_untied_model_keeps_torchs_embedding():
    model = minitf.Transformer(minitf.ModelConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16,
                                                  tie_embeddings=False))  # fmt: skip
    assert type(model.wte) is torch.nn.Embedding
