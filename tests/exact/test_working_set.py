"""A support removal follows its path on a working set, checked by one pass over every
token (:mod:`svattn.exact.backends.compiled.working_set`): at most three passes over the
margin block where the path over all tokens takes one per event, and the same state as
that path (its slow reference, ``max_jumps = 0``) and as a fresh solve by the oracle.

The problem is real data: the first rows of the MIMIC-III demo vitals slice shipped with
svattn, as its loader gives them (z-scored; exact copies dropped, so the optimum is
unique), γ = 1 and ν = 0.05 — hundreds of margin vectors, removals of several events.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import gram_matrix
from svattn.exact.operations import solver
from svattn.exact.oracle import solve_svdd
from tied_helpers import distinct_icu_rows

N = 1500
NU = 0.05


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return distinct_icu_rows(N)  # file order, each row once


@pytest.fixture(scope="module")
def fitted(rows) -> SVDDMemory:
    mem = SVDDMemory(1.0 / (NU * N), gamma=1.0)
    mem.extend(rows)
    return mem


def _removals(mem: SVDDMemory, count: int, seed: int) -> list[int]:
    part = mem.partition()
    support = part["margin"] + part["error"]
    return [int(t) for t in np.random.default_rng(seed).permutation(support)[:count]]


def _remove_counted(mem: SVDDMemory, tid: int) -> int:
    """Remove ``tid``; return the passes over the margin block it took (the solver's
    own counter, ``n_block_passes``: each segment's, each check's). Only a removal that
    ends in its segments' own final check (status "done", the ``statuses`` fixture) has
    every pass it took in that counter: the event loop's and the general finish's
    are not in it."""
    before = mem.solver_state.n_block_passes
    mem.remove(tid)
    return mem.solver_state.n_block_passes - before


@pytest.fixture
def statuses(monkeypatch) -> list[str]:
    seen: list[str] = []
    original = solver.remove_slot

    def remove_slot(ss, be, slot):
        outcome = original(ss, be, slot)
        seen.append(outcome.status)
        return outcome

    monkeypatch.setattr(solver, "remove_slot", remove_slot)
    return seen


def test_a_support_forget_takes_at_most_three_passes(fitted, statuses):
    fast = copy.deepcopy(fitted)
    path = copy.deepcopy(fitted)
    path.solver_state.max_jumps = 0  # the path over all tokens: one pass per event
    assert fast.solver_state.nS >= 300
    fast_passes, path_passes = [], []
    for tid in _removals(fitted, 30, seed=1):
        fast_passes.append(_remove_counted(fast, tid))
        path_passes.append(_remove_counted(path, tid))
    assert set(statuses) == {"done"}, statuses
    assert max(fast_passes) <= 3, fast_passes
    # the problem needs it: removals of several events, which the path pays pass by pass
    assert sum(p >= 4 for p in path_passes) >= 3, path_passes
    assert sum(fast_passes) < 0.75 * sum(path_passes)
    assert fast.solver_state.n_jumps >= 10  # the working set finished them
    assert fast.ids == path.ids and fast.partition() == path.partition()
    np.testing.assert_allclose(fast.alpha, path.alpha, rtol=0, atol=1e-12)
    assert fast.mu == pytest.approx(path.mu, abs=1e-12)


@pytest.mark.parametrize("max_rounds", [1, 2])
def test_working_set_forgets_equal_the_path_and_a_fresh_solve(fitted, rows, max_rounds):
    """With one checking pass allowed a miss hands the removal back to the path (from
    its first event); with two, the path is followed again on the grown working set.
    Either way the state is the path's, and the oracle's solve of the rows held."""
    fast = copy.deepcopy(fitted)
    path = copy.deepcopy(fitted)
    fast.solver_state.max_jumps = max_rounds
    path.solver_state.max_jumps = 0
    for tid in _removals(fitted, 12, seed=2):
        cf, cp = fast.remove(tid), path.remove(tid)
        assert cf.partition_after == cp.partition_after
        assert cf.kkt_residual_after <= 1e-12
        assert fast.partition() == path.partition()
        np.testing.assert_allclose(fast.alpha, path.alpha, rtol=0, atol=1e-12)
    ss = fast.solver_state
    assert ss.n_jumps >= 5 and ss.n_segment_fallbacks == 0 and fast.n_resolves == 0
    if max_rounds == 1:
        assert ss.n_jump_fallbacks >= 1  # a miss: left to the path
    held = rows[np.asarray(fast.ids)]
    K = gram_matrix(held, "rbf", 1.0)
    alpha, mu = solve_svdd(K, fast.C, return_mu=True)
    np.testing.assert_allclose(fast.alpha, alpha, rtol=0, atol=1e-9)
    assert fast.mu == pytest.approx(mu, abs=1e-9)


def test_a_working_set_predicted_ahead_takes_the_check_alone(fitted, rows, statuses):
    """The working set is predicted ahead of any pass (``segments.line_ahead``: every
    token's g at the first segment's end estimated from the 32 cache columns whose
    coefficients move most), so the path's end is verified by the check alone: a
    removal the working set finishes takes one pass over the margin block, where the
    first segment's pass and the check took two (each of the 21 of these 30 it finished
    before). The state is the path's (``max_jumps = 0``) and the oracle's."""
    fast = copy.deepcopy(fitted)
    path = copy.deepcopy(fitted)
    path.solver_state.max_jumps = 0
    jumped_passes = []
    for tid in _removals(fitted, 30, seed=1):
        before = fast.solver_state.n_jumps
        passes = _remove_counted(fast, tid)
        if fast.solver_state.n_jumps > before:
            jumped_passes.append(passes)
        path.remove(tid)
    assert set(statuses) == {"done"}, statuses
    assert len(jumped_passes) >= 15, jumped_passes
    assert sum(p == 1 for p in jumped_passes) >= 0.8 * len(jumped_passes), jumped_passes
    assert max(jumped_passes) <= 3, jumped_passes
    assert fast.partition() == path.partition()
    np.testing.assert_allclose(fast.alpha, path.alpha, rtol=0, atol=1e-12)
    held = rows[np.asarray(fast.ids)]
    alpha, mu = solve_svdd(gram_matrix(held, "rbf", 1.0), fast.C, return_mu=True)
    np.testing.assert_allclose(fast.alpha, alpha, rtol=0, atol=1e-9)
    assert fast.mu == pytest.approx(mu, abs=1e-9)
