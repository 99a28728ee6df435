"""Adding rows: one by one through the solver, or a large block in one batch solve.

:func:`add_rows` is the memory's only way in for new rows. Rows that land inside the
description are stored as reserve tokens, a run of them in one backend call
(``reserve_block``); a row outside is driven in by the backend's event loop
(:func:`svattn.exact.operations.solver.add_one`). With the rbf kernel a block much larger than the
memory is solved in batch instead (:func:`add_block`): libsvm's solution warm-starts an
exact float64 finish (:func:`svattn.exact.operations.batch.libsvm_solve`), and the memory takes
that optimum with the bordered inverse the finish built
(:func:`svattn.exact.operations.solver.install_solution`).
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.protocol import Backend
from svattn.exact.core.kernels import kernel_diag
from svattn.exact.core.outcome import AddOutcome
from svattn.exact.core.state import NeedResolve, SlotState, scrub
from svattn.exact.operations.solver import (
    add_one,
    drop_solution,
    general_row,
    install_solution,
    next_slots,
    record_rows,
    resolve,
    solve_by_columns,
    store,
)

__all__ = ["BATCH_MIN_ROWS", "FIRST_BATCH_MIN_ROWS", "add_block", "add_rows", "batch_eligible"]


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
            # the next rows are scored against the state an add leaves (no error columns,
            # the error sum synced): what repeated adds score them against, bit for bit
            be.settle_error_columns(ss)
        elif status == "overflow":  # the general scoring raises the kernel's error
            out += general_row(ss, be, k[r:r + 1], None if v is None else v[r:r + 1],
                                diag[r:r + 1])
            r += 1
            be.settle_error_columns(ss)
    return AddOutcome(out)


# A block of at least this many rows, and at least twice the rows held, is solved in batch
# (rbf: :func:`add_block`); smaller ones are added one by one, so that below it an
# ``extend`` onto held rows equals repeated ``add`` bit for bit. Tests lower it.
BATCH_MIN_ROWS = 512
# An empty memory's first block (a fit) is solved in batch from this many rows: it has no
# earlier state for one-by-one adds to match, and on small data the batch solve is 2-4x
# faster than the adds (``benchmarks/bench_small_data.py``). Tests raise it.
FIRST_BATCH_MIN_ROWS = 64


def batch_eligible(ss: SlotState, m: int) -> bool:
    """Whether :func:`add_rows` takes the batch path for a block of ``m`` rows: the rbf
    kernel, a block much larger than the memory (from :data:`FIRST_BATCH_MIN_ROWS` rows
    into an empty memory, else :data:`BATCH_MIN_ROWS`), and the problem feasible after
    it."""
    least = FIRST_BATCH_MIN_ROWS if ss.n == 0 else BATCH_MIN_ROWS
    return (ss.is_rbf and m >= least and m >= 2 * ss.n
            and ss.n + m >= ss.warmup_n)


def add_block(ss: SlotState, be: Backend, k: np.ndarray, v: np.ndarray | None
              ) -> list[int] | None:
    """Add a large block of validated rows by one batch solve of every token (rbf).

    libsvm (:func:`svattn.exact.operations.batch.libsvm_solve`) warm-starts an exact float64
    active-set finish on kernel columns of the support; the memory then takes that
    optimum with the bordered inverse the finish built (:func:`install_solution`).
    The result is the optimum the rows added one by one reach (the same partition,
    alpha to rounding; ``tests/exact/test_bulk.py``). Returns the new ids, or None
    with the state untouched when the finish cannot certify its optimum (a cycle;
    copies it merges, :func:`svattn.exact.operations.batch.column_finish`): the
    caller then adds the rows one by one.
    """
    sol, cols = solve_by_columns(ss, ss.ordered_slots(), k)
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
        be.ready_for_removals(ss)  # the first forget after a fit costs a settled one's
    finally:
        cols.scrub()
    ss.standby_stale = True
    return ids
