"""The compiled compact margin system (svattn.nn.system_cpu) against the torch form."""

from __future__ import annotations

import pytest
import torch

from svattn.nn.batched import kernel_problem
from svattn.nn.common import gather_rows, no_host_reads
from svattn.nn.margin import margin_solve, margin_solve_reference, rows, solve_system
from svattn.nn.system_cpu import build_compact_system


def _problem(dtype, P=7, n=40, D=5, seed=0, kernel="rbf"):
    g = torch.Generator().manual_seed(seed)
    kf = torch.randn(P, n, D, generator=g, dtype=dtype)
    valid = torch.rand(P, n, generator=g) < 0.8
    valid[:, :12] = True
    K, d, shift = kernel_problem(kf, valid, kernel, 1.0 / D)
    u = torch.rand(P, n, generator=g)
    S = valid & (u < 0.5)
    E = valid & (u > 0.85)
    S[0] = False  # an empty margin set: the border pins mu = 0
    S[1] = valid[1]  # every present key in S
    E[1] = False
    return kf, valid, K, d, shift, S, E


def _torch_system(K, d, S, E, C, ridge):
    """The bordered system written with plain tensor ops on the slots of gather_rows."""
    idx, sval = gather_rows(S)
    s = idx.shape[-1]
    A = rows(K, idx).gather(-1, idx.unsqueeze(1).expand(-1, s, -1))
    sf = sval.to(K.dtype)
    eye = torch.eye(s, dtype=K.dtype)
    top = torch.where(sval.unsqueeze(-1) & sval.unsqueeze(-2), 2.0 * A + ridge * eye, eye)
    empty = ~sval.any(-1)
    M = torch.cat([torch.cat([top, sf.unsqueeze(-1)], -1),
                   torch.cat([sf, empty.to(K.dtype).unsqueeze(-1)], -1).unsqueeze(1)], 1)
    kse = (rows(K, idx) * E.to(K.dtype).unsqueeze(1)).sum(-1)
    rhs = torch.cat([torch.where(sval, d.gather(-1, idx) - 2.0 * C * kse, 0.0),
                     torch.where(empty, 0.0, 1.0 - C * E.sum(-1).to(K.dtype)).unsqueeze(-1)],
                    -1)
    return M, rhs, idx, sval


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_builder_matches_torch_form(dtype):
    _, _, K, d, _, S, E = _problem(dtype)
    s = int(S.sum(-1).max())
    M, rhs, idx, sval = build_compact_system(K, d, S, E, 0.15, 1e-3, s)
    M_ref, rhs_ref, idx_ref, sval_ref = _torch_system(K, d, S, E, 0.15, 1e-3)
    assert torch.equal(idx, idx_ref) and torch.equal(sval, sval_ref)
    # symmetric to K's rounding and no further: LAPACK may factor the transpose, so the
    # builder must add no asymmetry of its own. On S's slots M - M^T is exactly
    # 2 (K_SS - K_SS^T) (doubling is exact, the ridge sits on the diagonal); elsewhere 0.
    K_ss = rows(K, idx).gather(-1, idx.unsqueeze(1).expand(-1, s, -1))
    both = sval.unsqueeze(-1) & sval.unsqueeze(-2)
    asym = torch.where(both, 2.0 * (K_ss - K_ss.mT), 0.0)
    assert torch.equal((M - M.mT)[:, :s, :s], asym)
    assert torch.equal(M[:, s, :], M[:, :, s])
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(M, M_ref, rtol=0, atol=tol)
    torch.testing.assert_close(rhs, rhs_ref, rtol=0, atol=tol)
    # s = n: every key its own slot, in key order
    n = S.shape[-1]
    M, rhs, idx, sval = build_compact_system(K, d, S, E, 0.15, 1e-3, n)
    assert torch.equal(idx, torch.arange(n).expand_as(idx)) and torch.equal(sval, S)
    # ordered: S's slots first at s = n too, as gather_rows orders them
    M, rhs, idx, sval = build_compact_system(K, d, S, E, 0.15, 1e-3, n, ordered=True)
    order = torch.sort((~S).to(torch.int8), dim=-1, stable=True).indices
    assert torch.equal(idx, order) and torch.equal(sval, S.gather(-1, order))
    with pytest.raises(ValueError, match="s must be"):
        build_compact_system(K, d, S, E, 0.15, 1e-3, n + 1)


@pytest.mark.parametrize("steps", [0, 2])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_compiled_system_values_and_gradients(kernel, steps):
    """The margin solve on the compiled system (CPU eager) against the torch form and the
    autograd reference, values and gradients."""
    kf, valid, K, d, shift, S, E = _problem(torch.float64, seed=1 + steps, kernel=kernel)
    assert solve_system(K, d, S, E, 0.15, 1e-3, steps, True)[2].chol is not None  # potrf path
    kf = kf.requires_grad_()
    w = torch.randn(S.shape, dtype=torch.float64)
    out = {}
    for name in ("compiled", "torch", "reference"):
        if name == "reference":
            a, mu = margin_solve_reference(kf, valid, shift, S, E, 0.15, kernel, 1 / 5, 1e-3,
                                           steps)
        elif name == "torch":
            with no_host_reads():
                a, mu = margin_solve(kf, K, d, S, E, 0.15, kernel, 1 / 5, 1e-3, steps, True)
        else:
            a, mu = margin_solve(kf, K, d, S, E, 0.15, kernel, 1 / 5, 1e-3, steps, True)
        g, = torch.autograd.grad((a * w).sum() + mu.sum(), kf)
        out[name] = (a.detach(), mu.detach(), g)
    for name in ("torch", "reference"):
        for x, y in zip(out["compiled"], out[name], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-9)


@pytest.mark.parametrize("ridge", [1e-3, 0.0], ids=["cholesky", "pivoted-lu"])
def test_solve_system_when_one_problem_holds_every_key(ridge):
    """Every key a slot: with a ridge the slots are still ordered (S first, each block
    factored at its own size, nn/factor_cpu.py); without one, the dense form."""
    kf, valid, K, d, _, S, E = _problem(torch.float64)
    if not ridge:  # every key present: K_SS positive definite without a ridge
        K, d, _ = kernel_problem(kf, torch.ones_like(valid), "rbf", 1.0 / 5)
    S = S.clone()
    S[2] = True
    E = E & ~S
    alpha, mu, f = solve_system(K, d, S, E, 0.15, ridge, 0, True)
    if ridge:
        assert f.idx is not None and torch.equal(f.sval, S.gather(-1, f.idx))
        assert torch.equal(f.sval, f.sval.sort(-1, descending=True).values)  # S first
    else:
        assert f.idx is None and torch.equal(f.sval, S)
    with no_host_reads():
        alpha_t, mu_t, _ = solve_system(K, d, S, E, 0.15, ridge, 0, True)
    torch.testing.assert_close(alpha, alpha_t, rtol=0, atol=1e-10)
    torch.testing.assert_close(mu, mu_t, rtol=0, atol=1e-10)


@pytest.mark.parametrize("steps", [0, 1])
def test_backward_weights_when_one_problem_keeps_every_key(steps):
    """kernel_weights without a gather (slot = key) where some problem keeps every key."""
    from svattn.nn.system_cpu import kernel_weights

    kf, valid, K, d, shift, S, E = _problem(torch.float64, seed=7)
    valid = torch.ones_like(valid)
    K, d, shift = kernel_problem(kf, valid, "rbf", 1.0 / 5)
    S = S.clone()
    S[3] = True
    E = E & ~S
    lam = torch.randn(*S.shape, steps + 1, dtype=torch.float64) * S.unsqueeze(-1)
    W, X1, idx = kernel_weights(K, kf, lam, lam.abs())
    assert idx is None and W.shape[-1] == S.shape[-1]
    ref = -2.0 * K * sum(lam[..., k].unsqueeze(-1) * lam[..., k].abs().unsqueeze(-2)
                         + lam[..., k].abs().unsqueeze(-1) * lam[..., k].unsqueeze(-2)
                         for k in range(steps + 1))
    torch.testing.assert_close(W, ref, rtol=0, atol=1e-12)
    kf = kf.requires_grad_()
    w = torch.randn(S.shape, dtype=torch.float64)
    out = {}
    for name in ("compiled", "torch"):
        if name == "torch":
            with no_host_reads():
                a, mu = margin_solve(kf, K, d, S, E, 0.15, "rbf", 1 / 5, 1e-3, steps, True)
        else:
            a, mu = margin_solve(kf, K, d, S, E, 0.15, "rbf", 1 / 5, 1e-3, steps, True)
        (g,) = torch.autograd.grad((a * w).sum() + mu.sum(), kf)
        out[name] = (a.detach(), g)
    for x, y in zip(out["compiled"], out["torch"], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-9)
