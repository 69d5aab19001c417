"""BF16AdamW (train.param_dtype=bfloat16): torch's AdamW step within one bfloat16 spacing, small
updates kept on average where round-to-nearest loses them, and draws that repeat by step (equal
replicas, exact resume)."""

import copy

import torch

import minitf
from minitf.config import TrainConfig
from minitf.fast.bf16_adamw import BF16AdamW, round_stochastically
from minitf.training import precision
from tests.support.models import model_and_batch


def spacing(x: torch.Tensor) -> torch.Tensor:
    """The gap between the two bfloat16 numbers around each float32 value (8 significant bits)."""
    exponent = torch.frexp(x.abs().clamp(min=1e-30)).exponent
    return torch.ldexp(torch.ones_like(x), exponent - 8)


def test_rounding_goes_to_a_neighbour_with_the_odds_of_its_distance():
    gen = torch.Generator().manual_seed(0)
    x = torch.full((200_000,), 1.0 + 2**-10)  # an eighth of the way from 1 to the next bfloat16, 1 + 2^-7

    def bits(n):
        return torch.randint(0, 1 << 16, (n,), dtype=torch.int32, generator=gen)

    for sign in (1, -1):
        r = round_stochastically(sign * x, bits(len(x))).float()
        assert set(r.unique().tolist()) == {sign * 1.0, sign * (1 + 2**-7)}
        assert abs((r == sign * (1 + 2**-7)).float().mean().item() - 1 / 8) < 0.005
    exact = torch.tensor([0.0, -0.0, 1.0, -2.5, 2.0**127, float("inf"), float("-inf"), float("nan")])
    kept = round_stochastically(exact, bits(len(exact))).float()
    assert torch.equal(kept[:-1], exact[:-1]) and kept[-1].isnan()  # a bfloat16 value stays itself


def _pair(seed: int, shape=(300, 200)):
    """A bfloat16 weight and its float32 twin (the same values), each with the same gradient."""
    torch.manual_seed(seed)
    w = torch.randn(shape).to(torch.bfloat16)
    ours, ref = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.float())
    return ours, ref


def test_one_step_is_torchs_adamw_within_one_bfloat16_spacing():
    ours, ref = _pair(0)
    bias = torch.nn.Parameter(torch.randn(200))  # a float32 vector: updated exactly as torch's
    bias_ref = torch.nn.Parameter(bias.detach().clone())
    kw = {"lr": 1e-2, "betas": (0.9, 0.95)}
    opt = BF16AdamW([{"params": [ours], "weight_decay": 0.1}, {"params": [bias], "weight_decay": 0.0}], **kw)
    ref_opt = torch.optim.AdamW(
        [{"params": [ref], "weight_decay": 0.1}, {"params": [bias_ref], "weight_decay": 0.0}], **kw
    )
    for _ in range(2):
        g, gb = torch.randn(ours.shape), torch.randn(200)
        ours.grad, ref.grad, bias.grad, bias_ref.grad = g.to(torch.bfloat16), g.to(torch.bfloat16).float(), gb, gb
        opt.step()
        ref_opt.step()
        assert ((ours.float() - ref).abs() <= spacing(ref.detach()) * 1.001).all()
        ref.data = ours.detach().float()  # the next step starts where ours is
        ref_opt.state[ref]["exp_avg"].copy_(opt.state[ours]["exp_avg"].float())
        ref_opt.state[ref]["exp_avg_sq"].copy_(opt.state[ours]["exp_avg_sq"].float())
    torch.testing.assert_close(bias, bias_ref, rtol=1e-6, atol=1e-7)


def test_updates_below_bfloat16s_spacing_move_the_weights_on_average():
    """lr 1e-5 on weights near 0.5 (spacing 2^-9 = 0.002): torch's AdamW on bfloat16 weights rounds
    every step back to where it began; BF16AdamW moves them by lr a step on average, as float32 does."""
    steps, lr = 50, 1e-5
    start = torch.full((100_000,), 0.5)
    moved = {}
    for name, dtype, cls in (
        ("ours", torch.bfloat16, BF16AdamW),
        ("nearest", torch.bfloat16, torch.optim.AdamW),
        ("float32", torch.float32, torch.optim.AdamW),
    ):
        p = torch.nn.Parameter(start.to(dtype))
        opt = cls([p], lr=lr, weight_decay=0.0) if cls is torch.optim.AdamW else cls([p], lr=lr)
        for _ in range(steps):
            p.grad = torch.ones_like(p)  # Adam's normalised step: -lr each time
            opt.step()
        moved[name] = (p.float() - 0.5).mean().item()
    assert moved["nearest"] == 0.0
    assert abs(moved["float32"] / (-steps * lr) - 1) < 0.01
    assert abs(moved["ours"] / moved["float32"] - 1) < 0.05


def test_the_draws_repeat_by_step_so_replicas_agree_and_a_resume_is_exact():
    a, _ = _pair(1)
    b = torch.nn.Parameter(a.detach().clone())
    opt_a, opt_b = BF16AdamW([a], lr=1e-3), BF16AdamW([b], lr=1e-3)
    grads = [torch.randn(a.shape).to(torch.bfloat16) for _ in range(4)]
    for g in grads[:2]:
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert torch.equal(a, b)  # two processes of one run: the same weights after every step
    resumed = torch.nn.Parameter(a.detach().clone())
    opt_r = BF16AdamW([resumed], lr=1e-3)
    opt_r.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    for g in grads[2:]:
        a.grad, resumed.grad = g.clone(), g.clone()
        opt_a.step()
        opt_r.step()
    assert torch.equal(a, resumed)
    assert opt_r.state[resumed]["exp_avg"].dtype == torch.bfloat16


def _held_model(seed: int) -> minitf.Transformer:
    """CFG's model (tied head) with its matrices in bfloat16 as train.param_dtype=bfloat16 holds them,
    its norm gains moved off one (a trained model's are)."""
    model, _, _ = model_and_batch(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    precision.hold(model, TrainConfig(param_dtype="bfloat16", dtype="bfloat16", optimizer="adamw"))
    return model


def test_in_backward_makes_the_steps_updates_and_holds_no_gradient():
    """train.optimizer_in_backward: each weight is updated as backward finishes its gradient. The
    weights and moments after three steps are the ones step() makes after a whole backward, bit for
    bit (each weight's random windows are its own, in any order); no gradient is left after
    backward; the reported norm is the gradients' (in float32: clip_grad_norm_ sums bfloat16 norms)."""
    stepped, hooked = _held_model(0), _held_model(0)
    opt_s, opt_h = BF16AdamW(stepped.parameters(), lr=1e-2), BF16AdamW(hooked.parameters(), lr=1e-2, in_backward=True)
    _, x, y = model_and_batch(0)
    for _ in range(3):
        for model in (stepped, hooked):
            with torch.autocast("cpu", torch.bfloat16):
                model(x, y, logits=False)[1].backward()
        grads = torch.cat([p.grad.float().flatten() for p in stepped.parameters()])  # (P,) in float32
        norm = grads.norm()  # clip_grad_norm_'s, without its bfloat16 per-tensor norms
        opt_s.step()
        opt_s.zero_grad()
        assert all(p.grad is None for p in hooked.parameters())
        torch.testing.assert_close(opt_h.gradient_norm(), norm, rtol=1e-5, atol=0)
    for (name, a), b in zip(stepped.named_parameters(), hooked.parameters()):
        assert torch.equal(a, b), name
        assert torch.equal(opt_s.state[a]["exp_avg_sq"], opt_h.state[b]["exp_avg_sq"]), name


def test_in_backward_leaves_a_weight_with_a_non_finite_gradient_as_it_was():
    w, _ = _pair(2)
    ok = torch.nn.Parameter(torch.randn(50).to(torch.bfloat16))
    opt = BF16AdamW([w, ok], lr=1e-2, in_backward=True)
    before, before_ok = w.detach().clone(), ok.detach().clone()
    bad = torch.ones(w.shape)
    bad[3, 4] = float("nan")
    ((w.float() * bad).sum() + ok.float().sum()).backward()
    assert torch.equal(w, before) and not torch.equal(ok, before_ok)
    assert opt.gradient_norm().isnan()  # the step reports it: the trainer counts it as a bad step
    assert opt.gradient_norm() == 0  # and begins the next from nothing
