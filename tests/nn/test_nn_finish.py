"""The batched solver's optimum finish against the exact oracle (svattn.nn.finish).

Problems: the keys a trained recall model's hybrid layers build their memories from
(``tests/nn/data/trained_keys.*``, written by ``scripts/make_trained_keys_fixture.py``:
clusters of exact and rounding-level duplicates, near-singular kernel matrices) and
synthetic keys with exact and near duplicates. The reference is
:func:`svattn.exact.oracle.solve_svdd` on each problem's float64 kernel matrix, compared
summed over clusters of copies (``benchmarks/trained_keys.py``, shared with
``benchmarks/finish_trained_keys.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from nn_keys import random_keys

from script_helpers import load_script
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.oracle import solve_svdd
from svattn.nn import SolverOptions, batched, sv_attention, sv_attention_state
from svattn.nn.batched import solve_batched
from svattn.nn.common import centre_keys

trained_keys = load_script("benchmarks/trained_keys.py")
L1_BAR = {torch.float64: 1e-6, torch.float32: 1e-4}
DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("boundaries", [3, pytest.param(None, marks=pytest.mark.slow)],
                         ids=["first3", "all"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_trained_boundary_problems_solve_to_the_oracle_optimum(dtype, boundaries):
    """The default suite takes the first 3 boundaries (up to 48 keys; the oracle's polish
    takes seconds on the larger layer-0 problems, all copies); ``-m slow`` all 7."""
    keys, meta = trained_keys.read_fixture()
    C, gamma = meta["C"], meta["gamma"]
    rows = keys[:2].reshape(-1, *keys.shape[-2:])  # 2 sequences × layers × heads
    k, valid = trained_keys.prefix_problems(rows, meta["chunk"], dtype, boundaries)
    alpha, _, info = solve_batched(k, C, kernel=meta["kernel"], gamma=gamma, valid=valid)
    assert alpha.dtype == dtype
    assert int(trained_keys.outside_box(alpha, valid, C).sum()) == 0
    sums = alpha.double().sum(-1)
    assert float((sums - 1).abs().max()) <= (1e-12 if dtype == torch.float64 else 1e-6)
    assert int(info.unsettled) == 0 and int(info.box_violations) == 0
    dist = trained_keys.distance_to_oracle(k, valid, alpha, C, meta["kernel"], gamma)
    assert dist.max() <= L1_BAR[dtype], (dist.max(), int(np.argmax(dist)))


def test_near_copy_boundary_problems_of_a_retrained_model_solve_to_the_oracle_optimum():
    """Three boundary problems of a model retrained with the optimum finish (keys 2.7e-7 to
    1.2e-6 apart, cond(K) ~1e16; ``tests/nn/data/near_copy_problems.json`` says where they
    come from): at a KKT tolerance of 1e-9 the finish stopped 1.6e-6 to 4.5e-6 (L1 over
    clusters of copies) from the oracle's optimum; held to rounding it reaches it."""
    data = np.load(DATA / "near_copy_problems.npz")
    meta = json.loads((DATA / "near_copy_problems.json").read_text())
    k, valid = torch.from_numpy(data["keys"]), torch.from_numpy(data["valid"])
    C, kernel, gamma = meta["C"], meta["kernel"], meta["gamma"]
    alpha, _, info = solve_batched(k, C, kernel=kernel, gamma=gamma, valid=valid)
    assert int(info.unsettled) == 0 and int(trained_keys.outside_box(alpha, valid, C).sum()) == 0
    dist = trained_keys.distance_to_oracle(k, valid, alpha, C, kernel, gamma)
    assert dist.max() <= L1_BAR[torch.float64], dist


@pytest.mark.parametrize(("dtype", "ridge"), [(torch.float64, 1e-16), (torch.float64, 1e-300),
                                           (torch.float32, 1e-9)])
def test_a_ridge_below_the_working_precision_is_refused_by_name(dtype, ridge):
    """The approximate finish on duplicate keys with a positive ridge too small for the
    keys' precision: a ValueError naming the ridge (it was a ZeroDivisionError from the
    compiled repair loop); a ridge the precision carries solves."""
    k = torch.randn(2, 3, 8, 4, dtype=dtype, generator=torch.Generator().manual_seed(0))
    k[..., 4:, :] = k[..., :4, :]
    valid = torch.ones(2, 3, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match=f"ridge={ridge!r} is too small"):
        solve_batched(k, 0.25, kernel="rbf", gamma=0.25, valid=valid,
                      solver=SolverOptions(ridge=ridge, finish="approximate"))
    alpha, _, _ = solve_batched(k, 0.25, kernel="rbf", gamma=0.25, valid=valid,
                                solver=SolverOptions(ridge=1e-3, finish="approximate"))
    assert torch.isfinite(alpha).all()


def test_keys_far_from_the_origin_are_not_merged_by_their_norm():
    """A settled solve of float32 keys far from the origin is the oracle's optimum."""
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(16, 8, dtype=torch.float64, generator=g) * 0.02 + 1e4).float()
    alpha, _, info = solve_batched(X[None, None], 0.125, kernel="rbf", gamma=1e3,
                                   valid=torch.ones(1, 1, 16, dtype=torch.bool))
    Xc = X.double().numpy() - X.double().numpy().mean(0)  # rbf: the same kernel, centred
    ref = solve_svdd(kernel_matrix(Xc, Xc, "rbf", 1e3), 0.125)
    assert int(info.unsettled) == 0  # the keys are centred first (rbf): nothing merged
    assert np.abs(alpha[0, 0].double().numpy() - ref).sum() <= L1_BAR[torch.float32]


def test_the_hybrids_boundary_partition_centres_far_keys_too():
    """boundary_partition (the "support" policy's solve) and _optimum_partition (which
    the compiled path calls with its compiled warm start) on the far keys above."""
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(16, 8, dtype=torch.float64, generator=g) * 0.02 + 1e4).float()
    Xc = X.double().numpy() - X.double().numpy().mean(0)
    ref = solve_svdd(kernel_matrix(Xc, Xc, "rbf", 1e3), 0.125)
    valid = torch.ones(1, 16, dtype=torch.bool)
    opts = SolverOptions()
    for sol, *_ in (batched.boundary_partition(X[None], valid, 0.125, "rbf", 1e3, opts),
                    batched._optimum_partition(batched._warm_start, X[None], valid, 0.125,
                                               "rbf", 1e3, opts)):
        assert bool(sol.settled.all())
        assert np.abs(sol.alpha[0].numpy() - ref).sum() <= L1_BAR[torch.float32]


def _far_masked_keys(seed, offset):
    """Keys around ``offset`` (float64, 2 problems of 14 keys, the second with 4 absent)
    and the mask: the mean the keys are centred on is over the valid keys only."""
    k = random_keys(1, 2, 14, 3, seed=seed) + offset
    valid = torch.ones(1, 2, 14, dtype=torch.bool)
    valid[0, 1, 10:] = False
    return k, valid


def test_centring_is_differentiable_and_keeps_alpha_and_its_gradient():
    """rbf keys are centred on the mean of their valid keys before the solve
    (svattn.nn.common.centre_keys): gradcheck of alpha through it (float64, masked), and
    alpha and its gradient the same with and without a common shift of the keys."""
    k, valid = _far_masked_keys(20, 0.0)
    k.requires_grad_(True)

    def f(k):
        return solve_batched(k, 0.15, kernel="rbf", gamma=1 / 3, valid=valid)[0]

    assert torch.autograd.gradcheck(f, (k,), eps=1e-6, atol=1e-6, rtol=1e-4)
    w = torch.randn(1, 2, 14, generator=torch.Generator().manual_seed(21), dtype=torch.float64)
    res = []
    for shift in (0.0, 300.0):
        z = (k.detach() + shift).requires_grad_(True)
        alpha = f(z)
        res.append((alpha.detach(), torch.autograd.grad((alpha * w).sum(), z)[0]))
    torch.testing.assert_close(res[0][0], res[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(res[0][1], res[1][1], rtol=1e-7, atol=1e-9)


def _batched_and_exact(q, k, v, w, C, **kwargs):
    """The output and alpha of both modes, and the gradient of a loss on both to ``k``:
    ``([(out, alpha) batched, (out, alpha) exact], [grad batched, grad exact])``."""
    grads, outs = [], []
    for mode in ("batched", "exact"):
        out, alpha = sv_attention(q, k, v, C=C, mode=mode, return_alpha=True, **kwargs)
        (g,) = torch.autograd.grad((out * w).sum() + (alpha * alpha).sum(), k)
        grads.append(g)
        outs.append((out.detach(), alpha.detach()))
    return outs, grads


def test_keys_far_from_the_origin_match_the_exact_path():
    """Masked keys around 100 (float64): the output, alpha and gradients of the batched
    solve (its keys centred) against mode="exact" (distances from differences)."""
    k, valid = _far_masked_keys(22, 100.0)
    k.requires_grad_(True)
    q, v = random_keys(1, 2, 5, 3, seed=23) + 100.0, random_keys(1, 2, 14, 2, seed=24)
    w = torch.randn(1, 2, 5, 2, generator=torch.Generator().manual_seed(25), dtype=torch.float64)
    outs, grads = _batched_and_exact(q, k, v, w, 0.15, key_mask=valid)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=1e-10)
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-9)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-8)
    assert (grads[0][0, 1, 10:] == 0).all()


def test_only_a_translation_invariant_kernel_centres_its_keys():
    k, valid = _far_masked_keys(26, 5.0)
    assert centre_keys(k, valid, "exp", 0.5) is k
    c = centre_keys(k, valid, "rbf", 0.5)
    assert float(c[0, 0].sum(0).abs().max()) < 1e-12
    assert float(c[0, 1, :10].sum(0).abs().max()) < 1e-12
    assert torch.equal(c[0, 1, 10:], k[0, 1, 10:])  # absent keys as they are


def test_the_papers_path_leaves_the_box_on_trained_keys_and_says_so():
    """The path the recall models trained with (refine 0, one ridged margin solve):
    alpha outside [0, C] on trained keys; every such problem is reported unsettled."""
    keys, meta = trained_keys.read_fixture()
    C = meta["C"]
    k, valid = trained_keys.prefix_problems(keys[:2].reshape(-1, *keys.shape[-2:]), meta["chunk"],
                                torch.float64)
    alpha, _, info = solve_batched(k, C, kernel=meta["kernel"], gamma=meta["gamma"],
                                   valid=valid, solver=trained_keys.PAPER)
    outside = int(trained_keys.outside_box(alpha, valid, C).sum())
    assert outside > 0
    assert int(info.box_violations) > 0
    assert int(info.unsettled) >= outside


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_default_solver_keeps_the_sum_where_the_margin_set_is_empty(dtype):
    """A trained boundary problem (the layer-1 memory of chunk 0 of test sequence 6) on
    which a repair round empties the margin set with 9 tokens at C = 1/8 (Σ alpha = 9/8
    before the repair let a token rejoin the margin there): the approximate path keeps
    the mass; the default returns the optimum."""
    keys, meta = trained_keys.read_fixture()
    C, gamma, L = meta["C"], meta["gamma"], meta["chunk"]
    k = torch.from_numpy(keys[6, 1, 1, :L]).to(dtype)[None, None]  # (1, 1, L, Dh)
    valid = torch.ones(1, 1, L, dtype=torch.bool)
    old, _, info_old = solve_batched(k, C, kernel="rbf", gamma=gamma, valid=valid,
                                     solver=SolverOptions(finish="approximate"))
    assert abs(float(old.double().sum()) - 1.0) < 1e-6
    new, part, info = solve_batched(k, C, kernel="rbf", gamma=gamma, valid=valid)
    assert abs(float(new.double().sum()) - 1.0) <= (1e-12 if dtype == torch.float64 else 1e-6)
    assert int(info.unsettled) == 0
    assert trained_keys.distance_to_oracle(k, valid, new, C, "rbf", gamma).max() <= L1_BAR[dtype]


def _duplicated_keys(kernel, seed, P=12, n=30, D=4):
    """Problems of ``n`` keys from 6 centres, each key a copy of its centre moved by one
    of 0 (exact duplicates), 1e-13, 1e-9 or 1e-4 (relative)."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.5 if kernel == "rbf" else 0.8
    centres = scale * torch.randn(P, 6, D, generator=g, dtype=torch.float64)
    which = torch.randint(0, 6, (P, n), generator=g)
    x = centres.gather(1, which[..., None].expand(P, n, D))
    level = torch.tensor([0.0, 1e-13, 1e-9, 1e-4], dtype=torch.float64)
    pick = level[torch.randint(0, 4, (P, n), generator=g)]
    x = x + pick[..., None] * x.norm(dim=-1, keepdim=True) * torch.randn(
        P, n, D, generator=g, dtype=torch.float64)
    return x[None]  # (1, P, n, D)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("C", [0.05, 0.2])
def test_exact_and_near_duplicates_solve_to_the_oracle_optimum(kernel, C):
    k = _duplicated_keys(kernel, seed=int(100 * C) + (kernel == "exp"))
    valid = torch.ones(k.shape[:-1], dtype=torch.bool)
    gamma = 0.25
    alpha, _, info = solve_batched(k, C, kernel=kernel, gamma=gamma, valid=valid)
    assert int(trained_keys.outside_box(alpha, valid, C).sum()) == 0
    assert float((alpha.sum(-1) - 1).abs().max()) <= 1e-12
    assert int(info.unsettled) == 0
    assert trained_keys.distance_to_oracle(k, valid, alpha, C, kernel, gamma).max() <= 1e-6


def test_well_separated_keys_match_the_oracle_key_by_key():
    k = random_keys(2, 3, 40, 4, seed=3)
    valid = torch.ones(2, 3, 40, dtype=torch.bool)
    alpha, _, _ = solve_batched(k, 0.05, kernel="rbf", gamma=0.25, valid=valid)
    for X, a in zip(k.reshape(6, 40, 4).numpy(), alpha.reshape(6, 40).numpy(), strict=True):
        ref = solve_svdd(kernel_matrix(X, X, "rbf", 0.25), 0.05)
        assert np.abs(ref - a).sum() <= 1e-9


def test_ridge_zero_runs_on_exact_duplicates():
    """ridge = 0 with the default finish: exact duplicates give finite, feasible alpha
    (the approximate path refuses it when built, tests/nn/test_nn_options.py)."""
    k = random_keys(1, 2, 20, 4, seed=4)
    k[:, :, 10:] = k[:, :, :10]  # every key twice
    q, v = random_keys(1, 2, 5, 4, seed=5), random_keys(1, 2, 20, 3, seed=6)
    out, alpha = sv_attention(q, k, v, C=0.1, ridge=0.0, return_alpha=True)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(alpha).all())
    assert float((alpha.sum(-1) - 1).abs().max()) <= 1e-12
    assert bool(((alpha >= 0) & (alpha <= 0.1)).all())


def test_max_iter_is_the_number_of_fista_iterations():
    k = random_keys(1, 2, 24, 4, seed=7)
    q, v = random_keys(1, 2, 3, 4, seed=8), random_keys(1, 2, 24, 3, seed=9)
    for finish in ("optimum", "approximate"):
        *_, info = sv_attention_state(q, k, v, C=0.1, max_iter=300, refine=0, finish=finish)
        assert info.fista_iters == 300


def test_gradients_match_finite_differences_through_the_whole_solve():
    """gradcheck in float64: the closed-form backward of the final partition's KKT
    system against finite differences of the solve itself (FISTA, the finish)."""
    k = random_keys(1, 1, 14, 3, seed=10).requires_grad_(True)
    q, v = random_keys(1, 1, 4, 3, seed=11), random_keys(1, 1, 14, 2, seed=12)

    def f(k):
        out, alpha = sv_attention(q, k, v, C=0.15, return_alpha=True)
        return out, alpha

    assert torch.autograd.gradcheck(f, (k,), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_values_and_gradients_match_autograd_through_the_exact_solve():
    """Against mode="exact" (the float64 exact solver with its own implicit backward)."""
    k = random_keys(2, 2, 30, 4, seed=13).requires_grad_(True)
    q, v = random_keys(2, 2, 6, 4, seed=14), random_keys(2, 2, 30, 3, seed=15)
    w = torch.randn(2, 2, 6, 3, generator=torch.Generator().manual_seed(16), dtype=torch.float64)
    outs, grads = _batched_and_exact(q, k, v, w, 0.08)
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-7, atol=1e-9)


def test_gradient_of_a_duplicated_key_moved_as_one_matches_finite_differences():
    """Copies of one key (the finish merges them) moved together: their summed gradient
    is the derivative of the readout along that move."""
    base = random_keys(1, 1, 12, 3, seed=17)
    z = base[:, :, :4].clone().requires_grad_(True)  # keys 0..3, each also at 8..11
    q, v = random_keys(1, 1, 4, 3, seed=18), random_keys(1, 1, 12, 2, seed=19)
    v[:, :, 8:] = v[:, :, :4]

    def f(z):
        k = torch.cat([z, base[:, :, 4:8], z], 2)
        return sv_attention(q, k, v, C=0.15)

    assert torch.autograd.gradcheck(f, (z,), eps=1e-6, atol=1e-6, rtol=1e-4)
