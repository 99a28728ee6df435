"""FISTA's compiled CPU loop (svattn.nn.partition_cpu) against the op-by-op static schedule."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from svattn.nn import batched
from svattn.nn.batched import fista, kernel_problem
from svattn.nn.common import host_reads, no_host_reads


def _problem(dtype, kernel="rbf", P=6, n=30, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    kf = torch.randn(P, n, D, generator=g, dtype=dtype)
    valid = torch.rand(P, n, generator=g) < 0.75
    valid[:, :10] = True
    K, d, _ = kernel_problem(kf, valid, kernel, 1.0 / D)
    return K, d, valid


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_compiled_loop_matches_static_schedule(kernel, dtype):
    K, d, valid = _problem(dtype, kernel)
    assert host_reads(K)
    it = 10
    a0 = torch.where(valid, torch.rand(valid.shape, dtype=dtype), 0.0)
    a0 = batched.ProjectionPlan.of(valid, dtype).project(
        torch.where(valid, a0, batched.ProjectionPlan.of(valid, dtype).low), 0.2)[0]
    for start in (None, a0):
        fast, n_fast = fista(K, d, 0.2, valid, max_iter=it, a0=start)
        with no_host_reads():
            static, n_static = fista(K, d, 0.2, valid, max_iter=it, a0=start)
        assert n_fast == n_static == it
        tol = 1e-12 if dtype == torch.float64 else 2e-5
        torch.testing.assert_close(fast, static, rtol=0, atol=tol)
        assert bool((fast[~valid] == 0).all())
        # the projection's own stop: |Σ x − 1| <= 8·eps·n
        torch.testing.assert_close(fast.sum(-1), torch.ones(K.shape[0], dtype=dtype), rtol=0,
                                   atol=8 * torch.finfo(dtype).eps * K.shape[-1])
        assert bool(((fast >= 0) & (fast <= 0.2)).all())


def _aten_calls(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def test_ops_per_solve_do_not_grow_with_iterations():
    K, d, valid = _problem(torch.float32)
    counts = {}
    for it in (5, 40):
        batched.fista(K, d, 0.2, valid, max_iter=it)  # compiled on first use
        counts[it] = _aten_calls(lambda it=it: batched.fista(K, d, 0.2, valid, max_iter=it))
    # the power iteration for the step and the hand-over; the op-by-op loop ran ~70 a step
    assert counts[5] == counts[40] and counts[5] < 100, counts


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("steps", [0, 1], ids=lambda s: f"ridge_steps{s}")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_compiled_repair_matches_static_schedule(kernel, steps, dtype):
    from svattn.nn.options import SolverOptions

    K, d, valid = _problem(dtype, kernel, P=12, seed=1)
    C = 0.2
    a, _ = fista(K, d, C, valid, max_iter=6)  # a rough iterate: the repair has work to do
    opts = SolverOptions(ridge_steps=steps, refine=10, finish="approximate")
    tol = batched.default_kkt_tol(dtype)
    S, E, settled = batched._repair(K, d, C, valid, a, opts, tol)
    with no_host_reads():
        S2, E2, settled2 = batched._repair(K, d, C, valid, a, opts, tol)
    S0, E0 = batched._sets(a, C, valid)
    assert not (torch.equal(S, S0) and torch.equal(E, E0))  # the rounds moved something
    assert torch.equal(S, S2) and torch.equal(E, E2) and torch.equal(settled, settled2)


def test_partition_ops_do_not_grow_with_iterations_or_rounds():
    from svattn.nn.options import SolverOptions

    K, d, valid = _problem(torch.float32)
    counts = {}
    for it, refine in ((8, 20), (40, 40)):
        opts = SolverOptions(max_iter=it, refine=refine, finish="approximate")
        # every problem settles in both, so neither runs the retry (a CPU-only skip)
        assert bool(batched.solve_partition(K, d, 0.2, valid, opts).settled.all())
        counts[it] = _aten_calls(lambda o=opts: batched.solve_partition(K, d, 0.2, valid, o))
    assert counts[8] == counts[40] < 150, counts


def test_the_small_lu_reports_a_zero_pivot_and_the_repair_refuses_by_name():
    """lu_factor_small returns whether every pivot is nonzero; the compiled repair stops
    at a margin system with a zero pivot and repair_loop raises (no ZeroDivisionError)."""
    import numpy as np

    from svattn.nn.partition_cpu import lu_factor_small, repair_loop

    piv = np.empty(3, dtype=np.int64)
    assert lu_factor_small(np.array([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]]), piv)
    assert not lu_factor_small(np.array([[2.0, 2.0, 1.0], [2.0, 2.0, 1.0], [1.0, 1.0, 0.0]]),
                               piv)
    K = torch.ones(2, 4, 4, dtype=torch.float64)  # every key a copy of one
    d = torch.ones(2, 4, dtype=torch.float64)
    valid = torch.ones(2, 4, dtype=torch.bool)
    S = torch.ones(2, 4, dtype=torch.bool)
    E = torch.zeros(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"ridge=1e-17 is too small .* problem 0 is singular"):
        repair_loop(K, d, valid, S, E, 0.5, 1e-17, 1, 5, 1e-9)
    S2, E2, settled = repair_loop(K, d, valid, S, E, 0.5, 1e-3, 1, 5, 1e-9)
    assert settled.all() and torch.equal(S2, S)
