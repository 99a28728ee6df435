"""The kernel cache as a pickle or a state file holds it: a recipe, not the values.

Every entry of a memory's kernel cache is a kernel value of two keys the state holds,
so :func:`recipe` describes the cache and :func:`rebuild` computes it again from the
keys, bit for bit. Its columns were computed by two routines that round differently
(the batch fit's rows, ``np.exp`` over a row of distances,
:class:`svattn.exact.operations.batch.KernelColumns`; the compiled backend's columns,
:func:`svattn.exact.backends.compiled.columns.kernel_column`), and a column may hold
entries of a third (a row added one at a time after the column was computed is scored
by the streaming add, :func:`svattn.exact.backends.compiled.reserve.reserve_row`); so
the recipe records, per column below ``chi``, which routine reproduces most of its live
entries (:data:`ROWS` or :data:`COLUMN`), per row scored later a bit per column where
the scoring routine's value stands, and the live entries no routine reproduces as a
patch of (slot, column, value): none after a 20k-row fit and its forgets
(``benchmarks/bench_pickle.py``).
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.compiled import columns, reserve
from svattn.exact.core.kernels import kernel_matrix, sq_distances_t
from svattn.exact.core.kktsets import FREE
from svattn.exact.core.state import SlotState

ROWS, COLUMN = 0, 1  # the routine a column is rebuilt with
_BLOCK = 64  # columns rebuilt at once (a (64, hi) buffer)
# how far a patch may move an entry from its routine's value (units of the largest
# diagonal): what a state file's cache was allowed to deviate from the keys' kernel
PATCH_ROUNDING = 1e-9


def recipe(ss: SlotState) -> dict[str, np.ndarray]:
    """``kinds`` (int8, one per column below ``chi``: its routine); ``scored_slots``
    (int32) and ``scored_bits`` (uint8, one row of ``chi`` bits each, packed): the rows
    whose entries in the marked columns are the scoring routine's (:func:`_scoring_row`);
    and the patch, ``patch_slots``, ``patch_cols`` (int32) and ``patch_values`` (float64):
    the live entries no routine reproduces."""
    kinds = np.zeros(ss.chi, dtype=np.int8)
    slots, cols = [], []
    live = ss.state[: ss.hi] != FREE
    scratch = np.zeros((ss.cap, 1), order="F")
    try:
        for c, block in _blocks(ss):
            for j, col in enumerate(c):
                have = ss.KC[: ss.hi, col]
                wrong = live & (block[j] != have)
                if wrong.any():
                    _kernel_column(ss, scratch, col, 0)
                    other = live & (scratch[: ss.hi, 0] != have)
                    if np.count_nonzero(other) < np.count_nonzero(wrong):
                        kinds[col], wrong = COLUMN, other
                    at = np.flatnonzero(wrong)
                    slots.append(at)
                    cols.append(np.full(len(at), col, dtype=np.int64))
            block.fill(0.0)
    finally:
        scratch.fill(0.0)
    slots_a, cols_a = _cat(slots, np.int64), _cat(cols, np.int64)
    scored, bits, left = _scored_rows(ss, slots_a, cols_a)
    at = (slots_a[left], cols_a[left])
    return {"kinds": kinds, "scored_slots": scored, "scored_bits": bits,
            "patch_slots": at[0].astype(np.int32), "patch_cols": at[1].astype(np.int32),
            "patch_values": ss.KC[at].astype(np.float64)}


def _scored_rows(ss: SlotState, slots: np.ndarray, cols: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the entries ``(slots, cols)`` the column routines miss, those the scoring
    routine reproduces, by row: the rows (where that saves bytes: a row of bits costs
    ``chi / 8``, a patched entry 16), their bits, and which entries are left."""
    width = (ss.chi + 7) // 8
    left = np.ones(len(slots), dtype=bool)
    scored, bits = [], []
    if len(slots):
        order = np.argsort(slots, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(slots[order]) != 0])
        row = np.zeros((max(ss.chi, 1), 1))
        try:
            for k, start in enumerate(starts):
                stop = starts[k + 1] if k + 1 < len(starts) else len(order)
                idx = order[start:stop]
                if 16 * len(idx) <= width:
                    continue
                slot = int(slots[idx[0]])
                _scoring_row(ss, slot, row)
                hit = row[cols[idx], 0] == ss.KC[slot, cols[idx]]
                if 16 * np.count_nonzero(hit) <= width:
                    continue
                mask = np.zeros(ss.chi, dtype=bool)
                mask[cols[idx[hit]]] = True
                scored.append(slot)
                bits.append(np.packbits(mask))
                left[idx[hit]] = False
        finally:
            row.fill(0.0)
    return (np.array(scored, dtype=np.int32),
            np.array(bits, dtype=np.uint8).reshape(len(scored), width), left)


def _scoring_row(ss: SlotState, slot: int, row: np.ndarray) -> None:
    """Slot ``slot``'s kernel row over the columns ``[0, chi)`` as the streaming add
    scores a new row (:func:`svattn.exact.backends.compiled.reserve.reserve_row`), into
    ``row[:chi, 0]``."""
    reserve.reserve_row(np.ascontiguousarray(ss.X[slot]), ss.XC, ss.ac, ss.chi, ss.mu,
                        ss.gamma_value, ss.is_rbf, row)


def rebuild(ss: SlotState, rec: dict[str, np.ndarray]) -> float:
    """A new kernel cache for ``ss`` (``(cap, ccap)``, Fortran order) from its keys, its
    diagonal and ``slot_of_col`` by the recipe ``rec``: each column by its routine, the
    scored rows' marked entries by the scoring routine, the patch written over it, free
    slots' rows zero. The caller has checked the recipe's shape (:func:`check_recipe`).
    Returns how far the patch moved an entry, in units of the largest diagonal:
    rounding (an ulp or so) for an honest patch; the caller refuses more than
    :data:`PATCH_ROUNDING`."""
    ss.KC = np.zeros((ss.cap, ss.ccap), order="F")
    kinds = rec["kinds"]
    for c, block in _blocks(ss):
        for j, col in enumerate(c):
            if kinds[col] == ROWS:
                ss.KC[: ss.hi, col] = block[j]
            else:
                _kernel_column(ss, ss.KC, col, col)
        block.fill(0.0)
    if len(rec["scored_slots"]):
        row = np.zeros((ss.chi, 1))
        try:
            for slot, packed in zip(rec["scored_slots"].tolist(), rec["scored_bits"],
                                    strict=True):
                mask = np.unpackbits(packed, count=ss.chi).astype(bool)
                _scoring_row(ss, slot, row)
                ss.KC[slot, : ss.chi][mask] = row[mask, 0]
        finally:
            row.fill(0.0)
    at = (rec["patch_slots"], rec["patch_cols"])
    moved = float(np.abs(ss.KC[at] - rec["patch_values"]).max(initial=0.0)) / ss.scale
    ss.KC[at] = rec["patch_values"]
    ss.KC[np.flatnonzero(ss.state[: ss.hi] == FREE)] = 0.0
    return moved


def check_recipe(ss: SlotState, rec: dict[str, np.ndarray]) -> str | None:
    """What is wrong with ``rec`` as the recipe of ``ss``'s cache (None: nothing): its
    kinds one known routine per column below ``chi``, its patch on live slots and
    cached columns, finite."""
    kinds, slots, cols = rec["kinds"], rec["patch_slots"], rec["patch_cols"]
    values = rec["patch_values"]
    if kinds.shape != (ss.chi,) or not np.isin(kinds, [ROWS, COLUMN]).all():
        return f"the cache recipe's kinds are not {ss.chi} routine codes"
    if not (slots.shape == cols.shape == values.shape and slots.ndim == 1):
        return "the cache recipe's patch arrays differ in shape"
    scored, bits = rec["scored_slots"], rec["scored_bits"]
    if scored.ndim != 1 or bits.shape != (len(scored), (ss.chi + 7) // 8):
        return "the cache recipe's scored rows differ in shape"
    if len(scored) and (scored.min() < 0 or scored.max() >= ss.hi
                        or (ss.state[scored] == FREE).any()):
        return "the cache recipe's scored rows are not live slots"
    if len(np.unique(scored)) != len(scored):
        return "the cache recipe scores a row twice"
    if len(slots):
        if (slots.min() < 0 or slots.max() >= ss.hi or cols.min() < 0
                or cols.max() >= ss.chi):
            return "the cache recipe's patch lies outside the used slots and columns"
        if (ss.state[slots] == FREE).any() or (ss.slot_of_col[cols] < 0).any():
            return "the cache recipe's patch lies on a free slot or column"
        if not np.isfinite(values).all():
            return "the cache recipe's patch is not finite"
    return None


def _blocks(ss: SlotState):
    """The cached columns ``c`` (``_BLOCK`` at a time) and their kernel values over the
    slots ``[0, hi)`` as rows, ``block[j] = K[:hi, c[j]]``: rbf as the batch fit computes
    them (:class:`svattn.exact.operations.batch.KernelColumns`: distances from
    differences, ``np.exp`` over each row), each token's own entry its diagonal."""
    if ss.dim is None or not ss.chi:
        return
    hi, gamma = ss.hi, ss.gamma_value
    cols = np.flatnonzero(ss.slot_of_col[: ss.chi] >= 0)
    XT = np.array(ss.X[:hi].T, order="C")  # a copy, even where the transpose is contiguous (d = 1)
    try:
        for start in range(0, len(cols), _BLOCK):
            c = cols[start: start + _BLOCK]
            own = ss.slot_of_col[c]
            keys = ss.X[own]
            if ss.is_rbf:
                block = sq_distances_t(keys, XT)
                block *= -gamma
                np.exp(block, out=block)
            else:
                block = kernel_matrix(keys, ss.X[:hi], ss.kernel, gamma)
            keys.fill(0.0)
            block[np.arange(len(c)), own] = ss.diag[own]
            yield c, block
    finally:
        XT.fill(0.0)  # a copy of the keys: freed holding none


def _kernel_column(ss: SlotState, out: np.ndarray, col: int, at: int) -> None:
    """Column ``col``'s token's kernel column, by the compiled routine, into ``out[:, at]``."""
    columns.kernel_column(out, ss.X, ss.diag, int(ss.slot_of_col[col]), at, ss.hi,
                          ss.gamma_value, ss.is_rbf)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


__all__ = ["COLUMN", "PATCH_ROUNDING", "ROWS", "check_recipe", "rebuild", "recipe"]
