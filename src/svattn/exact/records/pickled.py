"""The pickle of a solver state: its data, coefficients and factors, not its kernel cache.

A fitted memory's kernel cache is an n × (its columns) block (184 MB of a 20k-row model whose
pickle without it is 14.5 MB, ``benchmarks/bench_pickle.py``), and every entry of it is
a kernel value of two keys the state holds. :func:`pack` leaves it out, with the two
per-token hashes (also functions of the keys) and the slot arrays' padding past
``hi``; it keeps the keys, values, ids, tags, commitments, alpha, g, the partition, mu,
the error sum, the bordered inverse (kept by rank-one updates: a refactorization would
round differently) and the cache's recipe (:mod:`svattn.exact.records.kcache`).
:func:`unpack` rebuilds the rest, the cache bit for bit, so an unpickled memory
continues as the original would, and checks the state's digest and the KKT residual
on the rebuilt cache against the pickled ones (:func:`check`).
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends import compiled, reference
from svattn.exact.core.hashes import block_hashes
from svattn.exact.core.kktsets import FREE
from svattn.exact.core.state import DIGEST_MOD, SlotState
from svattn.exact.operations import solver
from svattn.exact.records import kcache
from svattn.exact.records.fileformat import KKT_ROUNDING, StateFileError

# what the keys give again (rebuilt by unpack)
DERIVED = frozenset({"KC", "token_hash", "row_hash"})
# the slot arrays a pickle holds up to hi only, with the fill of the slots after it
SLOT_FILL = {"X": 0.0, "V": 0.0, "diag": 0.0, "xn2": 0.0, "slot_id": -1, "alpha": 0.0,
             "g": 0.0, "state": FREE, "col_of_slot": -1, "tags": 0, "commitments": 0,
             "commit_keyed": 0, "esum": 0.0, "esum_member": False}


def pack(ss: SlotState, digest: str) -> dict:
    """The pickled form of ``ss`` (its state digest ``digest``): a dict of its fields
    without the derived ones, the recipe of its kernel cache, and what :func:`unpack`
    checks the rebuilt state against (the digest, and the KKT residual with g from the
    cache)."""
    state = ss.__getstate__()  # (without the scratch)
    for name in DERIVED:
        del state[name]
    for name in SLOT_FILL:
        state[name] = state[name][: ss.hi].copy()
    state["cache_recipe"] = kcache.recipe(ss)
    state["checks"] = {"state_digest": digest, "kkt_residual": cache_residual(ss)}
    return state


def unpack(state: dict | SlotState) -> SlotState:
    """The solver state :func:`pack` gave ``state``: slot arrays padded back to ``cap``,
    token and row hashes (and the set hash) from the ids, keys and values, the kernel
    cache rebuilt from its recipe, then checked (:func:`check`). A state pickled with
    its cache (by svattn before the cache was left out) is returned as it is.

    Raises
    ------
    StateFileError
        The recipe does not fit the state, its patch moves an entry off the keys'
        kernel, or the rebuilt state's digest or KKT residual is not the pickled one.
    """
    if isinstance(state, SlotState):
        return state
    state = dict(state)
    recipe, saved = state.pop("cache_recipe"), state.pop("checks")
    ss = SlotState.__new__(SlotState)
    ss.__setstate__({**state, "KC": np.zeros((0, 0), order="F")})
    for name, fill in SLOT_FILL.items():
        a = getattr(ss, name)
        setattr(ss, name, np.concatenate(
            [a, np.full((ss.cap - len(a),) + a.shape[1:], fill, dtype=a.dtype)]))
    _rehash(ss)
    wrong = kcache.check_recipe(ss, recipe)
    if wrong is not None:
        raise StateFileError(f"unpickled memory: {wrong}")
    moved = kcache.rebuild(ss, recipe)
    if not moved <= kcache.PATCH_ROUNDING:
        raise StateFileError(f"unpickled memory: the kernel cache's patch moves an entry "
                             f"by {moved:.2e} from the keys' kernel")
    check(ss, saved)
    return ss


def check(ss: SlotState, saved: dict) -> None:
    """An unpickled state must be the one pickled: its digest recomputed from the keys,
    ids, alpha and mu the pickled one, and the KKT residual on the rebuilt cache within
    rounding of the pickled (:data:`KKT_ROUNDING`: another BLAS sums in another order).

    Raises
    ------
    StateFileError
        Naming which differs.
    """
    if solver.state_digest(ss, _backend(ss)) != saved["state_digest"]:
        raise StateFileError("unpickled memory: the state digest recomputed from its keys, "
                             "ids and coefficients differs from the pickled one")
    got, want = cache_residual(ss), saved["kkt_residual"]
    if not abs(got - want) <= KKT_ROUNDING:
        raise StateFileError(f"unpickled memory: KKT residual {got:.3e} on the rebuilt "
                             f"kernel cache differs from the pickled {want:.3e}")


def _backend(ss: SlotState):
    return compiled if ss.compiled else reference


def cache_residual(ss: SlotState) -> float:
    """The KKT residual with g from the kernel cache's columns (pure; 0 in warm-up)."""
    if ss.n == 0 or ss.warm:
        return 0.0
    return float(_backend(ss).kkt(ss, reference.g_exact(ss)))


def _rehash(ss: SlotState) -> None:
    live = ss.live_slots()
    ids = [int(i) for i in ss.slot_id[live]]
    # (a memory that holds nothing may have no key rows at all: nothing to hash)
    ths, rhs = block_hashes(ids, ss.X[live], None if ss.value_is_key else ss.V[live]) \
        if ids else ([], [])
    ss.token_hash = np.zeros(ss.cap, dtype=object)
    ss.row_hash = np.zeros(ss.cap, dtype=np.int64)
    ss.token_hash[live] = ths
    ss.row_hash[live] = rhs
    ss.set_hash = sum(ths) % DIGEST_MOD


__all__ = ["DERIVED", "SLOT_FILL", "cache_residual", "check", "pack", "unpack"]
