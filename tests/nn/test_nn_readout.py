"""Readout: the fused SDPA path against the plain softmax reference (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from svattn.nn import sv_readout, sv_readout_reference

TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _inputs(dtype, kernel, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, H, Tq, Tk, D, Dv = 2, 3, 7, 11, 5, 4
    scale = 1.0 if kernel == "rbf" else 0.6
    q = scale * torch.randn(B, H, Tq, D, generator=g, dtype=dtype)
    k = scale * torch.randn(B, H, Tk, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, Tk, Dv, generator=g, dtype=dtype)
    alpha = torch.rand(B, H, Tk, generator=g, dtype=dtype)
    alpha = torch.where(torch.rand(B, H, Tk, generator=g) < 0.4, 0.0, alpha)  # reserve tokens
    alpha[..., 0] = 0.3  # every memory keeps a token
    alpha = alpha / alpha.sum(-1, keepdim=True)
    return [t.requires_grad_(True) for t in (q, k, v, alpha)]


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_fused_matches_reference(kernel, dtype):
    inputs = _inputs(dtype, kernel)
    ref = sv_readout_reference(*inputs, kernel=kernel)
    out = sv_readout(*inputs, kernel=kernel)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), inputs)
    g_out = torch.autograd.grad((out * w).sum(), inputs)
    for name, a, b in zip("q k v alpha".split(), g_out, g_ref, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"grad {name}")


def test_reserve_tokens_get_no_weight_and_no_alpha_gradient():
    q, k, v, alpha = _inputs(torch.float64, "rbf")
    out = sv_readout(q, k, v, alpha)
    (ga,) = torch.autograd.grad(out.sum(), alpha)
    assert (ga[alpha.detach() == 0] == 0).all()
    # the explicit ratio sum_i a_i k(q,x_i) v_i / sum_i a_i k(q,x_i)
    kq = torch.exp(-((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1) / q.shape[-1])
    w = alpha.unsqueeze(-2) * kq
    torch.testing.assert_close(out, (w @ v) / w.sum(-1, keepdim=True), rtol=1e-12, atol=1e-12)


def test_large_logits_stay_finite():
    q, k, v, alpha = (t.detach() for t in _inputs(torch.float32, "exp"))
    out = sv_readout(40 * q, 40 * k, v, alpha, kernel="exp")
    ref = sv_readout_reference(40 * q, 40 * k, v, alpha, kernel="exp")
    assert torch.isfinite(out).all() and torch.isfinite(ref).all()


@pytest.mark.parametrize("sparse", [False, True], ids=["all-keys", "support-only"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_explicit_cpu_readout_and_sdpa_path_match_reference(kernel, dtype, sparse):
    """Training on CPU runs nn.readout_cpu's explicit Function; the SDPA form runs
    elsewhere (and without grad). Both against the reference, values and gradients;
    ``sparse``: supports small enough that the Function reads the support only."""
    from svattn.nn.readout import _explicit, readout_fused
    from svattn.nn.readout_cpu import COMPACT, _support_rows, explicit_readout

    inputs = _inputs(dtype, kernel, seed=3)
    if sparse:  # at most 4 of the 11 keys of a memory carry weight, in scattered places
        a = inputs[3].detach().clone()
        keep = torch.rand(a.shape, generator=torch.Generator().manual_seed(5)) < 0.25
        keep[..., 7] = True
        a = torch.where(keep, a + 0.1, 0.0)
        a[0, 1] = 0.0
        a[0, 1, 10] = 1.0  # a memory of one token, the last key
        inputs[3] = (a / a.sum(-1, keepdim=True)).requires_grad_(True)
    compact = _support_rows(inputs[3].detach().reshape(-1, inputs[3].shape[-1])) is not None
    assert compact == sparse
    assert sparse == (int((inputs[3] > 0).sum(-1).max()) <= COMPACT * inputs[3].shape[-1])
    gamma = 1.0 / inputs[0].shape[-1] if kernel == "rbf" else inputs[0].shape[-1] ** -0.5
    assert _explicit(*inputs)
    ref = sv_readout_reference(*inputs, kernel=kernel)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), inputs)
    out = explicit_readout(*inputs, kernel, gamma)
    g_out = torch.autograd.grad((out * w).sum(), inputs)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    for name, a, b in zip("q k v alpha".split(), g_out, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"grad {name}")
    with torch.no_grad():  # no gradient wanted: the SDPA form
        assert not _explicit(*inputs)
        torch.testing.assert_close(readout_fused(*inputs, kernel, gamma), ref.detach(),
                                   rtol=tol, atol=tol)
