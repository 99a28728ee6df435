"""Exact path: implicit backward (gradcheck, float64) and agreement with the exact core."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_keys import random_keys

from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.oracle import solve_svdd
from svattn.nn import sv_attention
from svattn.nn.exact_fn import ExactAlpha

CASES = [("rbf", 1.0, 0.15), ("exp", 0.7, 0.15)]


@pytest.mark.parametrize("kernel,scale,C", CASES, ids=[c[0] for c in CASES])
def test_alpha_matches_oracle(kernel, scale, C):
    k = random_keys(2, 2, 20, 3, seed=3, scale=scale)
    valid = torch.ones(2, 2, 20, dtype=torch.bool)
    gamma = 1 / 3 if kernel == "rbf" else 3**-0.5
    alpha = ExactAlpha.apply(k, valid, C, kernel, gamma)
    for b in range(2):
        for h in range(2):
            X = k[b, h].numpy()
            ref = solve_svdd(kernel_matrix(X, X, kernel, gamma), C)
            np.testing.assert_allclose(alpha[b, h].numpy(), ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kernel,scale,C", CASES, ids=[c[0] for c in CASES])
def test_gradcheck_alpha(kernel, scale, C):
    k = random_keys(1, 2, 12, 3, seed=1, scale=scale).requires_grad_(True)
    valid = torch.ones(1, 2, 12, dtype=torch.bool)
    gamma = 1 / 3 if kernel == "rbf" else 3**-0.5
    alpha = ExactAlpha.apply(k, valid, C, kernel, gamma)
    S = (alpha > 0) & (alpha < C)
    assert S.sum() >= 4 and (alpha == C).sum() >= 2  # a non-trivial partition
    assert torch.autograd.gradcheck(
        lambda k: ExactAlpha.apply(k, valid, C, kernel, gamma), (k,), eps=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("kernel,scale,C", CASES, ids=[c[0] for c in CASES])
def test_gradcheck_attention_with_key_mask(kernel, scale, C):
    k = random_keys(1, 2, 14, 3, seed=1, scale=scale)
    q = random_keys(1, 2, 5, 3, seed=2, scale=scale)
    v = random_keys(1, 2, 14, 2, seed=4)
    mask = torch.ones(1, 2, 14, dtype=torch.bool)
    mask[0, 1, 10:] = False
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v))

    def f(q, k, v):
        return sv_attention(q, k, v, C=C, kernel=kernel, mode="exact", key_mask=mask)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)
    gk, gv = torch.autograd.grad(f(*inputs).sum(), inputs[1:])
    assert (gk[0, 1, 10:] == 0).all() and (gv[0, 1, 10:] == 0).all()


@pytest.mark.parametrize("kernel,scale,C", CASES, ids=[c[0] for c in CASES])
def test_exact_backward_matches_batched_autograd_ridge0(kernel, scale, C):
    """The implicit backward equals autograd through the batched path at ridge 0."""
    k = random_keys(2, 2, 24, 4, seed=5, scale=scale).requires_grad_(True)
    q = random_keys(2, 2, 6, 4, seed=6, scale=scale).requires_grad_(True)
    v = random_keys(2, 2, 24, 3, seed=7).requires_grad_(True)
    w = random_keys(2, 2, 6, 3, seed=8)
    o_ex = sv_attention(q, k, v, C=C, kernel=kernel, mode="exact")
    g_ex = torch.autograd.grad((o_ex * w).sum(), (q, k, v))
    o_b = sv_attention(q, k, v, C=C, kernel=kernel, ridge=0.0, max_iter=3000)
    g_b = torch.autograd.grad((o_b * w).sum(), (q, k, v))
    torch.testing.assert_close(o_b, o_ex, rtol=0, atol=1e-11)
    for name, a, b in zip("qkv", g_b, g_ex, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=f"grad {name}")
