"""Chunked vs naive recurrent forms: values and every gradient agree."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from svattn.ops import (
    chunk_delta_rule,
    chunk_linear_attn,
    elu_feature_map,
    naive_recurrent_delta_rule,
    naive_recurrent_linear_attn,
)

TOL = {torch.float64: 1e-10, torch.float32: 1e-4}

# (B, H, T, Dk, Dv, chunk_size)
SHAPES = [
    pytest.param((1, 1, 1, 4, 4, 4), id="T1"),
    pytest.param((2, 2, 16, 8, 8, 8), id="T16-C8"),
    pytest.param((1, 3, 37, 16, 8, 16), id="T37-ragged"),
    pytest.param((2, 1, 64, 8, 12, 64), id="T64-onechunk"),
]
DTYPES = [pytest.param(torch.float64, id="f64"), pytest.param(torch.float32, id="f32")]


def _inputs(shape, dtype, seed=0):
    b, h, t, dk, dv, _ = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, dk, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, t, dk, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, t, dv, generator=g, dtype=torch.float64)
    beta = torch.rand(b, h, t, generator=g, dtype=torch.float64)
    s0 = torch.randn(b, h, dk, dv, generator=g, dtype=torch.float64) * 0.1
    z0 = torch.rand(b, h, dk, generator=g, dtype=torch.float64)
    return [x.to(dtype).requires_grad_() for x in (q, k, v, beta, s0, z0)]


def _grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    total = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in out)
    return torch.autograd.grad(total, inputs, allow_unused=False)


def _assert_close(a, b, tol, what):
    err = (a - b).abs().max().item() if a.numel() else 0.0
    scale = max(1.0, b.abs().max().item() if b.numel() else 0.0)
    assert err <= tol * scale, f"{what}: max abs diff {err:.3g} > {tol:g} (scale {scale:.3g})"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_delta_rule_chunk_matches_naive(shape, dtype):
    q, k, v, beta, s0, _ = _inputs(shape, dtype)
    c = shape[-1]

    def run(fn, **kw):
        kn = F.normalize(k, dim=-1)
        o, s = fn(q, kn, v, beta, initial_state=s0, output_final_state=True, **kw)
        return o, s

    ref = run(naive_recurrent_delta_rule)
    got = run(chunk_delta_rule, chunk_size=c)
    inputs = [q, k, v, beta, s0]
    for name, a, b in zip(("o", "final_state"), got, ref, strict=True):
        _assert_close(a, b, TOL[dtype], name)
    for name, a, b in zip(
        ("dq", "dk", "dv", "dbeta", "ds0"), _grads(got, inputs), _grads(ref, inputs), strict=True
    ):
        _assert_close(a, b, TOL[dtype], name)


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "nonorm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_attn_chunk_matches_naive(shape, dtype, normalize):
    q, k, v, _, s0, z0 = _inputs(shape, dtype)
    c = shape[-1]

    def run(fn, **kw):
        o, (s, z) = fn(
            elu_feature_map(q),
            elu_feature_map(k),
            v,
            normalize=normalize,
            initial_state=s0,
            initial_normalizer=z0,
            output_final_state=True,
            **kw,
        )
        return o, s, z

    ref = run(naive_recurrent_linear_attn)
    got = run(chunk_linear_attn, chunk_size=c)
    inputs = [q, k, v, s0, z0]
    for name, a, b in zip(("o", "S", "z"), got, ref, strict=True):
        _assert_close(a, b, TOL[dtype], name)
    for name, a, b in zip(
        ("dq", "dk", "dv", "dS0", "dz0"), _grads(got, inputs), _grads(ref, inputs), strict=True
    ):
        _assert_close(a, b, TOL[dtype], name)


def test_delta_rule_recalls_overwritten_value():
    """beta = 1 with a unit key stores v exactly: reading with that key returns it."""
    k = F.normalize(torch.randn(1, 1, 3, 4, dtype=torch.float64), dim=-1)
    k[:, :, 2] = k[:, :, 0]
    v = torch.randn(1, 1, 3, 5, dtype=torch.float64)
    beta = torch.ones(1, 1, 3, dtype=torch.float64)
    o, _ = chunk_delta_rule(k, k, v, beta, scale=1.0, chunk_size=2)
    torch.testing.assert_close(o[0, 0, 2], v[0, 0, 2], rtol=0, atol=1e-12)


def test_bad_layout_and_shapes_raise():
    x = torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match=r"q must have layout \[B, H, T, D\]"):
        chunk_delta_rule(x, x, x, torch.zeros(2, 8))
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="beta must have shape"):
        chunk_delta_rule(q, q, q, torch.zeros(1, 8, 2))
    with pytest.raises(ValueError, match="v must be"):
        chunk_linear_attn(q, q, torch.zeros(1, 2, 7, 4))
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        chunk_linear_attn(q, torch.zeros(1, 2, 8, 3), q)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        chunk_linear_attn(q, q, q, chunk_size=0)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        naive_recurrent_delta_rule(
            q, q, q, torch.zeros(1, 2, 8), initial_state=torch.zeros(1, 2, 4, 3)
        )
