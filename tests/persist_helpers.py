"""Helpers for the persistence / audit tests."""

from __future__ import annotations

import numpy as np

from exact_helpers import check_scratch_between_operations
from svattn.exact import SVDDMemory

# per-slot arrays of the memory (compared on live slots only: free slots may
# hold scratch values that no computation reads)
_SLOT_ARRAYS = ("X", "V", "diag", "xn2", "slot_id", "alpha", "g", "state", "col_of_slot",
                "token_hash", "esum", "esum_member", "tags", "commit_keyed")
# compared below (cache, inverse), per-operation scratch that no later step reads, or the
# kept uniqueness factor, whose reuse changes no result (tests/exact/test_kept_factor.py)
_SKIP = {"KC", "XC", "slot_of_col", "ac", "Qinv", "kss", "kss_for", "kss_ext", "qwork", "qwork_for",
         "qwork_n", "pd_factor", "qspare",
         "inverse_overwrites"}  # (how often the inverse's memory was written over: not saved)


def live_state(mem: SVDDMemory) -> dict:
    """Everything that determines the memory's future, as comparable values."""
    out: dict = {}
    if mem.solver_state.dim is None:
        live = np.zeros(0, dtype=np.int64)
    else:
        live = np.flatnonzero(mem.solver_state.state[: mem.solver_state.hi] != 0)
    out["live"] = live.tobytes()
    # scratch of margin solves, sized on use: the current margin block or zeros
    check_scratch_between_operations(mem.solver_state)
    out["backend"] = mem.backend
    for name, val in vars(mem.solver_state).items():
        if name in _SKIP:
            continue
        if name == "commitments":  # opaque ones are random by design (commit_token)
            keyed = live[mem.solver_state.commit_keyed[live] == 1]
            out[name] = val[keyed].tobytes()
            continue
        if name in _SLOT_ARRAYS:
            arr = val[live]
            out[name] = (arr.shape, arr.dtype.str, arr.tolist() if arr.dtype == object
                         else arr.tobytes())
        elif isinstance(val, np.ndarray):  # an array this helper does not know: all of it
            out[name] = (val.shape, val.dtype.str, val.tobytes())
        else:
            out[name] = val
    chi = mem.solver_state.chi
    # the cache's columns in use: a freed column (a hole below chi, slot_of_col -1) holds
    # no state (rows scored after it was freed hold k(x, 0) there, never read: its alpha
    # is 0 and a column allocated in it is written whole), and a file does not keep it
    used = np.flatnonzero(mem.solver_state.slot_of_col[:chi] >= 0)
    out["KC"] = np.ascontiguousarray(mem.solver_state.KC[np.ix_(live, used)]).tobytes()
    out["XC"] = mem.solver_state.XC[:chi].tobytes()
    out["slot_of_col"] = mem.solver_state.slot_of_col[:chi].tobytes()
    out["ac"] = mem.solver_state.ac[:chi].tobytes()
    out["Qinv"] = (mem.solver_state.Qinv.shape, mem.solver_state.Qinv.tobytes())
    out["health"] = mem.health.to_dict(mem.solver_state.Qinv)
    return out


def assert_same_state(a: SVDDMemory, b: SVDDMemory) -> None:
    sa, sb = live_state(a), live_state(b)
    assert sa.keys() == sb.keys()
    diff = [k for k in sa if sa[k] != sb[k]]
    assert not diff, f"states differ in {diff}"
    assert a.state_digest() == b.state_digest()


def make_memory(n: int = 300, d: int = 6, C: float = 0.05, seed: int = 0, *,
                values: bool = False, kernel: str = "rbf", removes: int = 40,
                **kw) -> tuple[SVDDMemory, np.random.Generator]:
    """A memory with history: a redundant stream, removals (margin ones included), re-adds."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(5, d))
    X = centers[rng.integers(0, 5, n)] + 0.3 * rng.normal(size=(n, d))
    if kernel == "exp":
        X *= 0.3
    mem = SVDDMemory(C, kernel, **kw)
    V = rng.normal(size=(n, 3)) if values else None
    ids = mem.extend(X[: n // 2], None if V is None else V[: n // 2])
    for r in range(n // 2, n):
        mem.add(X[r], None if V is None else V[r])
    sup = mem.support_ids()
    gone = set()
    for t in list(rng.choice(sup, size=min(removes // 2, len(sup)), replace=False)) + list(
        rng.choice(ids, size=removes // 2, replace=False)
    ):
        if int(t) not in gone and int(t) in mem.solver_state.id_to_slot:
            mem.remove(int(t))
            gone.add(int(t))
    return mem, rng
