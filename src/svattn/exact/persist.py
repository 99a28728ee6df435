"""Saving and loading an :class:`~svattn.exact.memory.SVDDMemory` (atomic, verified).

File format (``format_version`` 2; version 1 files still load): one safetensors
file. Tensors hold the *live* tokens only, in id order (a removed token's slot is
never written):

==============  ==========  ==================================================
tensor          dtype       content
==============  ==========  ==================================================
``ids``         int64 (n)   token ids
``slots``       int64 (n)   storage slot of each token (layout, for bit-exact
                            continuation)
``keys``        f64 (n, d)  keys
``values``      f64 (n, dv) values (absent when the memory stores keys as values)
``diag``        f64 (n)     K_ii
``xn2``         f64 (n)     ‖x‖²
``alpha``       f64 (n)     coefficients
``g``           f64 (n)     KKT gradients g_i
``state``       int8 (n)    reserve / margin / error
``col``         int64 (n)   kernel-cache column of each token (−1: none)
``kcache``      f64 (n, c)  the kernel cache restricted to live rows
``qinv``        f64         inverse of the bordered matrix (margin order = ``col``)
``free_slots``  int64       the free-slot stack (slot numbers only, no data)
``esum``        f64 (n)     the error-column sum per token (v2; see
                            ``_compiled.error_sum_sync``)
``esum_member`` int8 (n)    1 where the token is one of the sum's members (v2)
==============  ==========  ==================================================

Version 1 files have no error sum: it is rebuilt from the cache on first use.

The header's ``__metadata__`` carries one string, ``svattn``: canonical JSON
with the format version, C, kernel, gamma, tol, ids, next id, partition,
margin order, mu, counters, health, KKT residual,
:meth:`SVDDMemory.state_digest`, the audit-log head, a SHA-256 per tensor, and
``meta_sha256`` (SHA-256 of the canonical JSON of all other fields).
:func:`load` re-checks all of it, recomputes the digest and the KKT residual
from the loaded arrays, and finally re-serialises the loaded
state and requires the file to be byte-identical, so no flipped byte anywhere
(header padding included) goes unnoticed.

Writes are atomic: the bytes go to a temporary file in the same directory,
which is fsynced, renamed over the target, and the directory fsynced. A crash
at any point leaves either the old file or the new one, never a mix.

The checksums detect corruption and naive tampering; they are not a
signature (anyone who can write the file can recompute them). The audit log
(:mod:`svattn.exact.audit`) anchors a state to its hash-chained history.

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> mem = SVDDMemory(C=0.1)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(50, 3)))
>>> path = os.path.join(tempfile.mkdtemp(), "mem.safetensors")
>>> _ = save(mem, path)
>>> same = load(path)
>>> same.state_digest() == mem.state_digest(), bool((same.alpha == mem.alpha).all())
(True, True)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from svattn.exact.memory import SVDDMemory

FORMAT_NAME = "svattn.SVDDMemory"
FORMAT_VERSION = 2
_READS = (1, 2)  # format versions this svattn loads

_TENSORS_F64 = ("keys", "values", "diag", "xn2", "alpha", "g", "kcache", "qinv", "esum")
_TENSORS_I64 = ("ids", "slots", "col", "free_slots")
_DTYPES = {**{k: "F64" for k in _TENSORS_F64}, **{k: "I64" for k in _TENSORS_I64},
           "state": "I8", "esum_member": "I8"}
_V2_ONLY = {"esum", "esum_member"}


class StateFileError(ValueError):
    """A state file that cannot be loaded: corrupted, truncated, tampered or foreign."""


class StateVersionError(StateFileError):
    """A state file of another format or format version."""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _residual(mem: SVDDMemory) -> float:
    """The KKT residual without refreshing any cached array (pure)."""
    if mem._n == 0 or mem.warm:
        return 0.0
    # the full-cache g: the error-sum path would sync (modify) the sum
    g = mem._g[: mem._hi] if mem._g_valid else mem._g_exact_reference()
    return float(mem._kkt(g))


# ------------------------------------------------------------------------ save
# scalar attributes restored explicitly by _build (or recomputed)
_EXPLICIT = {"C", "kernel", "gamma", "tol", "warmup_n", "n_refactorizations", "n_resolves",
             "_dim", "_vdim", "_value_is_key", "_cap", "_hi", "_next_id", "_n", "_ccap",
             "_chi", "_nS", "_mu", "_g_valid", "_set_hash", "_esum_valid", "_esum_updates"}


def _scalars(mem: SVDDMemory) -> dict[str, int | float | bool]:
    """Other scalar solver state (counters the solver may add), restored verbatim."""
    return {k: v for k, v in vars(mem).items()
            if k not in _EXPLICIT and type(v) in (int, float, bool)
            and (type(v) is not float or np.isfinite(v))}


def _collect(mem: SVDDMemory) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and the metadata of a memory's state (no I/O)."""
    from svattn.exact.memory import ERROR, MARGIN, RESERVE

    slots = mem._ordered_slots() if mem._dim is not None else np.zeros(0, np.int64)
    chi, nS = mem._chi, mem._nS
    t: dict[str, np.ndarray] = {
        "ids": mem._slot_id[slots].astype(np.int64),
        "slots": slots.astype(np.int64),
        "keys": mem._X[slots],
        "diag": mem._diag[slots],
        "xn2": mem._xn2[slots],
        "alpha": mem._alpha[slots],
        "g": mem._g[slots],
        "state": mem._state[slots].astype(np.int8),
        "col": mem._col_of_slot[slots].astype(np.int64),
        "kcache": mem._KC[np.ix_(slots, np.arange(chi))],
        "qinv": mem._Qinv.copy() if nS else np.zeros((0, 0)),
        "free_slots": np.asarray(mem._free_slots, dtype=np.int64),
        "esum": mem._esum[slots] if mem._dim is not None else np.zeros(0),
        "esum_member": (mem._esum_member[slots] if mem._dim is not None
                        else np.zeros(0, bool)).astype(np.int8),
    }
    if mem._dim is not None and not mem._value_is_key:
        t["values"] = mem._V[slots]
    t = {k: np.ascontiguousarray(v) for k, v in t.items()}
    ids = [int(i) for i in t["ids"]]
    st = t["state"]
    margin_order = [int(mem._slot_id[s]) for s in mem._slot_of_col[:nS]]
    audit = getattr(mem, "_audit", None)
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "C": mem.C,
        "kernel": mem.kernel,
        "gamma": mem.gamma,
        "gamma_value": mem._gamma_val if mem._dim is not None else None,
        "tol": mem.tol,
        "dim": mem._dim,
        "vdim": mem._vdim,
        "value_is_key": bool(mem._value_is_key),
        "n": int(mem._n),
        "ids": ids,
        "next_id": int(mem._next_id),
        "hi": int(mem._hi),
        "cap": int(mem._cap),
        "ccap": int(mem._ccap),
        "chi": int(chi),
        "nS": int(nS),
        "margin_order": margin_order,
        "partition": {
            "margin": [i for i, s in zip(ids, st, strict=True) if s == MARGIN],
            "error": [i for i, s in zip(ids, st, strict=True) if s == ERROR],
            "reserve": [i for i, s in zip(ids, st, strict=True) if s == RESERVE],
        },
        "mu": float(mem._mu),
        "mu_hex": float(mem._mu).hex(),
        "g_valid": bool(mem._g_valid),
        "esum_valid": bool(mem._esum_valid),
        "esum_updates": int(mem._esum_updates),
        "n_refactorizations": int(mem.n_refactorizations),
        "n_resolves": int(mem.n_resolves),
        "kkt_residual": _residual(mem),
        "state_digest": mem.state_digest(),
        "health": mem._health.to_dict(mem),
        "scalars": _scalars(mem),
        "audit_head": audit.head() if audit is not None else None,
        "tensor_sha256": {k: _sha(v.tobytes()) for k, v in t.items()},
    }
    return t, meta


def _serialize(t: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    from safetensors.numpy import save as st_save

    # one metadata key: safetensors writes the metadata map in hash order
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    text = _canonical({**body, "meta_sha256": _sha(_canonical(body).encode())})
    return st_save(t, metadata={"svattn": text})


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir)."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            view = memoryview(data)
            while view:
                k = os.write(fd, view)
                if k <= 0:
                    raise OSError(f"short write to {tmp}")
                view = view[k:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save(memory: SVDDMemory, path: str | os.PathLike[str]) -> str:
    """Save a memory atomically to a safetensors file; return the file's SHA-256.

    Parameters
    ----------
    memory : SVDDMemory
    path : path-like
        Target file; it is replaced atomically (the old file stays intact
        when anything fails or the process dies mid-save).

    Returns
    -------
    str
        SHA-256 (hex) of the bytes written.

    Raises
    ------
    OSError
        When writing fails (disk full, permissions); the previous file is
        untouched and no temporary file is left behind.

    Examples
    --------
    >>> import os, tempfile
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.5)
    >>> _ = mem.extend([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    >>> len(save(mem, os.path.join(tempfile.mkdtemp(), "m.safetensors")))
    64
    """
    t, meta = _collect(memory)
    data = _serialize(t, meta)
    path = Path(path)
    _write_atomic(path, data)
    digest = _sha(data)
    audit = getattr(memory, "_audit", None)
    if audit is not None:
        audit.record_save(memory, path, digest)
    return digest


# ------------------------------------------------------------------------ load
def _parse(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    """Structural checks of a safetensors file; return (header, data offset)."""
    size = len(data)
    if size < 8:
        raise StateFileError(f"{where}: truncated: {size} bytes, a state file has at least 8")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > size - 8:
        raise StateFileError(
            f"{where}: truncated: the header declares {hlen} bytes but only {size - 8} follow"
        )
    try:
        header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"{where}: corrupted header (not valid JSON: {exc})") from None
    if not isinstance(header, dict):
        raise StateFileError(f"{where}: corrupted header (not a JSON object)")
    base = 8 + hlen
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise StateFileError(f"{where}: corrupted header entry for tensor {name!r}") from None
        if not 0 <= lo <= hi:
            raise StateFileError(f"{where}: tensor {name!r} has invalid offsets [{lo}, {hi})")
        if base + hi > size:
            raise StateFileError(
                f"{where}: truncated: tensor {name!r} ends at byte {base + hi} "
                f"but the file has {size} bytes"
            )
        end = max(end, hi)
    if base + end != size:
        raise StateFileError(
            f"{where}: {size - base - end} unexpected trailing bytes after the tensor data"
        )
    return header, base


def _metadata(header: dict[str, Any], where: str) -> dict[str, Any]:
    md = header.get("__metadata__")
    if not isinstance(md, dict) or "svattn" not in md:
        raise StateVersionError(f"{where}: not an svattn state file (no 'svattn' metadata)")
    text = md["svattn"]
    try:
        meta = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"{where}: corrupted metadata (not valid JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise StateFileError(f"{where}: corrupted metadata (not a JSON object)")
    if meta.get("format") != FORMAT_NAME:
        raise StateVersionError(
            f"{where}: not an svattn state file (format {meta.get('format')!r}, "
            f"expected {FORMAT_NAME!r})"
        )
    if meta.get("format_version") not in _READS:
        raise StateVersionError(
            f"{where}: unsupported format version {meta.get('format_version')!r} "
            f"(this svattn reads versions {', '.join(map(str, _READS))})"
        )
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    if meta.get("meta_sha256") != _sha(_canonical(body).encode()):
        raise StateFileError(f"{where}: metadata checksum mismatch (the metadata was altered)")
    return meta


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise StateFileError(f"{where}: {msg}")


def load(path: str | os.PathLike[str], *, audit_log: str | os.PathLike[str] | None = None
         ) -> SVDDMemory:
    """Load a memory saved by :func:`save`, verifying everything.

    Parameters
    ----------
    path : path-like
    audit_log : path-like, optional
        Continue this audit log (it must end at the state being loaded; see
        :meth:`svattn.exact.audit.AuditLog.resume`).

    Raises
    ------
    FileNotFoundError
        No such file.
    StateVersionError
        Not an svattn state file, or another format version.
    StateFileError
        Truncated, corrupted or tampered: the message says what does not match.

    Examples
    --------
    >>> import os, tempfile
    >>> from svattn.exact import SVDDMemory
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"\\x05")
    >>> load(path)
    Traceback (most recent call last):
    ...
    svattn.exact.persist.StateFileError: ...: truncated: 1 bytes, a state file has at least 8
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    from svattn.exact.memory import ERROR, MARGIN, RESERVE, SVDDMemory, _token_hash

    path = Path(path)
    where = str(path)
    data = path.read_bytes()
    header, _ = _parse(data, where)
    meta = _metadata(header, where)
    try:
        t = st_load(data)
    except SafetensorError as exc:
        raise StateFileError(f"{where}: corrupted tensor data ({exc})") from None
    sums = meta.get("tensor_sha256")
    _check(isinstance(sums, dict), where, "metadata lacks the tensor checksums")
    expected = (set(_DTYPES) - ({"values"} if meta.get("value_is_key") else set())
                - (_V2_ONLY if meta["format_version"] == 1 else set()))
    _check(set(t) == expected and set(sums) == expected, where,
           f"tensor set {sorted(t)} does not match the format ({sorted(expected)})")
    for name in sorted(t):
        _check(header[name]["dtype"] == _DTYPES[name], where,
               f"tensor {name!r} has dtype {header[name]['dtype']}, expected {_DTYPES[name]}")
        _check(_sha(np.ascontiguousarray(t[name]).tobytes()) == sums[name], where,
               f"tensor {name!r} checksum mismatch (its bytes were altered)")
    # catch-all: the loaded content must serialise back to exactly these bytes
    if _serialize(t, meta) != data:
        raise StateFileError(f"{where}: the file differs from the canonical serialisation of "
                             "its content (header bytes were altered)")

    try:
        mem = _build(t, meta, SVDDMemory, _token_hash)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, StateFileError):
            raise
        raise StateFileError(f"{where}: inconsistent state ({type(exc).__name__}: {exc})") from None
    # semantic checks: recomputed from the loaded arrays
    _check(mem.state_digest() == meta["state_digest"], where,
           "state digest mismatch: the recomputed digest differs from the recorded one")
    ids = [int(i) for i in t["ids"]]
    _check(ids == meta["ids"], where, "the id list in the metadata differs from the ids tensor")
    st = t["state"]
    for name, code in (("margin", MARGIN), ("error", ERROR), ("reserve", RESERVE)):
        got = [i for i, s in zip(ids, st, strict=True) if s == code]
        _check(got == meta["partition"][name], where, f"the {name} set differs from the states")
    order = [int(mem._slot_id[s]) for s in mem._slot_of_col[: mem._nS]]
    _check(order == meta["margin_order"], where, "margin order differs from the cache columns")
    res = _residual(mem)
    _check(res == meta["kkt_residual"], where,
           f"KKT residual {res:.3e} recomputed on load differs from the saved "
           f"{meta['kkt_residual']:.3e}")
    if audit_log is not None:
        from svattn.exact.audit import AuditLog

        mem._audit = AuditLog.resume(audit_log, mem, state_path=path, state_sha256=_sha(data),
                                     head=meta["audit_head"])
    return mem


def _restore_error_sum(mem: SVDDMemory, t: dict[str, np.ndarray], meta: dict[str, Any],
                       slots: np.ndarray, where: str) -> None:
    """The error-column sum and its members (v2), checked against the kernel cache."""
    n = len(slots)
    esum, member = t["esum"], t["esum_member"]
    _check(esum.shape == (n,) and member.shape == (n,), where,
           "error sum tensors have the wrong shape")
    _check(bool(np.isin(member, [0, 1]).all()), where, "error sum members are not 0/1")
    _check(bool(np.isfinite(esum).all()), where, "error sum is not finite")
    mem._esum[slots] = esum
    mem._esum_member[slots] = member.astype(bool)
    mem._esum_valid = bool(meta["esum_valid"])
    mem._esum_updates = int(meta["esum_updates"])
    _check(mem._esum_updates >= 0, where, "negative error sum update count")
    cols = mem._col_of_slot[slots[member == 1]]
    if mem._esum_valid and len(cols) and cols.min() >= 0:
        # a forged sum would corrupt every later g: it must be the members' column sum
        direct = mem._KC[np.ix_(slots, cols)].sum(axis=1)
        dev = float(np.max(np.abs(esum - direct), initial=0.0))
        _check(dev <= 1e-9 * mem._scale * len(cols), where,
               f"error sum deviates from its members' kernel columns by {dev:.2e}")
    # (a member without a column makes the next use rebuild the sum from the cache)


def _build(t: dict[str, np.ndarray], meta: dict[str, Any], cls, token_hash) -> SVDDMemory:
    from svattn.exact.memory import _DIGEST_MOD, ERROR, FREE, MARGIN, RESERVE

    where = "state"
    mem = cls(meta["C"], meta["kernel"], meta["gamma"], tol=meta["tol"])
    n = int(meta["n"])
    _check(len(t["ids"]) == n, where, f"{len(t['ids'])} ids for n = {n}")
    mem.n_refactorizations = int(meta["n_refactorizations"])
    mem.n_resolves = int(meta["n_resolves"])
    if meta["dim"] is None:
        _check(n == 0, where, "tokens without a key dimension")
        mem._next_id = int(meta["next_id"])
        return mem
    d, dv = int(meta["dim"]), int(meta["vdim"])
    vik = bool(meta["value_is_key"])
    cap, ccap, chi, nS, hi = (int(meta[k]) for k in ("cap", "ccap", "chi", "nS", "hi"))
    _check(0 <= n <= hi <= cap and 0 <= nS <= chi <= ccap, where, "inconsistent sizes")
    mem._dim, mem._vdim, mem._value_is_key = d, dv, vik
    mem._alloc(cap, d, 0 if vik else dv)
    slots = t["slots"]
    _check(t["keys"].shape == (n, d), where,
           f"keys have shape {t['keys'].shape}, expected {(n, d)}")
    _check(len(np.unique(slots)) == n and (n == 0 or (slots.min() >= 0 and slots.max() < hi)),
           where, "slot numbers are not distinct slots below hi")
    free = [int(s) for s in t["free_slots"]]
    _check(sorted(free + [int(s) for s in slots]) == list(range(hi)), where,
           "live and free slots do not partition the used slots")
    ids = t["ids"]
    _check(n == 0 or (bool(np.all(np.diff(ids) > 0)) and ids[0] >= 0
                      and ids[-1] < meta["next_id"]), where,
           "ids are not increasing and below next_id")
    mem._hi = hi
    mem._free_slots = free
    mem._next_id = int(meta["next_id"])
    mem._n = n
    mem._X[slots] = t["keys"]
    mem._xn2[slots] = t["xn2"]
    mem._diag[slots] = t["diag"]
    if not vik:
        _check(t["values"].shape == (n, dv), where, "values have the wrong shape")
        mem._V[slots] = t["values"]
    mem._slot_id[slots] = ids
    mem._alpha[slots] = t["alpha"]
    mem._g[slots] = t["g"]
    st = t["state"]
    _check(bool(np.isin(st, [RESERVE, MARGIN, ERROR]).all()) if n else True, where,
           "unknown token states")
    mem._state[slots] = st
    mem._state[free] = FREE
    col = t["col"]
    mem._col_of_slot[slots] = col
    # kernel cache
    mem._ccap, mem._chi, mem._nS = ccap, chi, nS
    mem._KC = np.zeros((cap, ccap), order="F")
    mem._XC = np.zeros((ccap, d))
    mem._slot_of_col = np.full(ccap, -1, dtype=np.int64)
    mem._ac = np.zeros(ccap)
    _check(t["kcache"].shape == (n, chi), where, "kernel cache has the wrong shape")
    mem._KC[np.ix_(slots, np.arange(chi))] = t["kcache"]
    cached = np.flatnonzero(col >= 0)
    cols = col[cached]
    _check(len(np.unique(cols)) == len(cols) and bool(np.all(cols < chi)), where,
           "cache columns are not distinct columns below chi")
    mem._slot_of_col[cols] = slots[cached]
    mem._XC[cols] = t["keys"][cached]
    margin_cols = np.sort(col[st == MARGIN])
    _check(np.array_equal(margin_cols, np.arange(nS)), where,
           "margin tokens do not occupy cache columns 0..nS-1")
    _check(bool(np.all(col[st == ERROR] >= nS)), where, "error tokens lack cache columns")
    q = t["qinv"]
    _check(q.shape == ((nS + 1, nS + 1) if nS else (0, 0)), where, "Qinv has the wrong shape")
    mem._Qinv = q.copy()
    mem._mu = float.fromhex(meta["mu_hex"])
    _check(mem._mu == meta["mu"], where, "mu and its hex form differ")
    mem._g_valid = bool(meta["g_valid"])
    mem._sync_ac()
    if meta["format_version"] >= 2:
        _restore_error_sum(mem, t, meta, slots, where)
    # ids and token hashes (the digest's multiset hash)
    h = 0
    for s, tid in zip(slots, ids, strict=True):
        v = None if vik else mem._V[s]
        th = int.from_bytes(token_hash(int(tid), mem._X[s], v), "big")
        mem._token_hash[s] = th
        h = (h + th) % _DIGEST_MOD
        mem._id_to_slot[int(tid)] = int(s)
    mem._set_hash = h
    mem._health.restore(meta["health"], mem)
    for k, v in meta.get("scalars", {}).items():
        _check(k in vars(mem) and type(getattr(mem, k)) is type(v), where,
               f"unknown or mistyped solver attribute {k!r}")
        setattr(mem, k, v)
    # the cache must be the kernel of the keys (a forged cache would corrupt later steps)
    if chi and n:
        from svattn.exact.kernels import kernel_matrix

        live_cols = np.flatnonzero(mem._slot_of_col[:chi] >= 0)
        Kc = kernel_matrix(t["keys"], mem._XC[live_cols], mem.kernel, mem._gamma_val)
        own = mem._slot_of_col[live_cols]
        pos = {int(s): i for i, s in enumerate(slots)}
        for j, s in enumerate(own):
            Kc[pos[int(s)], j] = mem._diag[s]
        dev = float(np.max(np.abs(Kc - t["kcache"][:, live_cols]), initial=0.0))
        _check(dev <= 1e-9 * mem._scale, where,
               f"kernel cache deviates from the keys' kernel by {dev:.2e}")
    return mem


__all__ = ["FORMAT_VERSION", "StateFileError", "StateVersionError", "load", "save"]
