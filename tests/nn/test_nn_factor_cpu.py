"""The bordered systems' LU factors from per-problem Cholesky blocks (svattn.nn.factor_cpu)."""

from __future__ import annotations

import pytest
import torch

from svattn.nn.batched import kernel_problem
from svattn.nn.common import no_host_reads
from svattn.nn.factor_cpu import factor_bordered
from svattn.nn.margin import solve_system
from svattn.nn.system_cpu import build_compact_system


def _systems(dtype, ridge=1e-3, P=6, n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(P, n, 4, generator=g, dtype=dtype)
    K, d, _ = kernel_problem(X, torch.ones(P, n, dtype=torch.bool), "rbf", 0.25)
    u = torch.rand(P, n, generator=g)
    S = u < torch.linspace(0.1, 0.9, P).unsqueeze(-1)  # |S| from a few keys to most
    S[0] = False  # empty: the border pins mu = 0
    S[1] = True  # every key
    E = ~S & (u > 0.95)
    s = int(S.sum(-1).max())
    return (*build_compact_system(K, d, S, E, 0.05, ridge, s, ordered=True), S)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_the_solves_match_a_dense_solve_of_each_system(dtype):
    M, rhs, _, sval, S = _systems(dtype)
    M0 = M.clone()
    chol = factor_bordered(M, S.sum(-1))
    assert chol is not None
    ref = torch.linalg.solve(M0.double(), rhs.unsqueeze(-1).double())
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(chol.solve(rhs.unsqueeze(-1)).double(), ref, rtol=0, atol=tol)
    # any right-hand side, identity rows and the pinned border of an empty S included
    b = torch.randn(rhs.shape, dtype=dtype, generator=torch.Generator().manual_seed(3))
    ref = torch.linalg.solve(M0.double(), b.unsqueeze(-1).double())
    x = chol.solve(b.unsqueeze(-1))
    if dtype == torch.float64:
        torch.testing.assert_close(x, ref, rtol=0, atol=1e-10)
    else:  # as accurate as the pivoted LU in the same precision
        lu_err = (torch.linalg.solve(M0, b.unsqueeze(-1)).double() - ref).abs().max()
        assert (x.double() - ref).abs().max() <= 4 * lu_err
    assert torch.equal(x[0, :, 0], b[0])  # S empty: M is the identity
    off = ~sval[2]
    assert torch.equal(x[2, :-1, 0][off], b[2, :-1][off])  # identity rows off S


def test_a_block_that_is_not_positive_definite_is_refused():
    M, _, _, _, S = _systems(torch.float64, ridge=-3.0)  # 2K − 3I: indefinite
    assert factor_bordered(M, S.sum(-1)) is None


def test_bad_buffers_are_refused_by_name():
    M, rhs, _, _, S = _systems(torch.float64)
    with pytest.raises(ValueError, match="contiguous float32/float64 CPU"):
        factor_bordered(M.mT, S.sum(-1))
    with pytest.raises(ValueError, match="contiguous float32/float64 CPU"):
        factor_bordered(M.to(torch.float16), S.sum(-1))
    chol = factor_bordered(M, S.sum(-1))
    b = rhs.unsqueeze(-1)
    with pytest.raises(ValueError, match=r"b must be \(6, \d+, 1\) torch.float64"):
        chol.solve(b.float())  # no silent rounding
    with pytest.raises(ValueError, match="b must be"):
        chol.solve(torch.cat([b, b], -1))  # one right-hand side


def test_the_margin_solve_falls_back_to_pivoted_lu_where_the_block_is_indefinite():
    """A matrix no kernel gives (ones − I: 2K_SS + ridge·I indefinite, a small diagonal)
    takes the pivoted LU path (its row exchanges show), and the solve still matches the
    torch form's."""
    P, n = 3, 12
    K = (torch.ones(n, n, dtype=torch.float64) - torch.eye(n)).expand(P, n, n).contiguous()
    d = K.diagonal(dim1=-2, dim2=-1).clone()
    S = torch.zeros(P, n, dtype=torch.bool)
    S[:, :7] = True
    E = torch.zeros_like(S)
    E[:, 9] = True
    alpha, mu, f = solve_system(K, d, S, E, 0.05, 1e-3, 0, True)
    assert f.chol is None and f.LU is not None
    assert not torch.equal(f.piv, torch.arange(1, f.piv.shape[-1] + 1,
                                               dtype=torch.int32).expand_as(f.piv))
    with no_host_reads():
        alpha_t, mu_t, _ = solve_system(K, d, S, E, 0.05, 1e-3, 0, True)
    torch.testing.assert_close(alpha, alpha_t, rtol=0, atol=1e-10)
    torch.testing.assert_close(mu, mu_t, rtol=0, atol=1e-10)
