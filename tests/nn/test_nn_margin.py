"""The margin solve's closed-form backward against autograd through plain ops and finite
differences (svattn.nn.margin)."""

from __future__ import annotations

import pytest
import torch

from svattn.nn.batched import kernel_problem, solve_partition
from svattn.nn.margin import margin_solve, margin_solve_reference
from svattn.nn.options import SolverOptions


def _problem(kernel, dtype, seed, P=4, n=20, D=3):
    g = torch.Generator().manual_seed(seed)
    kf = (0.7 * torch.randn(P, n, D, generator=g, dtype=dtype)).requires_grad_()
    valid = torch.rand(P, n, generator=g) < 0.8
    valid[:, :8] = True  # n·C >= 1 for C = 0.15
    K, d, shift = kernel_problem(kf.detach(), valid, kernel, 0.5)
    sol = solve_partition(K, d, 0.15, valid, SolverOptions(refine=10, finish="approximate"))
    return kf, valid, K, d, shift, sol.margin, sol.error


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("steps", [0, 1, 2], ids=lambda s: f"ridge_steps{s}")
@pytest.mark.parametrize("compact", [False, True], ids=["dense", "compact"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_values_and_gradients_match_autograd_reference(kernel, steps, compact, dtype):
    kf, valid, K, d, shift, S, E = _problem(kernel, dtype, seed=steps + 3 * compact)
    assert bool(S.any()) and bool(E.any())  # both blocks of the backward are exercised
    a, mu = margin_solve(kf, K, d, S, E, 0.15, kernel, 0.5, 1e-3, steps, compact)
    a_ref, mu_ref = margin_solve_reference(kf, valid, shift, S, E, 0.15, kernel, 0.5, 1e-3,
                                           steps)
    g = torch.Generator().manual_seed(9)
    wa = torch.randn(a.shape, generator=g, dtype=dtype)
    wm = torch.randn(mu.shape, generator=g, dtype=dtype)
    (grad,) = torch.autograd.grad((a * wa).sum() + (mu * wm).sum(), kf)
    (grad_ref,) = torch.autograd.grad((a_ref * wa).sum() + (mu_ref * wm).sum(), kf)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(a, a_ref, rtol=0, atol=tol)
    torch.testing.assert_close(mu, mu_ref, rtol=0, atol=tol)
    scale = float(grad_ref.abs().max())
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=tol * max(scale, 1.0) * 10)
    # absent keys and reserve keys get no gradient
    assert bool((grad[~(S | E)] == 0).all())


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("compact", [False, True], ids=["dense", "compact"])
def test_gradcheck_float64(kernel, compact):
    kf, valid, _, _, shift, S, E = _problem(kernel, torch.float64, seed=11, P=2, n=12)

    def f(x):
        with torch.no_grad():  # K and d follow x, as the solver recomputes them
            from svattn.nn.batched import scaled_kernel_matrix
            from svattn.nn.common import log_kernel_diag

            K = scaled_kernel_matrix(x, valid, shift, kernel, 0.5)
            d = torch.where(valid, (log_kernel_diag(x, kernel, 0.5) - shift[:, None]).exp(), 0.0)
        return margin_solve(x, K, d, S, E, 0.15, kernel, 0.5, 1e-3, 1, compact)

    assert torch.autograd.gradcheck(f, (kf,), eps=1e-6, atol=1e-6)


def test_empty_margin_set_pins_mu_and_has_zero_gradient():
    kf, valid, K, d, shift, S, E = _problem("rbf", torch.float64, seed=5)
    S = torch.zeros_like(S)
    E = torch.zeros_like(E)
    E[:, :7] = True  # C·|E| = 1.05: alpha is C on E whatever K is
    a, mu = margin_solve(kf, K, d, S, E, 0.15, "rbf", 0.5, 1e-3, 1, True)
    assert bool((mu == 0).all())
    (grad,) = torch.autograd.grad(a.sum() + mu.sum(), kf)
    assert bool((grad == 0).all())
