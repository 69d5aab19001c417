"""Small models made by hand for the tests: seeded, with weights moved off the init where choices
must not tie; a Session over given micro-batches for one trainer step; a GPT-2 config of the tiny
run's shape; and the induction prompts of tests/interpret_models.py."""

import contextlib
import tempfile
from pathlib import Path

import torch

import minitf

CFG = minitf.ModelConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)

MUON = dict(optimizer="muon", lr=2e-3, muon_lr=0.05, weight_decay=0.0)

LLAMA = dict(positions="rope", norm="rmsnorm", ffn="swiglu")


def model_and_batch(seed=0):
    """CFG's model and one (x, y) batch of 4 x 16 token ids, both seeded."""
    torch.manual_seed(seed)
    model = minitf.Transformer(CFG)
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def spread_model(**kw) -> minitf.Transformer:
    """A tiny eval-mode model (vocabulary 97, block 16; kw: other ModelConfig values) whose weights
    are larger than the init's, so its logits spread over tens instead of a near-uniform ~0 and
    greedy choices are not all ties: what the sampler's, the sizes' and generation's tests read."""
    torch.manual_seed(0)
    base = dict(vocab_size=97, block_size=16, n_layer=2, n_head=2, n_embd=32)
    m = minitf.Transformer(minitf.ModelConfig(**{**base, **kw})).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def gqa_model(seed=0, **kw) -> minitf.Transformer:
    """A rotary model with 4 query heads (kw: n_kv_head and others), its weights off the init."""
    torch.manual_seed(seed)
    base = dict(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=32, positions="rope")
    m = minitf.Transformer(minitf.ModelConfig(**{**base, **kw}))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # off the initial values: zero biases and head hide mistakes
    return m.eval()


GQA_IDS = torch.tensor([[5, 17, 42, 9, 3, 77, 12, 8, 61, 2]])


def tiny_gpt2_config(tf, tok):
    """transformers' GPT2Config of the tiny test model's shape (2 layers, 2 heads, 32 wide,
    32 positions) for tokenizer tok, its <|endoftext|> as BOS and EOS: a valid run.init_from."""
    return tf.GPT2Config(
        vocab_size=tok.vocab_size,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.eot_id,
        eos_token_id=tok.eot_id,
    )


class MicroBatches:
    """A TokenData stand-in whose get_batch hands out the given (x, y) micro-batches in order."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def get_batch(self, *args, **kwargs):
        return next(self.batches)


def step_session(model, micro_batches, optimizer, tc, distributed: bool = False, raw_model=None):
    """A Session over `model` (DDP-wrapped or not; raw_model: the module itself) whose batches are
    `micro_batches`, for one call of the trainer's own forward_backward: float32, no autocast."""
    from minitf.config import Config
    from minitf.system.runtime import Dist
    from minitf.training.metrics import Meter
    from minitf.training.session import Session

    raw = model if raw_model is None else raw_model
    return Session(
        cfg=Config(model=raw.config, train=tc),
        run_dir=Path(tempfile.gettempdir()),  # forward_backward writes nothing
        procs=Dist(world=2 if distributed else 1),
        device=torch.device("cpu"),
        dtype=torch.float32,
        data=MicroBatches(micro_batches),
        model=model,
        raw_model=raw,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext(),
        batch_gen=torch.Generator(),
        meter=Meter(1.0, None, 0),
    )


# the model continues "... D" with the token after the earlier D: E in the clean prompt, F in the
# corrupted one, which differs at position 5 only
A, B, C, D, E, F = 3, 8, 1, 12, 6, 14
CLEAN = torch.tensor([0, A, B, C, D, E, A, B, C, D])
CORRUPTED = torch.tensor([0, A, B, C, D, F, A, B, C, D])
