"""The O(|S|²) parts of a removal cut down (#51 item 3): one refinement step on a healthy
inverse, the health of a large margin set's inverse read off its final solve (a probe
reading, measured in full every few checks and on suspicion), a fit that leaves what
the first removal would build, and the inverse written into a replaced one's memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exact_helpers import check_scratch_between_operations
from svattn.data.icu import default_slice_path, load_mimic3_vitals
from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled
from svattn.exact.backends.compiled import linalg, segments
from svattn.exact.operations import health as health_mod
from svattn.exact.operations.health import HealthMonitor


def _bordered(K: np.ndarray) -> np.ndarray:
    n = K.shape[0]
    Q = np.zeros((n + 1, n + 1))
    Q[0, 1:] = Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K
    return Q


def _gram(n: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, 3))
    d = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-0.5 * d) + 0.5 * np.eye(n)  # (well conditioned: errors near eps)


def test_refine_returns_the_probe_residual_and_a_second_step_mends_a_drifted_inverse():
    """The first residual it returns is ``‖rhs − Q Qinv rhs‖∞ / ‖rhs‖∞``; on an inverse off
    by 1e-6 (above the one-step bar) the second step still runs: one step alone would
    leave an error near 1e-12 of x, two leave rounding."""
    K = _gram(60, 0)
    Q = _bordered(K)
    Qi = np.linalg.inv(Q)
    rhs = np.random.default_rng(1).normal(size=61)
    exact = np.linalg.solve(Q, rhs)
    x = Qi @ rhs
    got = linalg.refine(Qi, K, rhs, x, 60)
    assert 0.0 <= got <= 1e-12  # (rounding: one step)
    assert np.abs(x - exact).max() <= 1e-13 * np.abs(exact).max()
    drift = Qi * (1.0 + 1e-6 * np.random.default_rng(2).normal(size=Qi.shape))
    x = drift @ rhs
    want = np.abs(rhs - Q @ x).max() / np.abs(rhs).max()
    first = linalg.refine(drift, K, rhs, x, 60)
    assert first == pytest.approx(want, rel=1e-6)
    assert first > linalg.REFINE_ONE_STEP
    assert np.abs(x - exact).max() <= 1e-13 * np.abs(exact).max()


def test_probe_readings_are_taken_between_full_measures_and_a_large_one_is_measured():
    """A probe reading (cond1 NaN) is accepted with the last full cond1 for PROBE_RUN
    checks in a row; the next check measures in full, as does any probe reading above
    1/PROBE_MARGIN of the drift bar."""
    mon = HealthMonitor()
    full = []

    def check(reading):
        q = np.ones((2, 2))  # a new inverse each time (checked once per object)
        pending = [reading]

        def measure():
            if pending:
                return pending.pop()
            full.append(1)
            return 50.0, 1e-15
        mon.check(q, measure, lambda: q)
        return q

    check((40.0, 1e-15))  # a full reading first
    for _ in range(health_mod.PROBE_RUN):
        check((math.nan, 2e-16))
    assert not full and mon.cond1 == 40.0 and mon.inv_residual == 2e-16
    check((math.nan, 2e-16))  # one too many: measured in full
    assert len(full) == 1 and mon.cond1 == 50.0
    check((math.nan, 0.5 * mon.drift_tol))  # a suspicion: measured at once
    assert len(full) == 2
    assert mon.n_drift_refactorizations == 0


def _memory(n: int = 1200) -> SVDDMemory:
    """The first ``n`` rows of the shipped ICU slice (z-scored, d = 7), nu = 0.05, gamma = 1:
    a margin set of about a third of the rows, as on the whole vitals."""
    keys = np.ascontiguousarray(load_mimic3_vitals(default_slice_path()).standardised().keys)
    mem = SVDDMemory(1.0 / (0.05 * n), gamma=1.0)
    mem.extend(keys[:n])
    return mem


@pytest.mark.slow
def test_a_fit_leaves_what_the_first_removal_would_build(monkeypatch):
    """After a batch fit the kept factor, K_SS and the spare for the inverse exist; the
    first removal then factorizes nothing whole (the first forget after a fit cost
    1.5-3.9× a settled one for these), and its certificate is the same as a memory's
    whose fit did not prepare them."""
    mem = _memory()
    ss = mem.solver_state
    assert mem.ingest_path == "libsvm+exact" and ss.nS >= compiled.FACTOR_KEPT_FROM
    assert ss.pd_factor is not None and ss.pd_factor.size == ss.nS
    assert ss.current_margin_gram() is not None and ss.qspare.size >= (ss.nS + 2) ** 2
    twin = _memory()
    twin.solver_state._zero_margin_gram()
    twin.solver_state.drop_factor()
    whole = []
    factor_into = compiled.factor_into
    monkeypatch.setattr(compiled, "factor_into",
                        lambda *a: whole.append(1) or factor_into(*a))
    tid = mem.partition()["margin"][3]
    cert = mem.remove(tid)
    assert not whole
    other = twin.remove(tid)
    assert whole  # (the twin built its factor in the removal)
    assert cert.state_digest == other.state_digest
    assert cert.unique_optimum == other.unique_optimum
    check_scratch_between_operations(ss)


@pytest.mark.slow
def test_removals_over_a_large_margin_set_read_probe_health_and_reuse_the_inverse_memory():
    """With HEALTH_PROBE_FROM margin tokens or more a removal's health reading is its final
    solve's probe residual (the monitor measures in full every PROBE_RUN + 1 checks),
    its inverse is written into the memory of the one it replaced (zeros between
    operations, never shared with the live inverse), and every removal stays exact."""
    rng = np.random.default_rng(3)
    mem = _memory()
    ss = mem.solver_state
    assert ss.nS >= segments.HEALTH_PROBE_FROM
    checks, views = mem.health.n_checks, 0
    for _ in range(20):
        tid = int(rng.choice(mem.partition()["margin"]))
        mem.remove(tid)
        views += ss.Qinv.base is not None
        check_scratch_between_operations(ss)
        bar = max(mem.health.drift_tol, 1e3 * np.finfo(float).eps * mem.health.cond1)
        assert mem.health.inv_residual <= bar
        assert mem.kkt_residual() <= mem.tol
    assert mem.health.n_checks - checks == 20
    assert views >= 15
    assert mem.health.probes <= health_mod.PROBE_RUN


def test_an_inverse_a_kernel_allocated_becomes_the_spare():
    """A compiled kernel's array has numba's memory owner as its base, not an array: the
    replaced inverse is still kept as the spare (it was dropped, and every other removal
    faulted a fresh |S|² array in)."""
    from svattn.exact.backends.compiled import columns
    from svattn.exact.operations import rollback

    Q = np.eye(6)
    made = columns.bordered_out(Q, 5)  # (a kernel's allocation)
    assert not isinstance(made.base, np.ndarray)
    ss = _margin_memory_state()
    ss.qspare = np.zeros(0)
    rollback._keep_spare(ss, made)
    assert np.shares_memory(ss.qspare, made) and ss.qspare.size == made.size


def _margin_memory_state():
    rng = np.random.default_rng(4)
    mem = SVDDMemory(C=0.01, kernel="rbf", gamma=0.3)
    mem.extend(rng.normal(size=(400, 3)))
    return mem.solver_state


def test_consecutive_removals_write_their_inverse_over_the_old_one_or_the_spare():
    """Each margin removal after a fit writes its inverse over the old one where it
    fits (zeros past it), else into the spare (the buffers take turns): never into a
    fresh array; the spare holds zeros between operations."""
    rng = np.random.default_rng(4)
    mem = SVDDMemory(C=0.01, kernel="rbf", gamma=3.0)
    mem.extend(rng.normal(size=(400, 3)))
    ss = mem.solver_state
    assert ss.nS >= 16
    where = []
    for _ in range(6):
        spare, old, count = ss.qspare, ss.Qinv, ss.inverse_overwrites
        assert spare.size >= (ss.nS + 2) ** 2
        mem.remove(int(rng.choice(mem.partition()["margin"])))
        if np.shares_memory(ss.Qinv, old):
            assert ss.inverse_overwrites == count + 1 and ss.Qinv.size <= old.size
            assert not old.reshape(-1)[ss.Qinv.size:].any()
            where.append("over the old")
        else:
            assert np.shares_memory(ss.Qinv, spare) and ss.inverse_overwrites == count
            where.append("spare")
        check_scratch_between_operations(ss)
    assert "over the old" in where, where
