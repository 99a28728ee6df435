"""A block fit (libsvm warm start, exact finish) leaves no copy of a support key behind.

The copy that outlived a forgotten support token was not libsvm's: ``np.take(..., out=)``
in its default ``mode="raise"`` fills a buffered copy of ``out`` and then copies it over,
freeing the buffer unzeroed. The block fit took the column keys (``core.cache.
index_columns``: every margin key) and the keys it hands libsvm (``solver.
solve_by_columns``: every live key) that way; both now take through ``core.cache.
take_rows`` (``mode="clip"``, which writes straight into ``out``, after a range check).
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from heap_helpers import copies_in_process_memory, needs_proc_mem
from svattn.exact import SVDDMemory
from svattn.exact.core import cache
from svattn.exact.memory import BACKENDS
from svattn.exact.operations import batch, solver


@needs_proc_mem
@pytest.mark.parametrize(("n", "d", "first", "resolve"), [
    (128, 5, 0, False), (150, 4, 0, False), (200, 5, 0, False), (300, 3, 0, False),
    (600, 3, 40, False),  # a block onto held rows
    (800, 3, 0, True),  # then the re-solve by columns (solver.resolve_by_columns)
])
def test_a_forgotten_support_token_of_a_block_fit_leaves_no_copy_in_freed_memory(
        monkeypatch, n, d, first, resolve):
    # libsvm's support is the margin and the error tokens; each is forgotten, the
    # caller's copy zeroed, and the process's heap (live and freed blocks) read for its
    # key right after the forget. Before the fix every margin key had one copy left
    # (the buffer of index_columns' take) and with a second block every key one more
    # (solve_by_columns'): at these sizes the buffers are small enough for the
    # allocator to keep them aside untouched (tcache), where larger ones were mostly
    # written over by later allocations (the reason the scan alone cannot pin it: the
    # test below does)
    rng = np.random.default_rng([n, d, first + 7 * resolve])
    X = rng.normal(size=(n, d))
    mem = SVDDMemory(0.02)
    if first:  # a memory of `first` tokens, then a block into it (ingest's second batch)
        mem.extend(X[:first])
    mem.extend(X[first:])
    assert resolve or mem.ingest_path == "libsvm+exact"
    if resolve:  # (whichever path the fit took)
        by_columns = []
        real = solver.resolve_by_columns
        monkeypatch.setattr(solver, "resolve_by_columns",
                            lambda *a: by_columns.append(1) or real(*a))
        solver.resolve(mem.solver_state, BACKENDS[mem.backend])
        assert by_columns
    part = mem.partition()
    victims = part["margin"][:4] + part["error"][:2]
    assert len(victims) == 6
    needles = [X[t].tobytes() for t in victims]
    for t in victims:
        X[t] = 0.0  # the caller's own copy goes
    assert all(copies_in_process_memory(nd) >= 1 for nd in needles)  # the stored key
    left = {}
    for t, nd in zip(victims, needles, strict=True):  # read right after its forget
        mem.remove(t)
        gc.collect()
        left[t] = copies_in_process_memory(nd)
    assert not any(left.values()), f"copies of forgotten keys in the process: {left}"


def _peak_bytes(f) -> int:
    """The most bytes numpy (and Python) held at once during ``f()``, beyond before."""
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _fitted_state():
    mem = SVDDMemory(0.02)
    mem.extend(np.random.default_rng(0).normal(size=(600, 32)))
    assert mem.ingest_path == "libsvm+exact"
    return mem, mem.solver_state


# the heap scan above depends on where the allocator puts what; these do not: the two
# copies of keys a block fit makes allocate no key-sized buffer of their own


def test_the_column_keys_are_taken_without_a_temporary():
    mem, ss = _fitted_state()
    margin, chi = ss.slot_of_col[: ss.nS].copy(), ss.chi
    keys = ss.XC[: ss.nS].copy()
    assert keys.nbytes > 4096
    ss.XC[: ss.nS] = 0.0
    peak = _peak_bytes(lambda: cache.index_columns(ss, margin))
    ss.chi = chi
    assert np.array_equal(ss.XC[: ss.nS], keys)
    assert peak < keys.nbytes // 2, peak  # (its index arrays: ~60 bytes a key, a key 256)


def test_the_keys_handed_to_libsvm_are_taken_without_a_temporary(monkeypatch):
    mem, ss = _fitted_state()
    live = ss.ordered_slots()
    want = ss.X[live]
    got = []

    def solve(X, *_, **__):
        got.append(bool((X == want).all()))
        return None, batch.KernelColumns(X[:0], 1.0, capacity=1)

    monkeypatch.setattr(solver, "libsvm_solve", solve)
    peak = _peak_bytes(lambda: solver.solve_by_columns(ss, live))
    assert got == [True]
    assert peak < 1.5 * want.nbytes, peak  # the one copy it hands libsvm (scrubbed)
