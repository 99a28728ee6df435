"""Operations return what they found (svattn.exact.core.outcome): a removal's residual,
certificate facts and health reading, an add's ids and path; the solver state keeps
none of them (issue #38 item 2)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled
from svattn.exact.core.outcome import AddOutcome, HealthReading, RemovalOutcome
from svattn.exact.core.state import SlotState
from svattn.exact.operations import ingest, solver

# what a removal or an add found, once left on the state for the next reader
_RESULTS = {"kkt_after", "facts_after", "health_after", "ingest_path"}


def _stream(n: int = 120, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4))


def test_the_solver_state_holds_no_operation_results():
    assert not _RESULTS & {f.name for f in dataclasses.fields(SlotState)}
    mem = SVDDMemory(0.05)
    mem.extend(_stream())
    mem.remove(mem.partition()["margin"][0])
    mem.add(np.zeros(4))
    assert not _RESULTS & set(vars(mem.solver_state))


def _removals(monkeypatch, mem: SVDDMemory) -> list[RemovalOutcome]:
    seen: list[RemovalOutcome] = []
    remove_slot = solver.remove_slot

    def recording(*args, **kwargs):
        seen.append(remove_slot(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(solver, "remove_slot", recording)
    return seen


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_removal_returns_what_its_certificate_reports(monkeypatch, backend):
    """The outcome's events, residual and facts are the certificate's; the compiled
    segment path finds the facts itself ("done"), the reference never does."""
    mem = SVDDMemory(0.05, backend=backend)
    mem.extend(_stream())
    seen = _removals(monkeypatch, mem)
    ss = mem.solver_state
    for t in mem.partition()["margin"][:6] + mem.partition()["reserve"][:2]:
        cert = mem.remove(t)
        out = seen[-1]
        assert out.events == cert.n_events
        if out.kkt is not None:
            assert out.kkt == cert.kkt_residual_after
        if out.facts is not None:
            assert out.facts.sizes == cert.partition_after
            assert ss.digest(out.facts.ids, out.facts.values) == cert.state_digest
            assert out.health is not None and out.health.cond1 > 1
    statuses = {o.status for o in seen}
    assert "reserve" in statuses
    assert ("done" in statuses) is (backend == "compiled")
    assert all((o.facts is None) is (o.status != "done") for o in seen)


def test_the_health_check_takes_the_removal_reading_first(monkeypatch):
    """A reading above the drift bar, returned by the removal, makes the monitor
    refactorize; the measurement after it is fresh (not the reading again)."""
    mem = SVDDMemory(0.05)
    mem.extend(_stream())
    remove_by_segments = compiled.remove_by_segments

    def drifted(*args, **kwargs):
        out = remove_by_segments(*args, **kwargs)
        return dataclasses.replace(out, health=HealthReading(10.0, 1e-3))

    monkeypatch.setattr(compiled, "remove_by_segments", drifted)
    before = mem.health.n_drift_refactorizations
    seen = _removals(monkeypatch, mem)
    for t in mem.partition()["margin"]:
        mem.remove(t)
        if seen[-1].status == "done":
            break
    assert seen[-1].status == "done"
    assert mem.health.n_drift_refactorizations == before + 1
    assert mem.health.inv_residual < 1e-10


def test_an_add_returns_its_ids_and_path():
    ss = SVDDMemory(0.05).solver_state
    out = ingest.add_rows(ss, compiled, _stream(10), None)
    assert out == AddOutcome(ids=list(range(10)), path="incremental")


def test_a_reserve_add_after_a_batch_extend_reports_its_own_path():
    """``ingest_path`` says how the last add solved its rows: an add stored into the
    reserve set by the fast path is incremental, after a batch extend too."""
    X = np.random.default_rng(0).normal(size=(600, 4))
    mem = SVDDMemory(1 / 60, gamma=0.3, standby=0)
    mem.extend(X)
    assert mem.ingest_path == "libsvm+exact"
    mem.remove(mem.partition()["reserve"][0])  # a free slot: the fast path can store
    n_reserve = len(mem.partition()["reserve"])
    mem.add(0.01 * X[0])
    assert len(mem.partition()["reserve"]) == n_reserve + 1
    assert mem.ingest_path == "incremental"
    assert mem.copy().ingest_path == pickle.loads(pickle.dumps(mem)).ingest_path \
        == "incremental"


def test_a_state_pickled_with_result_fields_loads_without_them():
    """A state pickled before the outcome objects carried the last operation's
    results: unpickled, they are dropped (no reader is left)."""
    mem = SVDDMemory(0.05)
    mem.extend(_stream(40))
    old = dict(vars(mem.solver_state), kkt_after=3.5e-17, facts_after=None,
               health_after=None, ingest_path="incremental")
    ss = SlotState.__new__(SlotState)
    ss.__setstate__(old)
    assert not _RESULTS & set(vars(ss))
    assert ss.digest(*_support(ss)) == mem.state_digest()


def _support(ss: SlotState) -> tuple[np.ndarray, np.ndarray]:
    slots = compiled.support_slots_by_id(ss)
    return ss.slot_id[slots], np.append(ss.alpha[slots], ss.mu)


def test_a_state_pickled_before_the_removal_work_copy_existed_removes_alike():
    """A state pickled before the removal's kept work copy of the bordered inverse
    (issue #36) lacks its fields: unpickled, they start empty, and a removal gives the
    certificate the memory itself gives."""
    import copy

    mem = SVDDMemory(0.05)
    mem.extend(_stream(60))
    old = {k: v for k, v in copy.deepcopy(vars(mem.solver_state)).items()
           if k not in ("qwork", "qwork_for", "qwork_n")}
    twin = mem.copy()
    ss = SlotState.__new__(SlotState)
    ss.__setstate__(old)
    twin._s = ss
    tid = mem.partition()["margin"][0]
    assert twin.remove(tid).state_digest == mem.remove(tid).state_digest
