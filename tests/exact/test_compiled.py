"""The compiled event loop and polish against their numpy references.

``SVDDMemory._compiled = False`` (per instance) runs the numpy reference of
every compiled step (drive, contraction, margin solve, KKT residual, health
measure). Two memories fed the same operations must take the same events and
reach the same state, to rounding. Event counts can differ where two events
tie to within rounding (e.g. alpha_c reaching 0 a few ulps before the last
margin coefficient reaches C: one loop takes one event, the other two, and the
polish lands both on the same partition), so counts are compared in bulk.
"""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.health import HealthMonitor


def _pair(C: float, kernel: str) -> tuple[SVDDMemory, SVDDMemory]:
    fast, ref = SVDDMemory(C, kernel=kernel), SVDDMemory(C, kernel=kernel)
    ref._compiled = False
    assert fast._compiled and not ref._compiled
    return fast, ref


def _assert_same(fast: SVDDMemory, ref: SVDDMemory) -> None:
    assert fast.ids == ref.ids
    assert fast.partition() == ref.partition()
    np.testing.assert_allclose(fast.alpha, ref.alpha, rtol=0, atol=1e-12)
    assert fast.mu == pytest.approx(ref.mu, abs=1e-12)
    assert fast.kkt_residual() <= 1e-10 and ref.kkt_residual() <= 1e-10
    if fast._nS and not fast.warm:
        np.testing.assert_allclose(fast._Qinv, ref._Qinv, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("d, C", [(2, 0.02), (8, 0.05), (8, 0.3)])
def test_compiled_matches_reference_through_adds_and_removes(kernel, d, C):
    rng = np.random.default_rng(d * 100 + int(100 * C))
    X = rng.normal(size=(240, d)) * (0.5 if kernel == "exp" else 1.0)
    fast, ref = _pair(C, kernel)
    for x in X:
        fast.add(x)
        ref.add(x)
    _assert_same(fast, ref)
    live = list(fast.ids)
    order = rng.permutation(len(live))[:120]
    same_events = 0
    for k, i in enumerate(order):
        cf, cr = fast.remove(live[i]), ref.remove(live[i])
        same_events += cf.n_events == cr.n_events
        assert cf.partition_after == cr.partition_after
        if k % 10 == 0:
            _assert_same(fast, ref)
            x = rng.normal(size=d) * (0.5 if kernel == "exp" else 1.0)
            assert fast.add(x) == ref.add(x)
    _assert_same(fast, ref)
    assert same_events >= 0.95 * len(order)


def test_compiled_matches_reference_on_clusters_with_cache_growth():
    # clustered keys with outliers: many events per removal, reserve tokens
    # entering the margin (column allocation) and the column cache growing
    # while a drive runs (the compiled loop stops and resumes)
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(5, 16))
    X = centers[rng.integers(0, 5, 400)] + 0.1 * rng.normal(size=(400, 16))
    X[rng.random(400) < 0.05] *= 3.0
    fast, ref = _pair(0.004, "rbf")
    grew = False
    for x in X:
        before = fast._ccap
        fast.add(x)
        ref.add(x)
        grew |= fast._ccap > before
    assert grew
    _assert_same(fast, ref)
    errors = fast.partition()["error"][:20]
    margin = fast.partition()["margin"][:20]
    same_events = sum(fast.remove(t).n_events == ref.remove(t).n_events for t in errors + margin)
    assert same_events >= 0.9 * len(errors + margin)
    _assert_same(fast, ref)


def test_compiled_kkt_and_health_equal_their_references():
    rng = np.random.default_rng(3)
    mem = SVDDMemory(0.02)
    mem.extend(rng.normal(size=(300, 6)))
    g = mem._fresh_g()
    # at the optimum both are rounding (sum(alpha) − 1: sequential vs pairwise sum)
    assert mem._kkt(g) == pytest.approx(mem._kkt_reference(g), abs=1e-15)
    # a violated state: the residual must see it in both
    g_bad = g.copy()
    g_bad[mem._state[: mem._hi] == 1] -= 0.5  # reserve tokens (alpha = 0) need g >= 0
    assert mem._kkt(g_bad) == pytest.approx(mem._kkt_reference(g_bad), rel=1e-12)
    assert mem._kkt(g_bad) > 0.1
    good = mem._Qinv
    drifted = good.copy()
    drifted[1, 2] += 1e-6
    drifted[2, 1] += 1e-6
    for Q in (good, drifted):
        mem._Qinv = Q
        mem._compiled = True
        fast = HealthMonitor.measure(mem)
        mem._compiled = False
        slow = HealthMonitor.measure(mem)
        assert fast[0] == pytest.approx(slow[0], rel=1e-9)  # cond1
        assert fast[1] == pytest.approx(slow[1], rel=1e-6, abs=1e-14)  # inverse residual
    assert fast[1] > 1e-7  # the drifted inverse is seen by both
