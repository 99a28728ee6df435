"""The file schema of the solver state: a :class:`~svattn.exact.core.state.SlotState` as
tensors and JSON-ready fields, and back, with the readers of every older version.

:func:`to_tensors` / :func:`from_tensors` *are* the schema (``docs/design.md`` §4);
:mod:`svattn.exact.records.fileformat` is the safetensors file around them (header,
checksums, atomic writes). Version :data:`SCHEMA_VERSION` is written; every version in
:data:`READS` is read: 1 (no error sum, rebuilt on first use), 1-2 (the solver's scalars
under their old attribute names, :data:`_LEGACY_SCALARS`), 1-3 (no commitments: the
tokens get opaque ones on load), 1-4 (the kernel cache's values, ``kcache``, where
version 5 holds its recipe and rebuilds it from the keys bit for bit,
:mod:`svattn.exact.records.kcache`). :func:`from_tensors` checks that the parts are
consistent, down to the kernel cache being the kernel of the keys.

Examples
--------
>>> from svattn.exact.core.state import SlotState
>>> st = SlotState.new(C=0.5, kernel="rbf", gamma=None, tol=1e-10, standby=0)
>>> tensors, fields = to_tensors(st)
>>> from_tensors(tensors, fields).n
0
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np

from svattn.exact.core.hashes import row_hash, token_hash
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.core.kktsets import ERROR, FREE, MARGIN, RESERVE
from svattn.exact.core.state import (
    COMMIT_BYTES,
    DIGEST_MOD,
    TAG_BYTES,
    SlotState,
    check_parameters,
)
from svattn.exact.records import kcache

# The schema of to_tensors: tensor name -> safetensors dtype.
TENSOR_DTYPES = {
    **{k: "F64" for k in ("keys", "values", "diag", "xn2", "alpha", "g", "kcache", "qinv",
                          "esum")},
    **{k: "I64" for k in ("ids", "slots", "col", "free_slots")},
    "state": "I8", "esum_member": "I8", "tags": "U8", "commitments": "U8", "commit_keyed": "I8",
    "kcache_kinds": "I8", "kcache_scored_slots": "I32", "kcache_scored_bits": "U8",
    "kcache_patch_slots": "I32", "kcache_patch_cols": "I32", "kcache_patch": "F64",
}
SCHEMA_VERSION = 5
READS = (1, 2, 3, 4, 5)  # schema versions from_tensors accepts
_V2_TENSORS = {"esum", "esum_member"}  # absent from version 1 files
_V3_TENSORS = {"tags"}  # absent from version 1-2 files
# absent from version 1-3 files (whose tokens then get opaque commitments on load)
_V4_TENSORS = {"commitments", "commit_keyed"}
# version 5 holds the kernel cache's recipe (these, :mod:`svattn.exact.records.kcache`)
# in place of its values (``kcache``, versions 1-4)
RECIPE_TENSORS = {"kcache_kinds": "kinds", "kcache_scored_slots": "scored_slots",
                  "kcache_scored_bits": "scored_bits", "kcache_patch_slots": "patch_slots",
                  "kcache_patch_cols": "patch_cols", "kcache_patch": "patch_values"}

# Version 1-2 files kept the solver's scalars under their attribute names
# ("every scalar the class happened to hold"); version 3 names them. Old name
# -> field of SlotState, or None for a per-operation value that is not state.
_LEGACY_SCALARS = {
    "standby": "standby", "_max_segments": "max_segments", "_max_jumps": "max_jumps",
    "_ops_since_exact_g": "ops_since_exact_g", "_standby_stale": "standby_stale",
    "_standby_theta": "standby_theta", "_n_segment_fallbacks": "n_segment_fallbacks",
    "_n_block_passes": "n_block_passes", "_n_jumps": "n_jumps",
    "_n_jump_fallbacks": "n_jump_fallbacks", "_compiled": "compiled",
    "_kss_ext": None, "_kkt_after": None,
}
# the solver scalars of a version 3 file, with their types
_SOLVER_FIELDS = {
    "standby": int, "max_segments": int, "max_jumps": int, "ops_since_exact_g": int,
    "standby_stale": bool, "n_segment_fallbacks": int, "n_block_passes": int, "n_jumps": int,
    "n_jump_fallbacks": int, "compiled": bool, "n_compacted": int,
}


class SchemaError(ValueError):
    """Tensors and fields that do not describe a consistent solver state."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise SchemaError(msg)


def to_tensors(ss: SlotState) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The state as tensors (live tokens only, in id order) and JSON-ready fields.

    Tensors (see :data:`TENSOR_DTYPES`): ``ids``, ``slots`` (layout, for
    bit-exact continuation), ``keys``, ``values`` (absent when values are the
    keys), ``diag``, ``xn2``, ``alpha``, ``g``, ``state``, ``col`` (cache
    column, −1: none), the kernel cache's recipe (:data:`RECIPE_TENSORS`: which
    routine rebuilds each column, and a patch of (slot, column, value) for the live
    entries neither reproduces), ``qinv``, ``free_slots`` (slot numbers only),
    ``esum``, ``esum_member``, ``tags``, ``commitments``, ``commit_keyed``. A
    removed token's slot is never written. Per-operation scratch is not state.
    """
    slots = ss.ordered_slots() if ss.dim is not None else np.zeros(0, np.int64)
    chi, nS = ss.chi, ss.nS
    t: dict[str, np.ndarray] = {
        "ids": ss.slot_id[slots].astype(np.int64),
        "slots": slots.astype(np.int64),
        "keys": ss.X[slots],
        "diag": ss.diag[slots],
        "xn2": ss.xn2[slots],
        "alpha": ss.alpha[slots],
        "g": ss.g[slots],
        "state": ss.state[slots].astype(np.int8),
        "col": ss.col_of_slot[slots].astype(np.int64),
        "qinv": ss.Qinv.copy() if nS else np.zeros((0, 0)),
        "free_slots": np.asarray(ss.free_slots, dtype=np.int64),
        "esum": ss.esum[slots] if ss.dim is not None else np.zeros(0),
        "esum_member": (ss.esum_member[slots] if ss.dim is not None
                        else np.zeros(0, bool)).astype(np.int8),
        "tags": ss.tags[slots] if ss.dim is not None
        else np.zeros((0, TAG_BYTES), np.uint8),
        "commitments": ss.commitments[slots] if ss.dim is not None
        else np.zeros((0, COMMIT_BYTES), np.uint8),
        "commit_keyed": ss.commit_keyed[slots] if ss.dim is not None
        else np.zeros(0, np.int8),
    }
    if ss.dim is not None and not ss.value_is_key:
        t["values"] = ss.V[slots]
    rec = kcache.recipe(ss)
    t.update({name: rec[part] for name, part in RECIPE_TENSORS.items()})
    t = {k: np.ascontiguousarray(v) for k, v in t.items()}
    ids = [int(i) for i in t["ids"]]
    st = t["state"]
    fields: dict[str, Any] = {
        "C": ss.C, "kernel": ss.kernel, "gamma": ss.gamma,
        "gamma_value": ss.gamma_value if ss.dim is not None else None,
        "tol": ss.tol, "dim": ss.dim, "vdim": ss.vdim,
        "commit_key_id": ss.commit_key_id,
        "value_is_key": bool(ss.value_is_key), "n": int(ss.n), "ids": ids,
        "next_id": int(ss.next_id), "hi": int(ss.hi), "cap": int(ss.cap),
        "ccap": int(ss.ccap), "chi": int(chi), "nS": int(nS),
        "margin_order": [int(ss.slot_id[s]) for s in ss.slot_of_col[:nS]],
        "partition": {name: [i for i, s in zip(ids, st, strict=True) if s == code]
                      for name, code in (("margin", MARGIN), ("error", ERROR),
                                         ("reserve", RESERVE))},
        "mu": float(ss.mu), "mu_hex": float(ss.mu).hex(),
        "g_valid": bool(ss.g_valid), "esum_valid": bool(ss.esum_valid),
        "esum_updates": int(ss.esum_updates),
        "n_refactorizations": int(ss.n_refactorizations),
        "n_resolves": int(ss.n_resolves),
        "solver": {
            **{k: getattr(ss, k) for k in _SOLVER_FIELDS},
            # JSON has no inf: null stands for "no standby threshold yet"
            "standby_theta": (float(ss.standby_theta).hex()
                              if math.isfinite(ss.standby_theta) else None),
        },
    }
    return t, fields


def from_tensors(t: dict[str, np.ndarray], fields: dict[str, Any], *,
                 version: int = SCHEMA_VERSION) -> SlotState:
    """Inverse of :meth:`to_tensors`, checking that the parts are consistent.

    Reads schema versions 1-5 (version 1 has no error sum: it is rebuilt from
    the cache on first use; versions 1-2 keep the solver's scalars under
    their old attribute names in ``fields["scalars"]``; versions 1-4 hold the
    kernel cache's values, version 5 its recipe).

    Raises
    ------
    SchemaError
        When the tensors or fields contradict each other (the message says how).
    """
    _check(version in READS, f"unsupported schema version {version!r}")
    expected = (set(TENSOR_DTYPES) - ({"values"} if fields.get("value_is_key") else set())
                - (_V2_TENSORS if version == 1 else set())
                - (_V3_TENSORS if version < 3 else set())
                - (_V4_TENSORS if version < 4 else set())
                - (set(RECIPE_TENSORS) if version < 5 else {"kcache"}))
    _check(set(t) == expected,
           f"tensor set {sorted(t)} does not match the format ({sorted(expected)})")
    try:  # a file's parameters pass the constructor's checks, or it is refused
        check_parameters(fields["C"], fields["kernel"], fields["gamma"], fields["tol"], 16)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"invalid parameters: {exc}") from None
    st = SlotState.new(C=fields["C"], kernel=fields["kernel"], gamma=fields["gamma"],
                 tol=fields["tol"], standby=16)
    n = int(fields["n"])
    _check(len(t["ids"]) == n, f"{len(t['ids'])} ids for n = {n}")
    st.n_refactorizations = int(fields["n_refactorizations"])
    st.n_resolves = int(fields["n_resolves"])
    if fields["dim"] is None:
        _check(n == 0, "tokens without a key dimension")
        st.next_id = int(fields["next_id"])
    else:
        _restore_arrays(st, t, fields, version)
    _restore_solver_fields(st, fields, version)  # after alloc, which resets them
    return st


def _restore_solver_fields(ss: SlotState, fields: dict[str, Any], version: int) -> None:
    if version >= 3:
        solver = fields["solver"]
        _check(isinstance(solver, dict) and set(solver) == set(_SOLVER_FIELDS)
               | {"standby_theta"}, "the solver fields do not match the format")
        theta = solver["standby_theta"]
        named = {k: v for k, v in solver.items() if k != "standby_theta"}
        ss.standby_theta = math.inf if theta is None else float.fromhex(theta)
    else:
        named = {"n_compacted": -1}  # formats 1-2 did not record compaction
        for k, v in fields.get("scalars", {}).items():
            _check(k in _LEGACY_SCALARS, f"unknown or mistyped solver attribute {k!r}")
            if _LEGACY_SCALARS[k] is None:
                continue  # per-operation scratch (version 2 saved it by accident)
            if k == "_standby_theta":
                _check(type(v) is float, f"unknown or mistyped solver attribute {k!r}")
                ss.standby_theta = v
                continue
            named[_LEGACY_SCALARS[k]] = v
    for k, v in named.items():
        _check(type(v) is _SOLVER_FIELDS[k], f"unknown or mistyped solver attribute {k!r}")
        setattr(ss, k, v)
    _check(ss.standby >= 0 and ss.max_segments >= 0 and ss.max_jumps >= 0
           and ss.n_compacted >= -1, "negative solver settings")


def _restore_arrays(ss: SlotState, t: dict[str, np.ndarray], fields: dict[str, Any],
                    version: int) -> None:
    n = int(fields["n"])
    d, dv = int(fields["dim"]), int(fields["vdim"])
    vik = bool(fields["value_is_key"])
    cap, ccap, chi, nS, hi = (int(fields[k]) for k in ("cap", "ccap", "chi", "nS", "hi"))
    _check(0 <= n <= hi <= cap and 0 <= nS <= chi <= ccap, "inconsistent sizes")
    ss.dim, ss.vdim, ss.value_is_key = d, dv, vik
    ss.alloc(cap, d, 0 if vik else dv)
    slots = t["slots"]
    _check(t["keys"].shape == (n, d), f"keys have shape {t['keys'].shape}, expected {(n, d)}")
    _check(len(np.unique(slots)) == n and (n == 0 or (slots.min() >= 0 and slots.max() < hi)),
           "slot numbers are not distinct slots below hi")
    free = [int(s) for s in t["free_slots"]]
    _check(sorted(free + [int(s) for s in slots]) == list(range(hi)),
           "live and free slots do not partition the used slots")
    ids = t["ids"]
    _check(n == 0 or (bool(np.all(np.diff(ids) > 0)) and ids[0] >= 0
                      and ids[-1] < fields["next_id"]),
           "ids are not increasing and below next_id")
    ss.hi, ss.free_slots = hi, free
    ss.next_id, ss.n = int(fields["next_id"]), n
    ss.X[slots], ss.xn2[slots], ss.diag[slots] = t["keys"], t["xn2"], t["diag"]
    if not vik:
        _check(t["values"].shape == (n, dv), "values have the wrong shape")
        ss.V[slots] = t["values"]
    ss.slot_id[slots] = ids
    if "tags" in t:
        _check(t["tags"].shape == (n, TAG_BYTES), "tags have the wrong shape")
        ss.tags[slots] = t["tags"]
    if "commitments" in t:
        _check(t["commitments"].shape == (n, COMMIT_BYTES)
               and t["commit_keyed"].shape == (n,), "commitments have the wrong shape")
        _check(bool(np.isin(t["commit_keyed"], [0, 1, 2]).all()),
               "commit_keyed is not 0, 1 or 2")
        ss.commitments[slots] = t["commitments"]
        ss.commit_keyed[slots] = t["commit_keyed"]
    else:  # an older file: its log's commitments were salted; these are opaque (legacy)
        ss.commitments[slots] = np.frombuffer(
            secrets.token_bytes(COMMIT_BYTES * n), np.uint8).reshape(n, COMMIT_BYTES)
        ss.commit_keyed[slots] = 2
    key_id = fields.get("commit_key_id")
    _check(key_id is None or (isinstance(key_id, str) and len(key_id) == 32),
           "commit_key_id is not a key name")
    ss.commit_key_id = key_id
    ss.alpha[slots], ss.g[slots] = t["alpha"], t["g"]
    states = t["state"]
    _check(bool(np.isin(states, [RESERVE, MARGIN, ERROR]).all()) if n else True,
           "unknown token states")
    ss.state[slots] = states
    ss.state[free] = FREE
    col = t["col"]
    ss.col_of_slot[slots] = col
    _restore_cache(ss, t, slots, col, states, ccap, chi, nS, d)
    if "kcache" not in t:  # version 5: the cache from the keys, by its recipe
        _rebuild_cache(ss, t)
    ss.mu = float.fromhex(fields["mu_hex"])
    _check(ss.mu == fields["mu"], "mu and its hex form differ")
    ss.g_valid = bool(fields["g_valid"])
    ss.sync_ac()
    if version >= 2:
        _restore_error_sum(ss, t, fields, slots)
    h = 0  # ids and token hashes (the digest's multiset hash)
    for s, tid in zip(slots, ids, strict=True):
        th = token_hash(int(tid), ss.X[s], None if vik else ss.V[s])
        ss.token_hash[s] = th
        ss.row_hash[s] = row_hash(ss.X[s], ss.V[s])
        h = (h + th) % DIGEST_MOD
        ss.id_to_slot[int(tid)] = int(s)
    ss.set_hash = h
    if "kcache" in t:  # (a rebuilt cache is the keys' kernel by construction)
        _check_cache_is_kernel(ss, t, slots)


def _rebuild_cache(ss: SlotState, t: dict[str, np.ndarray]) -> None:
    rec = {part: t[name] for name, part in RECIPE_TENSORS.items()}
    wrong = kcache.check_recipe(ss, rec)
    _check(wrong is None, str(wrong))
    moved = kcache.rebuild(ss, rec)
    _check(moved <= kcache.PATCH_ROUNDING,
           f"the kernel cache's patch moves an entry by {moved:.2e} from the keys' kernel")


def _restore_cache(ss: SlotState, t, slots, col, states, ccap, chi, nS, d) -> None:
    ss.ccap, ss.chi, ss.nS = ccap, chi, nS
    # version 5: an empty placeholder; :func:`_rebuild_cache` allocates the cache it
    # builds (a second (cap, ccap) allocation would double the load's peak)
    ss.KC = np.zeros((ss.cap, ccap) if "kcache" in t else (0, 0), order="F")
    ss.XC = np.zeros((ccap, d))
    ss.slot_of_col = np.full(ccap, -1, dtype=np.int64)
    ss.ac = np.zeros(ccap)
    n = len(slots)
    if "kcache" in t:
        _check(t["kcache"].shape == (n, chi), "kernel cache has the wrong shape")
        for lo, hi in _column_blocks(chi, ss.cap):  # (one n×chi gather would copy it whole)
            ss.KC[slots, lo:hi] = t["kcache"][:, lo:hi]
    cached = np.flatnonzero(col >= 0)
    cols = col[cached]
    _check(len(np.unique(cols)) == len(cols) and bool(np.all(cols < chi)),
           "cache columns are not distinct columns below chi")
    ss.slot_of_col[cols] = slots[cached]
    ss.XC[cols] = t["keys"][cached]
    _check(np.array_equal(np.sort(col[states == MARGIN]), np.arange(nS)),
           "margin tokens do not occupy cache columns 0..nS-1")
    _check(bool(np.all(col[states == ERROR] < 0) or np.all(col[states == ERROR] >= nS)),
           "error tokens hold margin columns")  # (none since issue #51; files before: all)
    q = t["qinv"]
    _check(q.shape == ((nS + 1, nS + 1) if nS else (0, 0)), "Qinv has the wrong shape")
    ss.Qinv = q.copy()


def _restore_error_sum(ss: SlotState, t, fields, slots) -> None:
    """The error-column sum and its members, checked against the kernel cache."""
    n = len(slots)
    esum, member = t["esum"], t["esum_member"]
    _check(esum.shape == (n,) and member.shape == (n,),
           "error sum tensors have the wrong shape")
    _check(bool(np.isin(member, [0, 1]).all()), "error sum members are not 0/1")
    _check(bool(np.isfinite(esum).all()), "error sum is not finite")
    ss.esum[slots] = esum
    ss.esum_member[slots] = member.astype(bool)
    ss.esum_valid = bool(fields["esum_valid"])
    ss.esum_updates = int(fields["esum_updates"])
    _check(ss.esum_updates >= 0, "negative error sum update count")
    at = np.flatnonzero(member == 1)  # positions of the members among ``slots``
    if ss.esum_valid and len(at):
        # a forged sum would corrupt every later g: it must be the members' kernel sum,
        # read from their cache columns where they have one (files before issue #51),
        # else computed from the keys a block at a time (error tokens keep no column)
        cols = ss.col_of_slot[slots[at]]
        direct = np.zeros(n)
        cached = cols[cols >= 0]
        for lo, hi in _column_blocks(len(cached), ss.cap):  # (the cache is column-major)
            direct += ss.KC[:, cached[lo:hi]][slots].sum(axis=1)
        by_key = at[cols < 0]
        step = max(1, _BLOCK_ENTRIES // max(1, n))
        for lo in range(0, len(by_key), step):
            part = by_key[lo:lo + step]
            keys = t["keys"][part]
            block = kernel_matrix(t["keys"], keys, ss.kernel, ss.gamma_value)
            keys.fill(0.0)  # (a copy of keys)
            block[part, np.arange(len(part))] = ss.diag[slots[part]]  # (own entry: diag)
            direct += block.sum(axis=1)
            block.fill(0.0)
        dev = float(np.max(np.abs(esum - direct), initial=0.0))
        _check(dev <= 1e-9 * ss.scale * len(at),
               f"error sum deviates from its members' kernel columns by {dev:.2e}")


def _check_cache_is_kernel(ss: SlotState, t, slots) -> None:
    """The cache must be the kernel of the keys (a forged cache would corrupt later steps)."""
    chi = ss.chi
    if not (chi and len(slots)):
        return
    live_cols = np.flatnonzero(ss.slot_of_col[:chi] >= 0)
    pos = {int(s): i for i, s in enumerate(slots)}
    own = np.array([pos[int(s)] for s in ss.slot_of_col[live_cols]], dtype=np.int64)
    xc, dev = ss.XC[live_cols], 0.0
    rows = max(1, _BLOCK_ENTRIES // len(live_cols))  # a block of rows at a time
    for lo in range(0, len(slots), rows):
        hi = min(len(slots), lo + rows)
        Kc = kernel_matrix(t["keys"][lo:hi], xc, ss.kernel, ss.gamma_value)
        here = np.flatnonzero((own >= lo) & (own < hi))  # a column's own token: k(x, x)
        Kc[own[here] - lo, here] = ss.diag[ss.slot_of_col[live_cols[here]]]
        Kc -= t["kcache"][lo:hi][:, live_cols]
        dev = max(dev, float(np.max(np.abs(Kc), initial=0.0)))
    _check(dev <= 1e-9 * ss.scale,
           f"kernel cache deviates from the keys' kernel by {dev:.2e}")


# The cache's checks on load take it a block at a time: about this many entries each
# (32 MB of float64), not n×chi copies of the whole cache.
_BLOCK_ENTRIES = 1 << 22


def _column_blocks(ncols: int, nrows: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` spans of ``ncols`` columns, ~:data:`_BLOCK_ENTRIES` entries of
    ``nrows`` rows each."""
    step = max(1, _BLOCK_ENTRIES // max(1, nrows))
    return [(lo, min(ncols, lo + step)) for lo in range(0, ncols, step)]


__all__ = ["READS", "RECIPE_TENSORS", "SCHEMA_VERSION", "TENSOR_DTYPES", "SchemaError",
           "from_tensors", "to_tensors"]
