"""Standby columns: cached kernel columns of the reserve tokens nearest the boundary.

They are a cache and nothing else: the solution, certificates and digests of a
memory with standby columns equal those of one without; the columns hold exact
kernel values; a removal that brings a standby token into the margin set uses
its column; eviction only ever drops a standby column; a removed token leaves
no trace in them.
"""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import backend_of
from svattn.exact import SVDDMemory
from svattn.exact.backends.compiled import checks
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.core.kktsets import RESERVE


def _standby_slots(mem: SVDDMemory) -> list[int]:
    soc = mem.solver_state.slot_of_col[mem.solver_state.nS : mem.solver_state.chi]
    return sorted(int(s) for s in soc if s >= 0 and mem.solver_state.state[s] == RESERVE)


def _nearest_by_sort(mem: SVDDMemory, m: int) -> list[int]:
    reserve = np.flatnonzero(mem.solver_state.state[: mem.solver_state.hi] == RESERVE)
    order = np.lexsort((reserve, mem.solver_state.g[reserve]))  # g, then slot
    return reserve[order][:m].tolist()


def _assert_columns_exact(mem: SVDDMemory) -> None:
    hi = mem.solver_state.hi
    live = mem.solver_state.live_slots()
    for col in range(mem.solver_state.chi):
        s = int(mem.solver_state.slot_of_col[col])
        if s < 0:
            continue
        assert mem.solver_state.col_of_slot[s] == col, "one column per token, both maps agree"
        X = mem.solver_state.X
        want = kernel_matrix(X[live], X[s][None, :], mem.kernel, mem.gamma_value)[:, 0]
        want[live == s] = mem.solver_state.diag[s]
        np.testing.assert_allclose(mem.solver_state.KC[live, col], want, rtol=1e-13, atol=1e-15)
        dead = np.setdiff1d(np.arange(hi), live)
        assert not mem.solver_state.KC[dead, col].any(), "a freed slot's row must be zero"


def test_nearest_reserve_is_a_stable_sort_by_g_including_ties():
    rng = np.random.default_rng(0)
    for trial in range(200):
        hi = int(rng.integers(0, 60))
        g = rng.integers(0, 8, size=hi).astype(float) * 0.25  # many ties
        state = rng.choice(np.array([0, 1, 2, RESERVE], dtype=np.int8), size=hi)
        for m in (1, 3, 16):
            out = np.empty(m, dtype=np.int64)
            n = checks.nearest_reserve(g, state, hi, out)
            reserve = np.flatnonzero(state == RESERVE)
            want = reserve[np.lexsort((reserve, g[reserve]))][:m]
            assert out[:n].tolist() == want.tolist(), (trial, m)


@pytest.mark.parametrize("compiled", [True, False])
def test_standby_columns_are_the_nearest_reserve_tokens_with_exact_columns(compiled):
    rng = np.random.default_rng(1)
    mem = SVDDMemory(0.05, standby=6, backend="compiled" if compiled else "reference")
    ids = mem.extend(rng.normal(size=(150, 4)))
    for t in ids[:40:3]:
        mem.remove(t)
        mem.add(rng.normal(size=4))
        nearest = _nearest_by_sort(mem, 12)
        standby = _standby_slots(mem)
        assert set(nearest[:6]) <= set(standby) <= set(nearest), "picks cached, only near kept"
        assert mem.solver_state.standby_theta == mem.solver_state.g[nearest[5]]
        _assert_columns_exact(mem)


def test_standby_changes_nothing_but_the_cache():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 6))
    plain, cached = SVDDMemory(0.02, standby=0), SVDDMemory(0.02, standby=16)
    for mem in (plain, cached):
        mem.extend(X[:200])
    used = 0
    for x in X[200:]:
        live = plain.ids
        tid = live[int(rng.integers(len(live)))]
        standby_before = {cached.solver_state.slot_id[s] for s in _standby_slots(cached)}
        reserve_before = set(cached.partition()["reserve"])
        c_plain, c_cached = plain.remove(tid), cached.remove(tid)
        used += len(set(cached.partition()["margin"]) & reserve_before & standby_before)
        # (event counts may differ: a full cache can stop an active-set step that
        # the other memory takes, and the path then finishes the removal)
        assert c_plain.partition_after == c_cached.partition_after
        assert c_cached.kkt_residual_after <= 1e-10
        assert plain.partition() == cached.partition()
        np.testing.assert_allclose(plain.alpha, cached.alpha, rtol=0, atol=1e-13)
        assert plain.mu == pytest.approx(cached.mu, abs=1e-13)
        plain.add(x)
        cached.add(x)
    assert used > 0, "no removal brought a standby token into the margin set"
    assert not _standby_slots(plain)
    _assert_columns_exact(cached)


def _memory(seed: int, C: float, standby: int, compiled: bool, n: int) -> SVDDMemory:
    mem = SVDDMemory(C, standby=standby, backend="compiled" if compiled else "reference")
    mem.extend(np.random.default_rng(seed).normal(size=(n, 3)))
    return mem


@pytest.mark.parametrize("compiled", [True, False])
def test_a_full_cache_evicts_a_standby_column_never_a_support_column(compiled):
    mem = _memory(3, 0.2, 4, compiled, 40)

    def uncached_reserve() -> list[int]:
        ss = mem.solver_state
        return [int(s) for s in np.flatnonzero(ss.state[: ss.hi] == RESERVE)
                if mem.solver_state.col_of_slot[s] < 0]

    ss = mem.solver_state
    while ss.chi < ss.ccap or (ss.slot_of_col[: ss.chi] < 0).any():
        # fill every hole and the room past chi
        backend_of(mem).alloc_col(ss, uncached_reserve()[0])
    owners = {int(s) for s in mem.solver_state.slot_of_col[: mem.solver_state.chi]}
    support = {s for s in owners if mem.solver_state.state[s] != RESERVE}
    standby = owners - support
    assert standby and support
    outsider = uncached_reserve()[0]
    ccap = mem.solver_state.ccap
    backend_of(mem).alloc_col(mem.solver_state, outsider)
    assert mem.solver_state.ccap == ccap, "a standby column was there to give: no growth"
    after = {int(s) for s in mem.solver_state.slot_of_col[: mem.solver_state.chi] if s >= 0}
    assert support <= after and outsider in after
    assert len(standby - after) == 1
    _assert_columns_exact(mem)


@pytest.mark.parametrize("compiled", [True, False])
def test_removing_a_standby_token_leaves_no_trace_in_the_cache(compiled):
    mem = _memory(4, 0.05, 8, compiled, 100)
    slot = _standby_slots(mem)[0]
    col = int(mem.solver_state.col_of_slot[slot])
    tid = int(mem.solver_state.slot_id[slot])
    mem.remove(tid)
    assert mem.solver_state.col_of_slot[slot] == -1 and mem.solver_state.slot_of_col[col] != slot
    assert not mem.solver_state.KC[slot].any() and not mem.solver_state.X[slot].any()
    _assert_columns_exact(mem)


def test_standby_argument_is_checked():
    for bad in (-1, 1.5, True, "4", None):
        with pytest.raises(ValueError, match="standby must be an int >= 0"):
            SVDDMemory(0.1, standby=bad)
    assert SVDDMemory(0.1, standby=0).standby == 0
