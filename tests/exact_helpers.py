"""Shared helpers for the exact-core tests."""

from __future__ import annotations

import numpy as np

from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import gram_matrix

HUGE = 10**400  # a JSON int no float holds


def gram(mem: SVDDMemory, keys: np.ndarray | None = None) -> np.ndarray:
    """The Gram matrix of the memory's keys (or of ``keys``) with exact diagonal."""
    return gram_matrix(mem.keys if keys is None else keys, mem.kernel, mem.gamma_value)


def retrain(mem: SVDDMemory) -> tuple[np.ndarray, float]:
    """alpha and mu of a from-scratch solve (the independent oracle) on the memory's keys."""
    from svattn.exact.oracle import solve_svdd

    return solve_svdd(gram(mem), mem.C, return_mu=True)


def partition_ids(mem: SVDDMemory, alpha: np.ndarray) -> dict[str, list[int]]:
    """Partition (as ids) read off a coefficient vector aligned with ``mem.ids``."""
    from svattn.exact.oracle import partition

    ids = mem.ids
    return {k: sorted(ids[i] for i in v) for k, v in partition(alpha, mem.C).items()}


def snapshot(mem: SVDDMemory) -> tuple:
    """Everything observable about a memory, for "state unchanged" checks."""
    if len(mem) == 0:
        return (0, mem.solver_state.next_id)
    return (
        len(mem),
        tuple(mem.ids),
        mem.alpha.tobytes(),
        mem.keys.tobytes(),
        mem.values.tobytes(),
        mem.mu,
        mem.state_digest(),
        tuple(tuple(v) for v in mem.partition().values()),
        mem.solver_state.next_id,
    )


def backend_of(mem: SVDDMemory):
    """The backend module a memory runs (:mod:`svattn.exact.backends.compiled` or
    ``.reference``)."""
    from svattn.exact.memory import BACKENDS

    return BACKENDS[mem.backend]


def check_scratch_between_operations(ss) -> bool:
    """The solver's scratch between operations (``svattn.exact.core.gram``): the Gram copy
    holds, when kept, exactly the current margin block as a gather reads it and zeros
    everywhere else (a removed or departed token's kernel values included); else it is
    all zeros. The removal's work copy of the bordered inverse likewise holds the
    current inverse or nothing, and the spare (``qspare``) zeros. Returns whether the Gram
    copy is kept."""
    from svattn.exact.backends.compiled import linalg

    q = ss.qwork.copy()
    if ss.qwork_for is not None:
        m = ss.qwork_n
        assert ss.qwork_for is ss.Qinv and m == ss.nS + 1
        np.testing.assert_array_equal(q[:m, :m], ss.Qinv)
        q[:m, :m] = 0.0
    assert not q.any()
    # a replaced inverse's memory kept for the next removal's: zeros, not the inverse's
    assert not ss.qspare.any() and not np.shares_memory(ss.qspare, ss.Qinv)
    if ss.kss_for is None:
        assert not ss.kss.any()
        return False
    nS = ss.nS
    assert ss.kss_for is ss.Qinv and nS and ss.kss_ext == nS
    np.testing.assert_array_equal(ss.kss[:nS, :nS],
                                  linalg.gather_margin_gram(ss.KC, ss.slot_of_col, nS))
    rest = ss.kss.copy()
    rest[:nS, :nS] = 0.0
    assert not rest.any()
    return True
