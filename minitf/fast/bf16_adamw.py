"""AdamW for weights held in bfloat16 (train.param_dtype=bfloat16): the weights, their gradients and
both moments in 2 bytes each, 8 bytes a parameter where float32 weights take 16, as a full
fine-tune in Hugging Face's bfloat16 takes. Machinery beside optim.py, which chooses it.

Why not torch's AdamW on bfloat16 weights: it rounds each updated weight to the nearest bfloat16,
whose 8 significant bits space the numbers near 0.5 about 0.002 apart, so a fine-tune's update of
1e-5 rounds back to the weight it started from, every step: the weights stop learning. Here each
new value is computed in float32 and rounded up or down at random, with the odds of its distance to
each neighbour (stochastic rounding): a weight moves by the update *on average*, as float32 would.
The first moment, an average of the last ~10 gradients (beta1 0.9), moves by a tenth of itself a
step, far above that spacing, and is rounded to the nearest; the second, an average of squares over
up to ~1,000 steps (beta2 0.999), moves by less than the spacing and is rounded stochastically too.

The random bits: the CPU's generator makes 4M numbers in 12 ms, ten times what the update itself
takes, so each chunk's bits are a window of one random buffer at a random place, xor'd with a
random word. Every value's bits are uniform, which is all the rounding's odds rest on. The windows'
places and words come from a generator seeded by the step and the weight's index in the optimizer:
every process of a run draws the same (DDP's replicas stay equal), a resumed run draws what it
would have drawn (resume is exact), and the weights may be updated in any order.

The update is one function compiled by torch.compile into a single pass over memory (0.5 s a step
for 0.6B parameters on 2 cores, where the same ops one by one take 8 s); where compiling fails (no
C++ compiler) it runs as it is. Why not torchao's bfloat16 AdamW: a private class there, which
draws from the process's generator, different on every rank.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from ..errors import ConfigError

CHUNK = 1 << 22  # elements updated at a time: float32 temporaries of 16 MB, not of a whole embedding
KEEP_HIGH = -(1 << 16)  # 0xFFFF0000 as an int32: the 16 bits a bfloat16 keeps of a float32
LOW16 = 0xFFFF


def round_stochastically(x: torch.Tensor, bits16: torch.Tensor) -> torch.Tensor:
    """float32 x as bfloat16, each value rounded toward zero or away from it with the odds of its
    distance to each, given uniform random integers bits16 in [0, 2^16): E[result] = x.

    A bfloat16 is a float32's upper 16 bits. Adding a random 16-bit number to the lower bits
    carries into the upper ones with probability (lower bits) / 2^16, the fraction of the way to
    the next bfloat16 away from zero; then the lower bits are dropped. Sign-magnitude makes this
    the same for negative numbers."""
    return ((x.view(torch.int32) + bits16) & KEEP_HIGH).view(torch.float32).to(torch.bfloat16)  # exact: low bits 0


def squares_chunk(g: torch.Tensor) -> torch.Tensor:
    """The sum of a chunk's squared values in float32 (()); compiled, one read of g and no float32 copy."""
    return g.float().square().sum()


def summed_squares(g: torch.Tensor, squares=squares_chunk) -> torch.Tensor:
    """The sum of g's squared values in float32 (()), CHUNK at a time: no float32 copy of a whole embedding."""
    flat = g.view(-1)
    return sum(squares(flat[i : i + CHUNK]) for i in range(0, flat.numel(), CHUNK))


def adamw_chunk(w, g, m, v, bits, hyper) -> None:
    """One AdamW step of a chunk of bfloat16 weights w (in place), with their gradients g and
    moments m, v; bits: uniform random int32s, one per weight (their low and high halves round w and
    v). hyper (7,) float32: 1 - beta1, beta2, 1 - beta2, 1 - lr * weight decay, lr / (1 - beta1^t),
    sqrt(1 - beta2^t), eps. torch.optim.AdamW's rule, in float32."""
    g32 = g.float()
    m32 = m.float().lerp(g32, hyper[0])
    v32 = v.float() * hyper[1] + g32 * g32 * hyper[2]
    w32 = w.float() * hyper[3] - hyper[4] * m32 / (v32.sqrt() / hyper[5] + hyper[6])
    w.copy_(round_stochastically(w32, bits & LOW16))
    v.copy_(round_stochastically(v32, (bits >> 16) & LOW16))
    m.copy_(m32.to(torch.bfloat16))


class Compiled:
    """fn compiled by torch.compile on its first call; run as it is where compiling fails (no C++
    compiler, or a backend that cannot), with a warning: the same ops, one by one."""

    def __init__(self, fn):
        self.fn, self.run = fn, None

    def __call__(self, *args):
        if self.run is None:
            self.run = torch.compile(self.fn, dynamic=True)
        try:
            return self.run(*args)
        except Exception as e:
            if self.run is self.fn:
                raise
            warnings.warn(
                f"the bfloat16 AdamW step runs uncompiled, several times slower ({type(e).__name__})", stacklevel=3
            )
            self.run = self.fn
            return self.run(*args)


class BF16AdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's rule, decoupled weight decay) whose bfloat16 weights and moments
    are updated in float32 and stored back as above. A float32 weight (a norm's gain, a bias:
    vectors that training/precision.py leaves in float32) is updated exactly as torch's AdamW does.

    in_backward=True (train.optimizer_in_backward): each weight is updated the moment backward has
    finished its gradient, which is then let go, so a step never holds every gradient at once (at
    its peak a full fine-tune holds 8 bytes a parameter, the weight, its gradient and two moments:
    this takes the gradient's 2 away). What it gives up: clipping by the global norm, which needs
    every gradient before the first update. gradient_norm() gives the norm of what it updated from."""

    def __init__(
        self,
        params,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        seed: int = 0,
        in_backward: bool = False,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})
        self.seed = seed
        self.buffers: dict[torch.device, torch.Tensor] = {}  # the random bits each chunk takes a window of
        self.update, self.squares_of = Compiled(adamw_chunk), Compiled(squares_chunk)
        self.entries = self._entries()
        for p in self.entries:  # the moments now, before any activation: they lie together, not between them
            self._state_of(p)
        self.squares: torch.Tensor | None = None  # in_backward: the gradients' summed squares this step
        if in_backward:
            if dist.is_initialized() and dist.get_world_size() > 1:
                raise ConfigError(
                    "train.optimizer_in_backward updates each weight from this process's gradient before DDP "
                    "averages it over the processes; train on one process, or remove train.optimizer_in_backward"
                )
            for p in self.entries:
                p.register_post_accumulate_grad_hook(self._update_now)

    def _entries(self) -> dict:
        """Each weight's group and index, in the order the groups list them."""
        return {p: (g, i) for i, (g, p) in enumerate((g, p) for g in self.param_groups for p in g["params"])}

    def load_state_dict(self, state_dict: dict) -> None:
        self.state.clear()  # the zero moments made at construction go before the loaded ones are taken
        super().load_state_dict(state_dict)
        self.entries = self._entries()  # the groups are new dicts now: the learning rate is set in those

    @torch.no_grad()
    def step(self) -> None:
        for p in self.entries:
            if p.grad is not None:  # in_backward: none left, each weight was updated as its gradient came
                self._update_weight(p)

    def gradient_norm(self) -> torch.Tensor:
        """in_backward: the global norm of the gradients updated from since the last call (float32 ()),
        what clip_grad_norm_ returns; non-finite where any was, whose weight was then left as it was."""
        squares, self.squares = self.squares, None
        return torch.zeros((), device=next(iter(self.entries)).device) if squares is None else squares.sqrt()

    @torch.no_grad()
    def _update_now(self, p: torch.Tensor) -> None:
        """in_backward: p's gradient is complete. Update p from it and let it go."""
        squares = summed_squares(p.grad, self.squares_of)
        self.squares = squares if self.squares is None else self.squares + squares
        if torch.isfinite(squares):
            self._update_weight(p)
        p.grad = None  # the memory this mode is for

    def _update_weight(self, p: torch.Tensor) -> None:
        group, index = self.entries[p]
        state = self._state_of(p)
        if p.dtype == torch.float32:
            self._exact(p, state, group)
            return
        if p.dtype != torch.bfloat16:
            raise TypeError(f"BF16AdamW updates bfloat16 or float32 weights; got {p.dtype}")
        state["step"] += 1
        # each weight's own generator, seeded by the step and its place: the same windows in any order
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + int(state["step"])) * 65_537 + index)
        self._rounded(p, state, group, gen)

    def _state_of(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        return state

    def _exact(self, p: torch.Tensor, state: dict, group: dict) -> None:
        """A float32 weight: torch's AdamW, in place (it counts the step itself)."""
        adamw(
            [p], [p.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
            amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
        )  # fmt: skip

    def _rounded(self, p: torch.Tensor, state: dict, group: dict, gen: torch.Generator) -> None:
        """A bfloat16 weight, CHUNK elements at a time, each with a random window of the bits."""
        (beta1, beta2), lr, t = group["betas"], group["lr"], float(state["step"])
        hyper = [1 - beta1, beta2, 1 - beta2, 1 - lr * group["weight_decay"], lr / (1 - beta1**t)]
        hyper = torch.tensor([*hyper, (1 - beta2**t) ** 0.5, group["eps"]], dtype=torch.float32, device=p.device)
        buffer = self._buffer(p.device)
        flat = [x.view(-1) for x in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
        for start in range(0, p.numel(), CHUNK):
            w, g, m, v = (x[start : start + CHUNK] for x in flat)
            at, word = torch.randint(0, CHUNK, (2,), generator=gen).tolist()
            bits = buffer[at : at + w.numel()] ^ word  # uniform, as the buffer is
            self.update(w, g, m, v, bits, hyper)

    def _buffer(self, device: torch.device) -> torch.Tensor:
        """2 x CHUNK random int32s on device, drawn once from the seed."""
        if device not in self.buffers:
            gen = torch.Generator().manual_seed(self.seed)
            bits = torch.randint(-(2**31), 2**31 - 1, (2 * CHUNK,), dtype=torch.int32, generator=gen)
            self.buffers[device] = bits.to(device)
        return self.buffers[device]
