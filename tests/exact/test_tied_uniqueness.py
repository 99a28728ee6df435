"""The uniqueness test of an optimum with tokens tied at ``g = 0``
(``solver.unique_optimum``), compiled on the kept factor: the tied tokens' rows appended
to it and taken off again (``compiled.tied_positive_definite``), where the general test
gathers the block of the margin set and the tied tokens from the keys and factors it
whole (the reference's, ``reference.tied_positive_definite``: 250 ms at 2,468 margin
tokens). The verdicts are the general test's; the factor is left as it was; and where
the kept factor cannot tell (a near-copy of a margin token, more tied tokens than its
shift covers) the general test decides.

The problem is real data: the first distinct rows of the MIMIC-III demo vitals slice
shipped with svattn (z-scored), γ = 1, ν = 0.05: hundreds of margin tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled, reference
from svattn.exact.core.kktsets import ERROR, RESERVE
from svattn.exact.operations import solver
from tied_helpers import add_tied_near_copy, distinct_icu_rows

N = 600
NU = 0.05


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return distinct_icu_rows(N)


@pytest.fixture(scope="module")
def fitted(rows) -> SVDDMemory:
    mem = SVDDMemory(1.0 / (NU * N), gamma=1.0)
    mem.extend(rows)
    ss = mem.solver_state
    assert ss.nS >= compiled.FACTOR_KEPT_FROM and ss.pd_factor is not None
    return mem


def _copy(mem: SVDDMemory) -> SVDDMemory:
    """A copy with what a fit leaves (a copy keeps no caches: the Gram block and the
    kept factor are built again, as after a fit)."""
    twin = copy.deepcopy(mem)
    compiled.ready_for_removals(twin.solver_state)
    assert twin.solver_state.pd_factor is not None
    return twin


def _outside(mem: SVDDMemory) -> np.ndarray:
    ss = mem.solver_state
    st = ss.state[: ss.hi]
    return np.flatnonzero((st == RESERVE) | (st == ERROR))


def _factor(ss):
    f = ss.pd_factor
    return f.L.copy(), f.n, f.ids.copy(), f.shift


@pytest.mark.parametrize("count", [1, 2, 5])
def test_the_kept_factor_gives_the_general_tests_verdict(fitted, whole_tests, count):
    """Tokens outside the margin set taken as tied (the test's contract holds for any):
    the kept factor says positive definite, as the general test does, without it."""
    mem = _copy(fitted)
    ss = mem.solver_state
    rng = np.random.default_rng(count)
    for _ in range(4):
        tied = np.sort(rng.choice(_outside(mem), count, replace=False))
        assert reference.tied_positive_definite(ss, tied)
        assert compiled.tied_positive_definite(ss, tied)
    assert whole_tests == []  # the kept factor told


def test_the_factor_is_left_as_it_was(fitted):
    mem = _copy(fitted)
    ss = mem.solver_state
    L, n, ids, shift = _factor(ss)
    tied = _outside(mem)[:3]
    assert compiled.tied_positive_definite(ss, tied)
    f = ss.pd_factor
    assert f.n == n and f.shift == shift and np.array_equal(f.ids, ids)
    assert np.array_equal(f.L, L)  # the appended rows taken off: zeros past n again
    assert not f.L[n:].any()


def test_a_singular_block_is_left_to_the_general_test(fitted, whole_tests):
    """Two tokens outside the margin set 1e-7 apart (a near-copy added beside a reserve
    token): the block is singular to far below the shift, the append fails and the
    general test says so, as the reference does; the factor is as it was."""
    mem = _copy(fitted)
    ss = mem.solver_state
    far = int(np.argmax(np.where(ss.state[: ss.hi] == RESERVE, ss.g[: ss.hi], -np.inf)))
    twin = ss.id_to_slot[mem.add(ss.X[far] + 1e-7)]
    assert ss.state[twin] == RESERVE and ss.state[far] == RESERVE
    tied = np.array([far, twin])
    L, n, ids, _ = _factor(ss)
    assert not reference.tied_positive_definite(ss, tied)
    assert not compiled.tied_positive_definite(ss, tied)
    assert len(whole_tests) == 1  # the kept factor could not tell
    f = ss.pd_factor
    assert f.n == n and np.array_equal(f.L, L) and np.array_equal(f.ids, ids)


def test_more_tied_tokens_than_its_shift_covers_go_to_the_general_test(rows, whole_tests,
                                                                        monkeypatch):
    """The kept factor's shift (twice ``1e-10·trace`` of the margin block when computed)
    must be at least ``1e-10·trace`` of the whole block: past as many tied tokens as
    margin tokens (rbf: a unit diagonal) it cannot tell, and the general test decides.
    A wide kernel keeps the margin set small (its factor kept from 4 tokens here)."""
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem = SVDDMemory(1.0 / (NU * N), gamma=0.1)
    mem.extend(rows)
    ss = mem.solver_state
    f = ss.pd_factor
    covered = int(round(f.shift / 1e-10 - np.trace(ss.current_margin_gram())))
    tied = _outside(mem)[: covered + 1]
    assert covered == ss.nS and len(tied) == covered + 1 and f.n + len(tied) <= min(f.L.shape)
    assert compiled.tied_positive_definite(ss, tied) == reference.tied_positive_definite(
        ss, tied)
    assert len(whole_tests) == 1
    assert compiled.tied_positive_definite(ss, tied[:covered - 1])  # (within: it tells)
    assert len(whole_tests) == 1


def test_a_forget_beside_a_near_copy_certifies_as_the_reference_does(fitted, whole_tests):
    """A near-copy (1e-9) of a margin token sits tied at g = 0 beside it; a support
    forget of another token leaves it tied, and its certificate's uniqueness is the
    general test's verdict (not unique: the block is singular), through the backend's
    test."""
    mem = _copy(fitted)
    ss = mem.solver_state
    _, _, victim = add_tied_near_copy(mem)
    cert = mem.remove(victim)
    g = solver.fresh_g(ss, compiled)
    tied = compiled.tied_slots(ss, g, 1e-9 * ss.scale)
    assert len(tied) >= 1
    assert cert.unique_optimum is False
    assert len(whole_tests) == 1  # the backend's test: the kept factor could not tell
    assert cert.unique_optimum == reference.tied_positive_definite(ss, tied)
