"""Positions: the sinusoidal formula element by element, and rotary's two defining properties."""

import math

import torch

import minitf
from minitf.positions import LearnedPositions, Rotary, SinusoidalPositions, rotary_angles, sinusoidal_table


def test_sinusoidal_table_matches_formula():
    P, d = 50, 16
    pe = sinusoidal_table(P, d)
    for pos in range(P):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert abs(pe[pos, 2 * i].item() - math.sin(angle)) < 1e-6
            assert abs(pe[pos, 2 * i + 1].item() - math.cos(angle)) < 1e-6


def test_sinusoidal_and_learned_offsets():
    s = SinusoidalPositions(20, 8)
    torch.testing.assert_close(s(3, offset=5), sinusoidal_table(20, 8)[5:8])
    lp = LearnedPositions(20, 8)
    torch.testing.assert_close(lp(3, offset=5), lp.wpe.weight[5:8])


def test_rotary_preserves_norms():
    rope = Rotary(64, 8)
    x = torch.randn(2, 3, 10, 8)
    y = rope(x, offset=7)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    assert not torch.allclose(y, x)


def test_rotary_dot_product_depends_only_on_distance():
    rope = Rotary(128, 8)
    q, k = torch.randn(8), torch.randn(8)

    def dot(m, n):  # q at position m, k at position n
        qm = rope(q.view(1, 1, 8), offset=m)[0, 0]
        kn = rope(k.view(1, 1, 8), offset=n)[0, 0]
        return (qm @ kn).item()

    for dist in (0, 1, 5, 17):
        vals = [dot(m + dist, m) for m in (0, 3, 40, 100)]
        assert max(vals) - min(vals) < 1e-4, vals
    assert abs(dot(5, 0) - dot(0, 5)) > 1e-3  # and it does depend on the direction
    # position 0 is the identity rotation
    torch.testing.assert_close(rope(q.view(1, 1, 8), 0)[0, 0], q)


def test_rotary_angles_are_the_rotations_rope_applies():
    angles = rotary_angles(64, 8, base=100.0)  # (P, D/2)
    assert angles.shape == (64, 4) and angles[5, 1].item() == 5 * 100.0 ** (-2 / 8)
    rope = Rotary(64, 8, base=100.0)
    torch.testing.assert_close(rope.cos, angles.cos().float(), atol=0, rtol=0)
    torch.testing.assert_close(rope.sin, angles.sin().float(), atol=0, rtol=0)
    # a vector whose pair i is (1, 0) comes out as (cos, sin) of its angle
    x = torch.zeros(1, 1, 8)
    x[..., :4] = 1.0
    y = rope(x, offset=9)[0, 0]
    torch.testing.assert_close(y, torch.cat([angles[9].cos(), angles[9].sin()]).float(), atol=1e-6, rtol=0)


# README claims and options that had no test, each checked against a value the code does not
# compute itself: an explicit formula, plain autograd, counted draws, a hand-worked set.


def test_rotary_equals_the_explicit_rotation_of_each_pair():
    D, base = 8, 500.0
    rope = Rotary(32, D, base=base)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    y = rope(x, offset=3)
    for t in range(5):
        pos = 3 + t
        for i in range(D // 2):  # rotate-half layout: dimension i pairs with i + D/2
            theta = pos * base ** (-2 * i / D)
            a, b = x[:, t, i], x[:, t, i + D // 2]
            torch.testing.assert_close(y[:, t, i], a * math.cos(theta) - b * math.sin(theta))
            torch.testing.assert_close(y[:, t, i + D // 2], a * math.sin(theta) + b * math.cos(theta))


def test_rope_base_reaches_the_model():
    cfg = dict(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, positions="rope")
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))

    def logits(base):
        torch.manual_seed(0)
        m = minitf.Transformer(minitf.ModelConfig(**cfg, rope_base=base))
        with torch.no_grad():  # weights larger than the init's, so attention is far from uniform
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        return m(idx)[0]

    assert (logits(10000.0) - logits(100.0)).abs().max() > 1e-2
