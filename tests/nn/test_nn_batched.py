"""Batched training path against the exact path (partition, alpha, readout)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from nn_keys import clustered_keys, random_keys

from svattn.nn import sv_attention, sv_attention_state
from svattn.nn.common import no_host_reads

B, H, T, D = 2, 2, 96, 8


def _keys(kind, kernel):
    if kind == "random":
        return random_keys(B, H, T, D, seed=11, scale=1.0 if kernel == "rbf" else 0.8)
    spread, noise = (3.0, 0.5) if kernel == "rbf" else (1.0, 0.3)
    return clustered_keys(B, H, T, D, spread=spread, noise=noise, seed=12)


@pytest.mark.parametrize("kind", ["random", "clustered"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_partition_and_readout_match_exact(kind, kernel):
    k = _keys(kind, kernel)
    q = _keys(kind, kernel).roll(1, dims=2) + 0.1
    v = random_keys(B, H, T, 4, seed=13)
    C = 0.05
    o_ex, a_ex, p_ex, _ = sv_attention_state(q, k, v, C=C, kernel=kernel, mode="exact")
    o_b, a_b, p_b, info = sv_attention_state(q, k, v, C=C, kernel=kernel, ridge=1e-3)
    same = (p_b.margin == p_ex.margin) & (p_b.error == p_ex.error)
    assert same.double().mean() >= 0.99
    assert (o_b - o_ex).abs().max() <= 1e-3
    torch.testing.assert_close(a_b.sum(-1), torch.ones(B, H, dtype=a_b.dtype))
    assert info.box_violations == 0


def test_float32_agrees_with_exact():
    k = random_keys(B, H, T, D, seed=21)
    q, v = random_keys(B, H, 10, D, seed=22), random_keys(B, H, T, 4, seed=23)
    o_ex, _, p_ex, _ = sv_attention_state(q, k, v, C=0.05, mode="exact")
    o32, _, p32, _ = sv_attention_state(q.float(), k.float(), v.float(), C=0.05)
    same = (p32.margin == p_ex.margin) & (p32.error == p_ex.error)
    assert same.double().mean() >= 0.99
    assert (o32.double() - o_ex).abs().max() <= 1e-3


def test_key_mask_equals_dropping_the_keys():
    k = random_keys(1, 2, 40, D, seed=31)
    q, v = random_keys(1, 2, 6, D, seed=32), random_keys(1, 2, 40, 3, seed=33)
    mask = torch.ones(1, 2, 40, dtype=torch.bool)
    mask[..., 25:] = False
    k = k.requires_grad_(True)
    out, alpha = sv_attention(q, k, v, C=0.1, key_mask=mask, return_alpha=True)
    ref, alpha_ref = sv_attention(q, k[..., :25, :], v[..., :25, :], C=0.1, return_alpha=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(alpha[..., :25], alpha_ref, rtol=0, atol=1e-12)
    assert (alpha[..., 25:] == 0).all()
    (gk,) = torch.autograd.grad(out.sum(), k)
    assert (gk[..., 25:, :] == 0).all() and gk[..., :25, :].abs().max() > 0


def test_variable_sizes_batch_together():
    """Problems of different sizes (growing prefixes) in one padded call."""
    k = random_keys(1, 1, 48, D, seed=41).expand(1, 4, 48, D)
    q, v = random_keys(1, 4, 3, D, seed=42), random_keys(1, 4, 48, 2, seed=43)
    lengths = torch.tensor([20, 30, 40, 48])
    mask = (torch.arange(48) < lengths[:, None]).unsqueeze(0)  # (1, 4, 48)
    out = sv_attention(q, k, v, C=0.1, key_mask=mask)
    for h, n in enumerate(lengths.tolist()):
        ref = sv_attention(q[:, h : h + 1], k[:, h : h + 1, :n], v[:, h : h + 1, :n], C=0.1)
        torch.testing.assert_close(out[:, h : h + 1], ref, rtol=0, atol=1e-12)


# ---- the solver's fast kernels against plain references


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_kernel_matrix_matches_log_kernel(kernel, dtype):
    from svattn.nn.batched import scaled_kernel_matrix
    from svattn.nn.common import log_kernel

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 40, 6, generator=g, dtype=dtype)
    valid = torch.rand(3, 40, generator=g) < 0.7
    gamma = 0.3
    shift = torch.tensor([0.0, 1.5, -2.0], dtype=dtype)
    K = scaled_kernel_matrix(x, valid, shift, kernel, gamma)
    ref = (log_kernel(x, x, kernel, gamma) - shift[:, None, None]).exp()
    ref = torch.where(valid.unsqueeze(-1) & valid.unsqueeze(-2), ref, 0.0)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(K, ref, rtol=tol, atol=tol * float(ref.abs().max()))
    # absent keys: rows and columns exactly zero
    assert bool((K[~valid] == 0).all()) and bool((K.transpose(1, 2)[~valid] == 0).all())
    # no subnormal entries (CPU exp is 10-100x slower where it underflows): far pairs sit
    # at exp(exp_floor) instead
    far = scaled_kernel_matrix(x * 1e3, valid, shift, kernel, gamma)
    tiny = torch.finfo(dtype).tiny
    assert bool(((far == 0) | (far >= tiny)).all())
    assert bool((far[valid.unsqueeze(-1) & valid.unsqueeze(-2)] > 0).all())
    # every key present: CPU eager skips the masking, the values are the same bit for bit
    from svattn.nn.common import no_host_reads

    full = torch.ones_like(valid)
    with no_host_reads():
        masked = scaled_kernel_matrix(x, full, shift, kernel, gamma)
    assert torch.equal(scaled_kernel_matrix(x, full, shift, kernel, gamma), masked)


def test_matvec_and_rows_match_dense():
    from svattn.nn.batched import matvec, rows

    g = torch.Generator().manual_seed(4)
    A = torch.randn(5, 30, 30, generator=g, dtype=torch.float64)
    K = A @ A.transpose(1, 2)  # symmetric, as every kernel matrix
    y = torch.randn(5, 30, generator=g, dtype=torch.float64)
    torch.testing.assert_close(matvec(K, y), (K @ y.unsqueeze(-1)).squeeze(-1))
    idx = torch.stack([torch.randperm(30, generator=g)[:7] for _ in range(5)])
    ref = torch.stack([K[p, idx[p]] for p in range(5)])
    assert torch.equal(rows(K, idx), ref)


@pytest.mark.parametrize("schedule", ["cpu", "static"])
def test_repair_keeps_the_mass_when_the_margin_set_empties(schedule):
    """Four keys, C = 0.3: the optimum is three keys at C and one at 0.1. FISTA's
    iterate puts two in S; one repair round moves one S key above C (to E) and the
    other below 0 (to R), leaving S empty and C·|E| = 0.9. That partition used to be
    taken as settled (alpha summing to 0.9, no violation counted) on both schedules."""
    g = torch.Generator().manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(3, 2, 6, 3, generator=gen, dtype=torch.float64)[2:3, 1:2, [0, 1, 2, 5]]
    q = torch.randn(1, 1, 1, 3, generator=g, dtype=torch.float64)
    v = torch.randn(1, 1, 4, 2, generator=g, dtype=torch.float64)
    _, a_ex, _, _ = sv_attention_state(q, k, v, C=0.3, mode="exact")
    with no_host_reads() if schedule == "static" else contextlib.nullcontext():
        _, a_b, part, info = sv_attention_state(q, k, v, C=0.3, ridge=0.0)
    torch.testing.assert_close(a_b.sum(-1), torch.ones(1, 1, dtype=a_b.dtype))
    torch.testing.assert_close(a_b, a_ex, rtol=0, atol=1e-9)
    assert part.margin.sum() == 1 and part.error.sum() == 3
