"""The block fit's two takes of keys (``core.cache.index_columns``, ``solver.
solve_by_columns``) write through ``np.take(..., mode="clip")`` (no buffered copy of the
keys, ``tests/exact/test_block_fit_residue.py``), which would clamp an index out of range
to a wrong key without a word, a negative one to slot 0 (``mode="raise"`` wrapped it,
``mode="clip"`` does not). Every caller hands them live slots; an index that is not one
is refused before anything is written (``core.cache.take_rows``)."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.core import cache
from svattn.exact.operations import batch, solver


def _fitted():
    mem = SVDDMemory(0.02)
    mem.extend(np.random.default_rng(3).normal(size=(300, 4)))
    assert mem.ingest_path == "libsvm+exact"
    return mem, mem.solver_state


@pytest.mark.parametrize("bad", [-1, "hi"])
def test_the_column_keys_refuse_a_slot_that_is_not_live(bad):
    mem, ss = _fitted()
    mem.add(np.zeros(4))  # (the slot table grows past hi)
    assert ss.hi < ss.X.shape[0]
    slots = ss.slot_of_col[: ss.nS].copy()
    slots[-1] = ss.hi if bad == "hi" else bad
    keys, kc, digest = ss.XC.copy(), ss.KC.copy(), mem.state_digest()
    with pytest.raises(IndexError):
        cache.index_columns(ss, slots)
    assert np.array_equal(ss.XC, keys) and np.array_equal(ss.KC, kc)  # nothing written
    assert mem.state_digest() == digest


@pytest.mark.parametrize("bad", [-1, "hi"])
def test_the_keys_handed_to_libsvm_refuse_a_slot_that_is_not_live(monkeypatch, bad):
    _, ss = _fitted()
    live = ss.ordered_slots()
    live[3] = ss.hi if bad == "hi" else bad
    called = []
    monkeypatch.setattr(solver, "libsvm_solve", lambda *a, **k: called.append(1) or (
        None, batch.KernelColumns(np.zeros((0, ss.X.shape[1])), 1.0, capacity=1)))
    with pytest.raises(IndexError):
        solver.solve_by_columns(ss, live)
    assert not called


def test_take_rows_takes_in_range_rows_exactly():
    src = np.arange(20.0).reshape(10, 2)
    out = np.full((3, 2), np.nan)
    cache.take_rows(src, np.array([9, 0, 4]), out)
    assert np.array_equal(out, src[[9, 0, 4]])
    cache.take_rows(src, np.array([], dtype=np.int64), out[:0])
    with pytest.raises(IndexError):
        cache.take_rows(src, np.array([10]), out[:1])
