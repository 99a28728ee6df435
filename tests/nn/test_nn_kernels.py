"""The kernel objects' array-generic formulas on torch tensors (``svattn.exact.core.kernels``):
numpy and torch agree, the derivative is autograd's and a finite difference's, and a
third kernel defined only in the tests (``tests/kernel_helpers.py``) runs the torch
layers' formula paths (batched kernel matrix, margin solve and both closed-form
backwards, both readouts) against the references and the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_helpers import TOY, registered
from svattn.exact.core.kernels import (
    Kernel,
    biased_softmax_readout,
    get_kernel,
    gram_matrix,
    log_kernel,
)
from svattn.exact.oracle import partition, solve_svdd
from svattn.nn import sv_attention_state
from svattn.nn.batched import kernel_problem, scaled_kernel_matrix, solve_partition
from svattn.nn.common import log_kernel as torch_log_kernel
from svattn.nn.common import log_kernel_diag, no_host_reads
from svattn.nn.margin import margin_solve, margin_solve_reference
from svattn.nn.options import SolverOptions
from svattn.nn.readout import sv_readout, sv_readout_reference

NAMES = ["rbf", "exp", TOY.name]


@pytest.fixture(autouse=True)
def _toy_registered():
    with registered(TOY):
        yield


def _pair(seed, B=3, M=6, N=9, D=4):
    rng = np.random.default_rng(seed)
    return 0.8 * rng.normal(size=(B, M, D)), 0.8 * rng.normal(size=(B, N, D))


def _close(a, b, rel=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * max(float(np.abs(b).max()), 1.0))


@pytest.mark.parametrize("name", NAMES)
def test_numpy_and_torch_formulas_agree(name):
    kern, g = get_kernel(name), 0.37
    x, y = _pair(0)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    xy, xx, yy = x @ y.swapaxes(-1, -2), (x * x).sum(-1)[..., None], (y * y).sum(-1)[..., None, :]
    txy, txx, tyy = tx @ ty.mT, (tx * tx).sum(-1, keepdim=True), (ty * ty).sum(-1).unsqueeze(-2)
    _close(kern.log_from_dots(txy, txx, tyy, g), kern.log_from_dots(xy, xx, yy, g))
    _close(kern.log_diag(txx[..., 0], g), kern.log_diag(xx[..., 0], g))
    _close(kern.dlog_dx(tx, ty, g), kern.dlog_dx(x, y, g))
    _close(kern.dlog_dy(tx, ty, g), kern.dlog_dy(x, y, g))
    # and the core's float64 formula (rbf: distances from differences), per batch
    core = np.stack([log_kernel(x[b], y[b], name, g) for b in range(len(x))])
    _close(torch_log_kernel(tx, ty, name, g), core)
    diag = np.stack([np.diag(log_kernel(x[b], x[b], name, g)) for b in range(len(x))])
    _close(log_kernel_diag(tx, name, g), diag)


@pytest.mark.parametrize("name", NAMES)
def test_derivative_matches_autograd_and_finite_differences(name):
    kern, g = get_kernel(name), 0.37
    x, y = (torch.from_numpy(a[0]) for a in _pair(1))  # (M, D), (N, D)
    M, N, D = x.shape[0], y.shape[0], x.shape[1]

    def logk(a, b):
        return torch_log_kernel(a, b, name, g)  # (M, N)

    jx = torch.autograd.functional.jacobian(lambda a: logk(a, y), x)  # (M, N, M, D)
    jy = torch.autograd.functional.jacobian(lambda b: logk(x, b), y)  # (M, N, N, D)
    auto_dx = jx[torch.arange(M), :, torch.arange(M)]  # (M, N, D): ∂/∂x_i of k(x_i, y_j)
    auto_dy = jy[:, torch.arange(N), torch.arange(N)]  # (M, N, D): ∂/∂y_j
    _close(kern.dlog_dx(x, y, g), auto_dx)
    _close(kern.dlog_dy(x, y, g), auto_dy)
    h = 1e-6
    fd_dx, fd_dy = torch.empty(M, N, D, dtype=x.dtype), torch.empty(M, N, D, dtype=x.dtype)
    for k in range(D):
        e = torch.zeros(D, dtype=x.dtype)
        e[k] = h
        fd_dx[..., k] = (logk(x + e, y) - logk(x - e, y)) / (2 * h)
        fd_dy[..., k] = (logk(x, y + e) - logk(x, y - e)) / (2 * h)
    _close(kern.dlog_dx(x, y, g), fd_dx, rel=1e-7)
    _close(kern.dlog_dy(x, y, g), fd_dy, rel=1e-7)


def _problem(name, seed, P=3, n=20, D=3):
    gen = torch.Generator().manual_seed(seed)
    kf = (0.7 * torch.randn(P, n, D, generator=gen, dtype=torch.float64)).requires_grad_()
    valid = torch.rand(P, n, generator=gen) < 0.8
    valid[:, :8] = True  # n·C >= 1 for C = 0.15
    K, d, shift = kernel_problem(kf.detach(), valid, name, 0.5)
    sol = solve_partition(K, d, 0.15, valid, SolverOptions(refine=10, finish="approximate"))
    return kf, valid, K, d, shift, sol.margin, sol.error


@pytest.mark.parametrize("host", [True, False], ids=["cpu-eager", "no-host-reads"])
@pytest.mark.parametrize("name", NAMES)
def test_margin_solve_values_and_gradients_match_the_reference(name, host):
    """The closed-form backward (both forms: the weights of the kept block on CPU,
    one batched matmul otherwise) against autograd through plain ops."""
    kf, valid, K, d, shift, S, E = _problem(name, seed=4)
    assert bool(S.any()) and bool(E.any())
    torch.testing.assert_close(
        K, torch.where(valid.unsqueeze(-1) & valid.unsqueeze(-2),
                       (torch_log_kernel(kf.detach(), kf.detach(), name, 0.5)
                        - shift[:, None, None]).exp(), 0.0), rtol=0, atol=1e-12)
    if host:
        a, mu = margin_solve(kf, K, d, S, E, 0.15, name, 0.5, 1e-3, 1, True)
    else:
        with no_host_reads():
            a, mu = margin_solve(kf, K, d, S, E, 0.15, name, 0.5, 1e-3, 1, False)
    a_ref, mu_ref = margin_solve_reference(kf, valid, shift, S, E, 0.15, name, 0.5, 1e-3, 1)
    gen = torch.Generator().manual_seed(9)
    wa = torch.randn(a.shape, generator=gen, dtype=a.dtype)
    wm = torch.randn(mu.shape, generator=gen, dtype=a.dtype)
    (grad,) = torch.autograd.grad((a * wa).sum() + (mu * wm).sum(), kf)
    (grad_ref,) = torch.autograd.grad((a_ref * wa).sum() + (mu_ref * wm).sum(), kf)
    torch.testing.assert_close(a, a_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(mu, mu_ref, rtol=0, atol=1e-12)
    scale = max(float(grad_ref.abs().max()), 1.0)
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-11 * scale)
    assert float(grad.abs().max()) > 0


@pytest.mark.parametrize("name", NAMES)
def test_readouts_match_the_reference(name):
    """The fused readout (no grad: attention with the dot form's bias) and the explicit
    CPU one (grad: its written-out backward) against the plain softmax, with gradients."""
    gen = torch.Generator().manual_seed(5)
    q, k = (0.7 * torch.randn(2, 2, n, 4, generator=gen, dtype=torch.float64) for n in (5, 12))
    v = torch.randn(2, 2, 12, 3, generator=gen, dtype=torch.float64)
    alpha = torch.rand(2, 2, 12, generator=gen, dtype=torch.float64)
    alpha[..., ::3] = 0.0
    ref = sv_readout_reference(q, k, v, alpha, kernel=name, gamma=0.4)
    with torch.no_grad():
        torch.testing.assert_close(sv_readout(q, k, v, alpha, kernel=name, gamma=0.4), ref,
                                   rtol=0, atol=1e-12)
    ins = [t.clone().requires_grad_() for t in (q, k, v, alpha)]
    ins_ref = [t.clone().requires_grad_() for t in (q, k, v, alpha)]
    out = sv_readout(*ins, kernel=name, gamma=0.4)
    out_ref = sv_readout_reference(*ins_ref, kernel=name, gamma=0.4)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-12)
    w = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * w).sum(), ins)
    grads_ref = torch.autograd.grad((out_ref * w).sum(), ins_ref)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_a_third_kernel_trains_on_the_batched_path_like_the_oracle():
    """sv_attention (batched: FISTA, repair, margin solve) with the third kernel against
    the float64 oracle on its Gram matrix and the core's readout, as
    test_nn_batched.py holds rbf and exp against the exact path; with a gradient."""
    gen = torch.Generator().manual_seed(12)
    B, H, T, D, C, g = 1, 2, 64, 6, 0.05, 0.3
    k = 0.8 * torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    q = 0.8 * torch.randn(B, H, 7, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, T, 3, generator=gen, dtype=torch.float64)
    kg = k.clone().requires_grad_()
    out, alpha, part, info = sv_attention_state(q, kg, v, C=C, kernel=TOY.name, gamma=g,
                                                ridge=1e-3)
    assert info.box_violations == 0
    for h in range(H):
        X = k[0, h].numpy()
        a_ref = solve_svdd(gram_matrix(X, TOY.name, g), C)
        p_ref = partition(a_ref, C)
        margin = np.zeros(T, dtype=bool)
        margin[p_ref["margin"]] = True
        assert (part.margin[0, h].numpy() == margin).mean() >= 0.99
        o_ref = biased_softmax_readout(q[0, h].numpy(), X, v[0, h].numpy(), a_ref, TOY.name, g)
        assert float(np.abs(out[0, h].detach().numpy() - o_ref).max()) <= 1e-3
    (grad,) = torch.autograd.grad(out.square().sum(), kg)
    assert bool(torch.isfinite(grad).all()) and float(grad.abs().max()) > 0
    sk = scaled_kernel_matrix(k[0], torch.ones(H, T, dtype=torch.bool),
                              torch.zeros(H, dtype=torch.float64), TOY.name, g)
    torch.testing.assert_close(sk, torch.from_numpy(np.stack(
        [gram_matrix(k[0, h].numpy(), TOY.name, g) for h in range(H)])), rtol=1e-12, atol=0)


class _L1Kernel(Kernel):
    """``k(x, y) = exp(−gamma‖x − y‖₁)``: a kernel not of the dot form (the core's
    formulas only), which the torch layers' fast paths cannot run."""

    name = "l1-not-dot-form"

    def default_gamma(self, dim: int) -> float:
        return 1.0 / dim

    def log_kernel(self, x, y, gamma):
        return -gamma * np.abs(x[:, None, :] - y[None, :, :]).sum(-1)


def test_the_torch_layers_refuse_a_kernel_not_of_the_dot_form_when_built():
    """Refused with its name where the parameters are checked (the layers' constructors,
    the functions' first lines), not as a NotImplementedError inside a forward; an
    unknown name is refused by the hybrid mixer's constructor too."""
    from svattn.mixers import HybridSVAttention
    from svattn.nn import SVAttention, sv_attention

    q = torch.randn(1, 1, 6, 3, dtype=torch.float64)
    alpha = torch.full((1, 1, 6), 1 / 6, dtype=torch.float64)
    with registered(_L1Kernel()) as l1:
        builds = [lambda: SVAttention(8, 2, C=0.5, kernel=l1.name),
                  lambda: HybridSVAttention(8, 2, chunk=4, C=0.5, kernel=l1.name),
                  lambda: sv_attention(q, q, q, C=0.5, kernel=l1.name),
                  lambda: sv_readout(q, q, q, alpha, kernel=l1.name)]
        for build in builds:
            with pytest.raises(ValueError, match=f"kernel '{l1.name}' is not of the dot form"):
                build()
    with pytest.raises(ValueError, match=r"kernel must be one of \('rbf', 'exp'"):
        HybridSVAttention(8, 2, chunk=4, C=0.5, kernel="foo")
