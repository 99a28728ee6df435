"""No residue on the reference backend's removal path (and the compiled one's alike):
after a token's removal, no copy of its key stays in the process's memory, freed blocks
included, whatever the removal went through (drive events, contraction, polish, finish,
re-solve); the temporaries that held keys or kernel values are zeroed before they are
freed (``scrub``), exceptions included.

The scan is :func:`heap_helpers.copies_in_process_memory` (``/proc/self/mem``). The
memories here are fitted row by row (the incremental path), and as one block (libsvm's
warm start and the exact finish) where the removed token was in the fit
(``tests/exact/test_block_fit_residue.py``: what that path left before).
"""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

from heap_helpers import copies_in_process_memory, needs_proc_mem
from svattn.exact import SVDDMemory
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.core.state import NeedResolve
from svattn.exact.memory import BACKENDS
from svattn.exact.operations import ingest, rollback, solver

sys.path.insert(0, os.path.dirname(__file__))
from test_residue import _spy_on_scrub  # noqa: E402

from tied_helpers import add_tied_near_copy  # noqa: E402

BOTH = pytest.mark.parametrize("backend", ["reference", "compiled"])


def _fitted(monkeypatch, backend: str, seed: int, kernel: str = "rbf", *,
            batch: bool = False) -> SVDDMemory:
    """200 rows added one by one (``batch``: as one block); the caller's copy of them
    zeroed."""
    if not batch:
        monkeypatch.setattr(ingest, "FIRST_BATCH_MIN_ROWS", 1 << 60)
    # keys no other case draws: a scan counts every copy in the process, the previous
    # case's needle (a bytes object freed unzeroed) and dropped memories' keys too
    rng = np.random.default_rng([7031, seed, backend == "compiled", kernel == "exp"])
    X = rng.normal(size=(200, 3)) * (0.3 if kernel == "exp" else 1.0)
    mem = SVDDMemory(0.05, kernel, backend=backend)
    mem.extend(X)
    X.fill(0.0)
    return mem


def _remove_and_scan(mem: SVDDMemory, tid: int, row: np.ndarray) -> int:
    """Remove ``tid`` (key ``row``, zeroed after) and count its key's copies left."""
    needle = row.tobytes()
    gc.collect()
    assert copies_in_process_memory(needle) >= 2  # the stored key and `row`: not vacuous
    mem.remove(tid)
    gc.collect()
    row.fill(0.0)
    return copies_in_process_memory(needle)


@needs_proc_mem
@BOTH
@pytest.mark.parametrize("which", ["margin", "error", "reserve"])
@pytest.mark.parametrize(("kernel", "fit"), [("rbf", "rows"), ("exp", "rows"),
                                             ("rbf", "block")])  # (the block path: rbf's)
def test_a_removed_tokens_key_leaves_no_copy(monkeypatch, backend, which, kernel, fit):
    mem = _fitted(monkeypatch, backend, 11 + ["margin", "error", "reserve"].index(which)
                  + 100 * (fit == "block"), kernel, batch=fit == "block")
    ss = mem.solver_state
    part = mem.partition()
    assert len(part[which]) >= 3
    # others first (contractions, column swaps, polish), then a token of the set
    mem.remove(part["margin"][0])
    if which != "margin":
        mem.remove(mem.partition()[which][-1])
    tid = mem.partition()[which][0]
    slot = ss.id_to_slot[tid]
    assert ss.state[slot] == {"margin": MARGIN, "error": ERROR, "reserve": RESERVE}[which]
    assert _remove_and_scan(mem, tid, ss.X[slot].copy()) == 0


@needs_proc_mem
@pytest.mark.parametrize(("backend", "seed"), [  # (seeds where the near-copy ends tied)
    *(("reference", s) for s in (2, 3, 6, 7, 8, 9)),
    *(("compiled", s) for s in (5, 7, 8, 10, 12, 13))])
def test_a_tied_near_copys_key_leaves_no_copy(monkeypatch, backend, seed):
    # the attacker's scenario: a near-copy (1e-9) of a margin token sits tied beside it
    # (a reserve token holding a standby column); another margin token is forgotten
    # (the tie test runs), then the near-copy. The reference contraction swapped the
    # near-copy's cache column by a fancy-indexed copy (``XC[[q, p]]``, core.cache.
    # swap_cols) freed unzeroed: 1 copy of its key stayed in freed memory. (Fitted as
    # one block, as the attacker's memory was: the near-copy is added after the fit.)
    mem = _fitted(monkeypatch, backend, seed, batch=True)
    ss = mem.solver_state
    row, tw, victim = add_tied_near_copy(mem)
    mem.remove(victim)
    assert ss.state[ss.id_to_slot[tw]] in (ERROR, RESERVE)
    assert _remove_and_scan(mem, tw, row) == 0


@needs_proc_mem
@BOTH
def test_a_driven_in_tokens_key_leaves_no_copy(monkeypatch, backend):
    # a row added far outside (the drive takes it in, its column allocated), a margin
    # token removed (columns move), then the row
    mem = _fitted(monkeypatch, backend, 12)
    row = np.random.default_rng([7031, 99, backend == "compiled"]).normal(size=3) * 3.0
    tid = mem.add(row)
    mem.remove(mem.partition()["margin"][1])
    assert _remove_and_scan(mem, tid, row) == 0


@needs_proc_mem
@BOTH
def test_a_removal_that_falls_back_to_a_resolve_leaves_no_copy(monkeypatch, backend):
    # the removal's drive gives up (NeedResolve): the Gram re-solve of the live set,
    # after a re-solve with the token still live (its key in the Gram's copy of keys)
    mem = _fitted(monkeypatch, backend, 13)
    ss = mem.solver_state
    be = BACKENDS[mem.backend]
    solver.resolve(ss, be)
    real = be.drive
    ss.max_segments = 0  # (the compiled removal hands the whole drive to the event loop)

    def drive(ss_, c, direction, seed=None):
        if direction < 0:
            raise NeedResolve
        return real(ss_, c, direction, seed)

    monkeypatch.setattr(be, "drive", drive)
    tid = mem.partition()["margin"][1]
    resolves = ss.n_resolves
    assert _remove_and_scan(mem, tid, ss.X[ss.id_to_slot[tid]].copy()) == 0
    assert ss.n_resolves == resolves + 1


def test_the_gram_resolve_scrubs_its_copy_of_the_keys_and_the_gram(monkeypatch):
    # resolve_by_gram gathered ss.X[live] (every live key) for the Gram matrix and
    # freed it, and K, unzeroed; a token removed later stayed in them
    mem = _fitted(monkeypatch, "reference", 14)
    ss = mem.solver_state
    seen = []
    real = solver.gram_matrix

    def spy(x, kernel, gamma):
        K = real(x, kernel, gamma)
        seen.append((x, K))
        return K

    monkeypatch.setattr(solver, "gram_matrix", spy)
    solver.resolve_by_gram(ss, BACKENDS[mem.backend])
    ((keys, K),) = seen
    assert keys.shape == (ss.n, 3) and not keys.any() and not K.any()


def test_the_gram_resolve_scrubs_on_an_exception(monkeypatch):
    mem = _fitted(monkeypatch, "reference", 15)
    seen = []
    real = solver.gram_matrix

    def spy(x, kernel, gamma):
        seen.append((x, K := real(x, kernel, gamma)))
        return K

    def fail(*a, **k):
        raise MemoryError("injected")

    monkeypatch.setattr(solver, "gram_matrix", spy)
    monkeypatch.setattr(solver, "batch_solve", fail)
    with pytest.raises(MemoryError):
        solver.resolve_by_gram(mem.solver_state, BACKENDS[mem.backend])
    ((keys, K),) = seen
    assert keys.any() is np.False_ and not K.any()


def test_a_restores_cache_rebuild_scrubs_its_copies_of_keys_and_kernel_values(monkeypatch):
    # a failed operation's restore recomputes KC and XC from the keys: the gathered keys
    # (ss.X[owners], ss.X[live]) and the kernel block were freed unzeroed
    mem = _fitted(monkeypatch, "reference", 16)
    seen = []
    real = rollback.kernel_matrix

    def spy(x, y, kernel, gamma):
        out = real(x, y, kernel, gamma)
        seen.append((x, y, out))
        return out

    monkeypatch.setattr(rollback, "kernel_matrix", spy)

    def fail(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(solver, "finish_op", fail)
    before = mem.state_digest()
    with pytest.raises(Exception, match="injected"):
        mem.remove(mem.partition()["margin"][1])
    assert mem.state_digest() == before
    assert seen and all(not a.any() for t in seen for a in t)


@pytest.mark.parametrize("where", ["solve_margin", "refactorize"])
def test_the_margin_blocks_gathered_from_the_cache_are_scrubbed(monkeypatch, where):
    # the polish's solve (reference.solve_margin) and the refactorization
    # (core.cache.refactorize) gather K_SS (and the error rows) from the cache
    from svattn.exact.backends import reference
    from svattn.exact.core import cache

    mem = _fitted(monkeypatch, "reference", 17)
    ss = mem.solver_state
    KSS = ss.KC[ss.slot_of_col[: ss.nS], : ss.nS].copy()
    scrubbed = _spy_on_scrub(monkeypatch, reference if where == "solve_margin" else cache)
    if where == "solve_margin":
        reference.solve_margin(ss)
    else:
        cache.refactorize(ss)
    assert any(a.shape == KSS.shape and np.array_equal(a, KSS) for a in scrubbed)


@needs_proc_mem
@BOTH
@pytest.mark.parametrize("query", ["readout", "decision_function"])
@pytest.mark.parametrize("values", [False, True], ids=["keys", "keys+values"])
def test_reading_the_memory_then_removing_a_token_leaves_no_copy(monkeypatch, backend, query,
                                                                 values):
    # a readout gathered the support's keys and values (ss.X[slots], ss.V[slots]) and
    # copied them again (keys[keep], values[keep]), the decision function likewise, all
    # freed unzeroed: after a read, a support token's later removal left 2-3 copies of
    # its key in freed memory (and of its value)
    monkeypatch.setattr(ingest, "FIRST_BATCH_MIN_ROWS", 1 << 60)
    rng = np.random.default_rng([7031, 18, backend == "compiled", len(query), values])
    X = rng.normal(size=(200, 3))
    V = rng.normal(size=(200, 2)) if values else None
    mem = SVDDMemory(0.05, backend=backend)
    mem.extend(X, V)
    tid = mem.partition()["margin"][1]
    row = X[tid].copy()
    value = V[tid].copy() if values else None
    X.fill(0.0)
    if values:
        V.fill(0.0)
    q = rng.normal(size=(40, 3))  # (past the 32 columns where distances go transposed)
    for _ in range(2):
        getattr(mem, query)(q)
    vneedle = None if value is None else value.tobytes()
    if vneedle is not None:
        value.fill(0.0)
    assert _remove_and_scan(mem, tid, row) == 0
    if vneedle is not None:
        gc.collect()
        assert copies_in_process_memory(vneedle) == 0
