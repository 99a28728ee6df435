"""The pickle of a solver state: its data, coefficients and factors, not its kernel cache.

A fitted memory's kernel cache is an n×|S ∪ E| block (most of a pickle: 340 MB of a
20k-row model's 360 MB), and every entry of it is a kernel value of two keys the state
holds. :func:`pack` leaves it out, with the two per-token hashes (also functions of the
keys) and the slot arrays' padding past ``hi``; it keeps the keys, values, ids, tags,
commitments, alpha, g, the partition, mu, the error sum and the bordered inverse (kept
by rank-one updates: a refactorization would round differently). :func:`unpack`
rebuilds the rest; :class:`~svattn.exact.memory.SVDDMemory` then checks the state's
digest and the KKT residual on the rebuilt cache against the pickled ones.

The rebuilt cache is the pickled one bit for bit, so an unpickled memory continues as
the original would. Its columns were computed by two routines that round differently
(the batch fit's rows, ``np.exp`` over a row of distances; the compiled backend's
columns, :func:`svattn.exact.backends.compiled.columns.kernel_column`), and a column
may hold entries of both (rows added after it was computed); so the pickle records,
per column, which routine reproduces most of it, and the entries neither reproduces
(slot, value): none after a 20k-row fit and its forgets
(``benchmarks/bench_pickle.py``); a row added one at a time afterwards is computed by a
third routine, and about 40 % of its entries in the fit's columns join the patch.
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends import reference
from svattn.exact.backends.compiled import columns
from svattn.exact.core.hashes import block_hashes
from svattn.exact.core.kernels import kernel_matrix, sq_distances_t
from svattn.exact.core.kktsets import FREE
from svattn.exact.core.state import DIGEST_MOD, SlotState
from svattn.exact.records.fileformat import KKT_ROUNDING, StateFileError

# what the keys give again (rebuilt by unpack)
DERIVED = frozenset({"KC", "token_hash", "row_hash"})
# the slot arrays a pickle holds up to hi only, with the fill of the slots after it
SLOT_FILL = {"X": 0.0, "V": 0.0, "diag": 0.0, "xn2": 0.0, "slot_id": -1, "alpha": 0.0,
             "g": 0.0, "state": FREE, "col_of_slot": -1, "tags": 0, "commitments": 0,
             "commit_keyed": 0, "esum": 0.0, "esum_member": False}
ROWS, COLUMN = 0, 1  # the routine a column is rebuilt with
_BLOCK = 64  # columns rebuilt at once (a (64, hi) buffer)


def pack(ss: SlotState) -> dict:
    """The pickled form of ``ss`` (a dict of its fields without the derived ones, and
    the recipe of its kernel cache)."""
    state = ss.__getstate__()  # (without the scratch)
    for name in DERIVED:
        del state[name]
    for name in SLOT_FILL:
        state[name] = state[name][: ss.hi].copy()
    state["cache_recipe"] = _recipe(ss)
    return state


def unpack(state: dict) -> SlotState:
    """The solver state :func:`pack` gave ``state``: slot arrays padded back to ``cap``,
    token and row hashes (and the set hash) from the ids, keys and values, and the
    kernel cache rebuilt from its recipe. The caller checks its digest."""
    state = dict(state)
    recipe = state.pop("cache_recipe")
    ss = SlotState.__new__(SlotState)
    ss.__setstate__({**state, "KC": np.zeros((0, 0), order="F")})
    for name, fill in SLOT_FILL.items():
        a = getattr(ss, name)
        setattr(ss, name, np.concatenate(
            [a, np.full((ss.cap - len(a),) + a.shape[1:], fill, dtype=a.dtype)]))
    _rehash(ss)
    ss.KC = np.zeros((ss.cap, ss.ccap), order="F")
    kinds = recipe["kinds"]
    for c, block in _blocks(ss):
        for j, col in enumerate(c):
            if kinds[col] == ROWS:
                ss.KC[: ss.hi, col] = block[j]
            else:
                _compiled_column(ss, col)
        block.fill(0.0)
    ss.KC[recipe["patch_slots"], recipe["patch_cols"]] = recipe["patch_values"]
    free = np.flatnonzero(ss.state[: ss.hi] == FREE)
    ss.KC[free] = 0.0
    return ss


def facts(ss: SlotState, be, digest: str) -> dict:
    """What an unpickled state is checked against (:func:`check`): its digest and the
    KKT residual with g from its kernel cache."""
    return {"state_digest": digest, "kkt_residual": cache_residual(ss, be)}


def check(ss: SlotState, be, saved: dict, digest: str) -> None:
    """An unpickled state must be the one pickled: its digest recomputed from the keys,
    ids, alpha and mu (``digest``) the pickled one, and the KKT residual on the rebuilt
    cache within rounding of the pickled (:data:`KKT_ROUNDING`: another BLAS sums in
    another order).

    Raises
    ------
    StateFileError
        Naming which differs.
    """
    if digest != saved["state_digest"]:
        raise StateFileError("unpickled memory: the state digest recomputed from its keys, "
                             "ids and coefficients differs from the pickled one")
    got, want = cache_residual(ss, be), saved["kkt_residual"]
    if not abs(got - want) <= KKT_ROUNDING:
        raise StateFileError(f"unpickled memory: KKT residual {got:.3e} on the rebuilt "
                             f"kernel cache differs from the pickled {want:.3e}")


def cache_residual(ss: SlotState, be) -> float:
    """The KKT residual with g from the kernel cache's columns (pure; 0 in warm-up)."""
    if ss.n == 0 or ss.warm:
        return 0.0
    return float(be.kkt(ss, reference.g_exact(ss)))


def _rehash(ss: SlotState) -> None:
    live = ss.live_slots()
    ids = [int(i) for i in ss.slot_id[live]]
    ths, rhs = block_hashes(ids, ss.X[live], None if ss.value_is_key else ss.V[live])
    ss.token_hash = np.zeros(ss.cap, dtype=object)
    ss.row_hash = np.zeros(ss.cap, dtype=np.int64)
    ss.token_hash[live] = ths
    ss.row_hash[live] = rhs
    ss.set_hash = sum(ths) % DIGEST_MOD


def _blocks(ss: SlotState):
    """The cached columns ``c`` (``_BLOCK`` at a time) and their kernel values over the
    slots ``[0, hi)`` as rows, ``block[j] = K[:hi, c[j]]``: rbf as the batch fit computes
    them (:class:`svattn.exact.operations.batch.KernelColumns`: distances from
    differences, ``np.exp`` over each row), each token's own entry its diagonal."""
    if ss.dim is None or not ss.chi:
        return
    hi, gamma = ss.hi, ss.gamma_value
    cols = np.flatnonzero(ss.slot_of_col[: ss.chi] >= 0)
    XT = np.ascontiguousarray(ss.X[:hi].T)
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


def _compiled_column(ss: SlotState, col: int) -> None:
    columns.kernel_column(ss.KC, ss.X, ss.diag, int(ss.slot_of_col[col]), col, ss.hi,
                          ss.gamma_value, ss.is_rbf)


def _recipe(ss: SlotState) -> dict:
    """Per column (below ``chi``) the routine that reproduces most of its live entries,
    and the live entries it does not reproduce."""
    kinds = np.zeros(ss.chi, dtype=np.int8)
    slots, cols, values = [], [], []
    live = ss.state[: ss.hi] != FREE
    scratch = np.zeros((ss.cap, 1), order="F")
    try:
        for c, block in _blocks(ss):
            for j, col in enumerate(c):
                have = ss.KC[: ss.hi, col]
                wrong = live & (block[j] != have)
                if wrong.any():
                    _compiled_into(ss, scratch, col)
                    other = live & (scratch[: ss.hi, 0] != have)
                    if np.count_nonzero(other) < np.count_nonzero(wrong):
                        kinds[col], wrong = COLUMN, other
                    at = np.flatnonzero(wrong)
                    slots.append(at)
                    cols.append(np.full(len(at), col, dtype=np.int64))
                    values.append(have[at])
            block.fill(0.0)
    finally:
        scratch.fill(0.0)
    return {"kinds": kinds, "patch_slots": _cat(slots, np.int32),
            "patch_cols": _cat(cols, np.int32), "patch_values": _cat(values, np.float64)}


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def _compiled_into(ss: SlotState, out: np.ndarray, col: int) -> None:
    columns.kernel_column(out, ss.X, ss.diag, int(ss.slot_of_col[col]), 0, ss.hi,
                          ss.gamma_value, ss.is_rbf)


__all__ = ["COLUMN", "DERIVED", "ROWS", "SLOT_FILL", "cache_residual", "check", "facts",
           "pack", "unpack"]
