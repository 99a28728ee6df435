"""The shared mixer suite: shape, causality, state size, long inputs, determinism."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from svattn.mixers import MIXERS, sliding_window_attention

OPTIONS = {"sliding": {"window": 8}, "deltanet": {"chunk_size": 16}, "linear": {"chunk_size": 16}}
NAMES = sorted(MIXERS)


def build(name: str, d_model: int = 16, n_heads: int = 2, seed: int = 0, **extra):
    torch.manual_seed(seed)
    return MIXERS[name](d_model=d_model, n_heads=n_heads, **{**OPTIONS.get(name, {}), **extra})


@pytest.mark.parametrize("name", NAMES)
def test_shape_and_dtype(name):
    mix = build(name).double()
    x = torch.randn(3, 21, 16, dtype=torch.float64)
    y = mix(x)
    assert y.shape == x.shape and y.dtype == x.dtype


ROPE_CASES = [  # rotary positions: the softmax mixers (the hybrid with several chunks)
    ("softmax", {"rope": True}),
    ("sliding", {"rope": True}),
    ("hybrid_sv", {"rope": True, "chunk": 8, "C": 0.25, "budget": 8}),
]


@pytest.mark.parametrize(
    ("name", "extra"), [(n, {}) for n in NAMES] + ROPE_CASES,
    ids=NAMES + [f"{n}-rope" for n, _ in ROPE_CASES],
)  # fmt: skip
def test_causal(name, extra):
    mix = build(name, **extra).double()
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 23:] = torch.randn(2, 17, 16, dtype=torch.float64)
    y, y2 = mix(x), mix(x2)
    torch.testing.assert_close(y[:, :23], y2[:, :23], rtol=0, atol=1e-12)
    assert not torch.allclose(y[:, 23:], y2[:, 23:])


@pytest.mark.parametrize("name", NAMES)
def test_state_floats(name):
    mix = build(name)
    sizes = [mix.state_floats(t) for t in (1, 8, 100, 1000)]
    assert all(isinstance(s, int) and s > 0 for s in sizes)
    fixed = {"deltanet": 2 * 8 * 8, "linear": 2 * 8 * 9, "sliding": 2 * 8 * 16}
    if name == "hybrid_sv":  # "support" policy: at most budget + chunk tokens (64 + 64)
        bound = 2 * (64 + 64) * 16
        assert sizes == [min(2 * t * 16, bound) for t in (1, 8, 100, 1000)]
    elif name in fixed:
        assert sizes[-1] == sizes[-2] == fixed[name]
    else:
        assert sizes == [2 * t * 16 for t in (1, 8, 100, 1000)]


@pytest.mark.parametrize("name", NAMES)
def test_long_input_has_no_nan(name):
    extra = {"chunk_size": 64} if name in ("deltanet", "linear") else {}
    mix = build(name, d_model=32, n_heads=2, **extra)
    with torch.no_grad():
        y = mix(torch.randn(1, 8192, 32) * 3.0)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_seed(name):
    x = torch.randn(2, 30, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(build(name, seed=3)(x), build(name, seed=3)(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_flow(name):
    mix = build(name).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64, requires_grad=True)
    mix(x).square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in mix.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_bad_input(name):
    mix = build(name)
    with pytest.raises(ValueError, match=r"x must have layout \[B, T, D\] with D = 16"):
        mix(torch.randn(2, 4, 2, 8))
    with pytest.raises(ValueError, match=r"x must have layout \[B, T, D\] with D = 16"):
        mix(torch.randn(2, 4, 15))
    with pytest.raises(ValueError, match=r"d_model \(15\) must be divisible by n_heads \(2\)"):
        build(name, d_model=15)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        build(name, windw=3)


def test_sliding_window_bad_window():
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        build("sliding", window=0)


@pytest.mark.parametrize("t", [1, 7, 8, 29], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("w", [1, 3, 8], ids=lambda w: f"W{w}")
def test_sliding_window_matches_dense_band_mask(t, w):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, t, 4, generator=g, dtype=torch.float64) for _ in range(3))
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - w))
    torch.testing.assert_close(sliding_window_attention(q, k, v, w), ref, rtol=0, atol=1e-12)


def test_full_window_equals_full_attention():
    a = build("softmax").double()
    b = build("sliding", window=64).double()
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["deltanet", "linear"])
def test_chunked_mixer_matches_naive_path(name):
    x = torch.randn(2, 37, 16, dtype=torch.float64)
    fast = build(name, seed=5).double()
    slow = build(name, seed=5, naive=True).double()
    torch.testing.assert_close(fast(x), slow(x), rtol=0, atol=1e-10)
