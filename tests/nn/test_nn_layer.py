"""SVAttention: shapes, state size, certified selection (dropping reserve tokens)."""

from __future__ import annotations

import pytest
import torch

from svattn.nn import SVAttention

TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _layer(n_heads, mode, dtype, C=0.1, seed=0):
    torch.manual_seed(seed)
    return SVAttention(16, n_heads, C=C, mode=mode).to(dtype)


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_shapes_and_tokens_kept(mode):
    layer = _layer(2, mode, torch.float64)
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    ctx = torch.randn(3, 30, 16, dtype=torch.float64)
    out, alpha, part = layer(x, ctx, return_alpha=True)
    assert out.shape == (3, 9, 16) and alpha.shape == (3, 2, 30)
    kept = (part.margin | part.error).sum(-1)
    assert layer.tokens_kept() == int(kept.max())
    assert (alpha > 0).sum(-1).max() <= layer.tokens_kept()
    assert ((part.margin.int() + part.error.int() + part.reserve.int()) == 1).all()


@pytest.mark.parametrize("mode", ["batched", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_dropping_reserve_tokens_leaves_output_unchanged(mode, dtype):
    """Certified selection: a one-head layer, reserve tokens physically removed."""
    layer = _layer(1, mode, dtype)
    x = torch.randn(2, 7, 16, dtype=dtype)
    ctx = torch.randn(1, 60, 16, dtype=dtype).expand(2, 60, 16)
    out, alpha, part = layer(x, ctx, return_alpha=True)
    keep = ~part.reserve[0, 0]
    assert part.reserve.sum() > 0 and (part.reserve[0] == part.reserve[1]).all()
    out2 = layer(x, ctx[:, keep])
    torch.testing.assert_close(out2, out, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_masking_reserve_tokens_per_head_leaves_output_unchanged(mode):
    layer = _layer(2, mode, torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    ctx = torch.randn(2, 50, 16, dtype=torch.float64)
    out, _, part = layer(x, ctx, return_alpha=True)
    out2 = layer(x, ctx, key_mask=~part.reserve)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)


def test_gradients_reach_all_projections():
    layer = _layer(2, "batched", torch.float32)
    layer(torch.randn(2, 20, 16)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name
