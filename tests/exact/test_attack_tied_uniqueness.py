"""Attacks on the uniqueness test with tokens tied at ``g = 0``
(``solver.unique_optimum`` → ``Backend.tied_positive_definite``; the compiled backend's
kept-factor append, ``backends/compiled/tied.py``): what it leaves in freed memory, the
Gram buffer it reads, and the kernel signatures its callers reach.
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled, reference
from svattn.exact.core.kktsets import ERROR, RESERVE
from svattn.exact.operations import solver

sys.path.insert(0, os.path.dirname(__file__))
from test_residue import _copies_in_process_memory  # noqa: E402

_PROC = pytest.mark.skipif(not os.access("/proc/self/mem", os.R_OK),
                           reason="needs Linux's /proc/self/mem to read the process's memory")


def _tied_beside(backend: str, seed: int) -> tuple[SVDDMemory, np.ndarray, int, int]:
    """A memory with a near-copy (1e-9) of a margin token added, the row it was added
    from, its id, and another margin token to forget (the near-copy then sits tied)."""
    rng = np.random.default_rng(seed)
    mem = SVDDMemory(0.05, backend=backend)
    mem.extend(rng.normal(size=(200, 3)))
    ss = mem.solver_state
    m0 = int(ss.margin_slots()[0])
    row = ss.X[m0] + 1e-9
    tw = mem.add(row)
    twin = ss.id_to_slot[tw]
    victim = next(int(ss.slot_id[s]) for s in ss.margin_slots() if s not in (twin, m0))
    return mem, row, tw, victim


@_PROC
@pytest.mark.parametrize("kept_from", [4, 10**6], ids=["kept-factor", "general"])
def test_a_tied_tokens_key_leaves_no_copy_in_freed_memory(monkeypatch, kept_from):
    # the test gathered the keys of the margin set and the tied tokens (ss.X[T]) for the
    # copy test (has_equal_rows: its sort's copy too) and the general test, and the tied
    # tokens' keys again for the kept factor's append (ss.X[tied]), each freed unzeroed:
    # after the tied token's own removal its key was still in freed memory (3 or 4
    # copies), against "nothing erased survives"
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", kept_from)
    mem, row, tw, victim = _tied_beside("compiled", 5)
    ss = mem.solver_state
    needle = row.tobytes()
    calls = []
    test = compiled.tied_positive_definite

    def spy(ss_, tied):
        calls.append(len(tied))
        return test(ss_, tied)

    monkeypatch.setattr(compiled, "tied_positive_definite", spy)
    cert = mem.remove(victim)
    assert calls and cert.unique_optimum is False  # the tied path ran (a near-copy: singular)
    assert ss.state[ss.id_to_slot[tw]] in (ERROR, RESERVE)
    mem.remove(tw)
    gc.collect()
    row.fill(0)
    assert _copies_in_process_memory(needle) == 0


@_PROC
@pytest.mark.parametrize("call", ["reference", "compiled", "compiled general",
                                  "has_equal_rows"])
def test_the_tied_tests_copy_no_key_into_freed_memory(monkeypatch, call):
    # each test alone between two reads of the heap (the reference backend's removal
    # leaves a copy of its own elsewhere: not this test's)
    from svattn.exact.core.kernels import has_equal_rows

    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem, row, tw, victim = _tied_beside("compiled", 6)
    ss = mem.solver_state
    twin = ss.id_to_slot[tw]
    tied = np.array([twin])
    # (a strided view of a copy of the keys, made before the first read: the contiguous
    # copy has_equal_rows makes of it is zeroed too)
    strided = ss.X[np.concatenate([ss.margin_slots(), tied])][::-1]
    runs = {
        "reference": lambda: reference.tied_positive_definite(ss, tied),
        "compiled": lambda: compiled.tied_positive_definite(ss, tied),
        "compiled general": lambda: compiled.tied_test.general_test(
            ss, tied, compiled.positive_definite),
        "has_equal_rows": lambda: has_equal_rows(strided),
    }
    needle = row.tobytes()
    row.fill(0)
    gc.collect()
    before = _copies_in_process_memory(needle)
    assert before >= 1  # the stored key: the scan is not vacuous
    runs[call]()
    gc.collect()
    assert _copies_in_process_memory(needle) == before
    strided.base.fill(0)
