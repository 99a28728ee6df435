"""Adding rows: one by one through the solver, or a large block in one batch solve.

:func:`add_rows` is the memory's only way in for new rows. Rows that land inside the
description are stored as reserve tokens, a run of them in one backend call
(``reserve_block``); a row outside is driven in by the backend's event loop
(:func:`svattn.exact.operations.solver.add_one`). With the rbf kernel a block much larger than the
memory is solved in batch instead (:func:`add_block`): libsvm's solution warm-starts an
exact float64 finish (:func:`svattn.exact.operations.batch.libsvm_solve`), and the memory takes
that optimum with the bordered inverse the finish built (:func:`install_solution`).
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.protocol import Backend
from svattn.exact.core.kernels import kernel_diag
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.core.outcome import AddOutcome
from svattn.exact.core.state import NeedResolve, SlotState, scrub
from svattn.exact.operations.batch import BatchSolution, KernelColumns, libsvm_solve
from svattn.exact.operations.solver import (
    add_one,
    drop_solution,
    general_row,
    next_slots,
    polish,
    record_rows,
    resolve,
    settle_solution,
    store,
)

__all__ = ["BATCH_MIN_ROWS", "add_block", "add_rows", "batch_eligible", "install_solution",
           "write_columns"]


def add_rows(ss: SlotState, be: Backend, k: np.ndarray, v: np.ndarray | None) -> AddOutcome:
    """Add validated rows in order, exactly as one add each; return their ids and the
    path that solved them (:class:`~svattn.exact.core.outcome.AddOutcome`)."""
    if ss.dim is None:
        ss.dim = k.shape[1]
        ss.value_is_key = v is None
        ss.vdim = k.shape[1] if v is None else v.shape[1]
        ss.alloc(0, ss.dim, 0 if v is None else ss.vdim)
    if batch_eligible(ss, k.shape[0]):
        ids = add_block(ss, be, k, v)
        if ids is not None:
            return AddOutcome(ids, "libsvm+exact")
    diag = kernel_diag(k, ss.kernel, ss.gamma_value)
    out: list[int] = []
    r, m = 0, k.shape[0]
    while r < m:
        if ss.n + 1 <= ss.warmup_n:  # warm-up and the threshold solve
            out.append(add_one(ss, be, k[r], None if v is None else v[r], float(diag[r])))
            r += 1
            continue
        # Every row before the first one outside the description joins the reserve
        # set and changes nothing but its own slot: the backend stores them one after
        # another in one call, each scored against the same solution (the same as
        # adding them one by one); the first outside row is then driven in on its
        # own, with the kernel row and g it was scored by.
        # as many rows as fit the slot table (it grows, doubling, when none does)
        slots = next_slots(ss, min(m - r, len(ss.free_slots) + ss.cap - ss.hi) or 1)
        tids = np.arange(ss.next_id, ss.next_id + len(slots), dtype=np.int64)
        vs = None if v is None else v[r:r + len(slots)]
        stored, status, row, g_c, kxx = be.reserve_block(ss, k[r:r + len(slots)], vs, slots,
                                                          tids)
        if stored:
            out += record_rows(ss, k[r:r + stored], None if vs is None else vs[:stored],
                               slots[:stored])
            r += stored
        if status == "outside":  # stored with the k(x, x) its g was scored with
            try:
                out.append(add_one(ss, be, k[r], None if v is None else v[r], kxx,
                                   row=row, g_c=g_c))
            finally:
                scrub(row)
            r += 1
        elif status == "overflow":  # the general scoring raises the kernel's error
            out += general_row(ss, be, k[r:r + 1], None if v is None else v[r:r + 1],
                                diag[r:r + 1])
            r += 1
    return AddOutcome(out)


# A block of at least this many rows, and at least twice the rows held, is solved in batch
# (rbf: :func:`add_block`); smaller ones are added one by one. Tests lower it.
BATCH_MIN_ROWS = 512


def batch_eligible(ss: SlotState, m: int) -> bool:
    """Whether :func:`add_rows` takes the batch path for a block of ``m`` rows: the rbf
    kernel, a block much larger than the memory, and the problem feasible after it."""
    return (ss.is_rbf and m >= BATCH_MIN_ROWS and m >= 2 * ss.n
            and ss.n + m >= ss.warmup_n)


def add_block(ss: SlotState, be: Backend, k: np.ndarray, v: np.ndarray | None
              ) -> list[int] | None:
    """Add a large block of validated rows by one batch solve of every token (rbf).

    libsvm (:func:`svattn.exact.operations.batch.libsvm_solve`) warm-starts an exact float64
    active-set finish on kernel columns of the support; the memory then takes that
    optimum with the bordered inverse the finish built (:func:`install_solution`).
    The result is the optimum the rows added one by one reach (the same partition,
    alpha to rounding; ``tests/exact/test_bulk.py``). Returns the new ids, or None
    with the state untouched when the finish cannot certify a unique optimum
    (copies in the support, a cycle): the caller then adds the rows one by one.
    """
    live_old = ss.ordered_slots()
    X = np.empty((len(live_old) + k.shape[0], k.shape[1]))  # scrubbed below
    np.take(ss.X, live_old, axis=0, out=X[: len(live_old)])  # (no temporary key copy)
    X[len(live_old):] = k
    try:
        sol, cols = libsvm_solve(X, ss.C, ss.gamma_value, tol=0.01 * ss.tol)
    finally:
        scrub(X)
    try:
        if sol is None:
            return None
        drop_solution(ss)  # every column freed: the solution is rebuilt from the rows
        m = k.shape[0]
        ids = store(ss, k, v, kernel_diag(k, ss.kernel, ss.gamma_value), np.zeros((m, 0)),
                    np.zeros(m))
        try:
            install_solution(ss, be, ss.ordered_slots(), sol, cols)
        except NeedResolve:  # the polish met a degeneracy: the memory's own batch solve
            resolve(ss, be)
    finally:
        cols.scrub()
    ss.standby_stale = True
    return ids


def install_solution(ss: SlotState, be: Backend, live: np.ndarray, sol: BatchSolution,
                     cols: KernelColumns | None = None) -> None:
    """Make ``sol`` (alpha over ``live``, in that order) the memory's solution: columns
    for the margin tokens first (in ``sol.margin``'s order, the rows of ``sol.Qinv``)
    and the error tokens — copied from ``cols`` (the finish's kernel columns over
    ``live``) when given, else computed —, mu, the bordered inverse (``sol.Qinv`` when
    it is the one on this margin set, else refactorized), an exact g, and a polish
    when its KKT residual is above ``0.1·tol``. The support must hold no copies."""
    drop_solution(ss)
    alpha = sol.alpha
    ss.alpha[: ss.hi] = 0.0
    ss.alpha[live] = alpha
    ss.state[live] = RESERVE
    margin = np.flatnonzero((alpha > 0) & (alpha < ss.C))
    if sol.Qinv is not None and np.array_equal(np.sort(sol.margin), margin):
        margin = np.asarray(sol.margin)  # the order of the inverse's rows
    error = np.flatnonzero(alpha >= ss.C)
    ss.state[live[margin]] = MARGIN
    ss.state[live[error]] = ERROR
    order = np.concatenate([margin, error])  # margin first: they fill columns [0, nS)
    need = len(order) + ss.standby
    adopted = cols is not None and ss.chi == 0 and adopt_columns(ss, live, live[order], cols,
                                                                  order)
    if not adopted:  # (adopted: the finish's buffer is the cache now, its columns in place)
        if ss.ccap < need:  # one allocation, not a doubling per column
            ss.grow_cols(need + need // 4)
        if cols is not None and ss.chi == 0:
            write_columns(ss, live, live[order], cols.rows, cols.pos[order])
        else:
            for s in live[order]:
                be.alloc_col(ss, int(s))
    ss.nS = len(margin)
    same = sol.Qinv is not None and np.array_equal(margin, sol.margin)
    settle_solution(ss, be, sol.mu, sol.Qinv if same else None)
    ss.ops_since_exact_g = 0
    if ss.nS and be.kkt(ss, ss.g[: ss.hi]) > 0.1 * ss.tol:
        polish(ss, be)
        if be.kkt(ss, ss.g[: ss.hi]) > 0.1 * ss.tol:
            raise NeedResolve


def adopt_columns(ss: SlotState, live: np.ndarray, slots: np.ndarray, cols: KernelColumns,
                   order: np.ndarray) -> bool:
    """Make the finish's kernel columns the memory's (empty) cache where their buffer
    has its shape: every slot live in order (``live`` is ``0..hi-1``, the slot table
    no wider) and room for the columns needed. Its rows (``cols.rows[pos[j]] =
    K[:, slots[j]]``, C order: the Fortran-ordered cache transposed) are permuted in
    place into ``slots``' order and the rest zeroed; ``cols`` then holds none. A
    fit then keeps one n×|S| array, not two, and copies none (a second array's first
    writes were ~20 % of a 4k fit). The values are :func:`write_columns`' exactly.
    Returns False, changing nothing, where the shapes do not allow it."""
    na, hi = len(slots), ss.hi
    rows = cols.rows
    if (rows.shape != (rows.shape[0], ss.cap) or ss.cap != hi or len(live) != hi
            or not np.array_equal(live, np.arange(hi))
            or rows.shape[0] < na + ss.standby or not rows.flags.c_contiguous):
        return False
    permute_rows(rows, cols.pos[order], cols.m)
    cols.release()
    ss.adopt_cols(rows.T)
    write_columns(ss, live, slots, None, None)
    return True


def permute_rows(rows: np.ndarray, pos: np.ndarray, m: int) -> None:
    """``rows[j] <- rows[pos[j]]`` for ``j < len(pos)`` (distinct positions below
    ``m``) in place, one row of scratch (scrubbed); rows ``len(pos)..m-1`` zeroed."""
    na = len(pos)
    src = np.empty(m, dtype=np.int64)  # target j takes the row at src[j]
    src[:na] = pos
    taken = np.zeros(m, dtype=bool)
    taken[pos] = True
    src[na:] = np.flatnonzero(~taken)
    done = src == np.arange(m)
    tmp = np.empty(rows.shape[1])
    try:
        for start in np.flatnonzero(~done).tolist():
            if done[start]:
                continue
            tmp[:] = rows[start]
            j = start
            while True:  # one cycle of the permutation
                done[j] = True
                s = int(src[j])
                if s == start:
                    rows[j] = tmp
                    break
                rows[j] = rows[s]
                j = s
    finally:
        tmp.fill(0.0)
    rows[na:m] = 0.0


def write_columns(ss: SlotState, live: np.ndarray, slots: np.ndarray, rows: np.ndarray,
                  pos: np.ndarray) -> None:
    """Fill the empty kernel cache (``chi = 0``) with the columns of ``slots``, in order,
    from ``rows`` (``rows[pos[j], i] = k(x_live[i], x_slots[j])``): what
    :func:`svattn.exact.backends.reference.alloc_col` computes for each, written at once (one
    column at a time: no temporary copy of the block)."""
    na, hi = len(slots), ss.hi
    KC = ss.KC
    dense = len(live) == hi and np.array_equal(live, np.arange(hi))
    if rows is not None:  # (None: the columns are in place, :func:`adopt_columns`)
        if not dense:
            KC[:hi, :na] = 0.0
        for j in range(na):
            if dense:
                KC[:hi, j] = rows[pos[j]]
            else:
                KC[live, j] = rows[pos[j]]
    KC[slots, np.arange(na)] = ss.diag[slots]
    np.take(ss.X, slots, axis=0, out=ss.XC[:na])  # (no temporary key copy)
    ss.slot_of_col[:na] = slots
    ss.col_of_slot[slots] = np.arange(na)
    ss.ac[:na] = ss.alpha[slots]
    ss.chi = na
