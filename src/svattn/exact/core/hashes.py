"""The two per-token hashes of the solver state, each from the token's bytes.

``token_hash``: SHA-256 of a token's id, key and value — its summand in the set hash
(the digest's multiset of tokens). ``row_hash``: a 64-bit BLAKE2b of a key's and
value's bytes with -0.0 as 0.0 — equal records have equal row hashes, so the live
copies of a record are found by one array comparison. The ``*_of_bytes`` forms take
rows already converted (the streaming add converts a row once for every hash it
needs, :mod:`svattn.exact.fastpath`) and hash arrays in place: a token's data is never
copied into an immutable ``bytes`` object that could not be zeroed, and every temporary
array copy is zeroed before it is freed (``tests/exact/test_residue.py``).
"""

from __future__ import annotations

import hashlib

import numpy as np


def row_hash(x: np.ndarray, v: np.ndarray) -> int:
    """64-bit BLAKE2b of a key's and value's bytes, -0.0 as 0.0 (deterministic)."""
    xz, vz = float64_zeroed(x), float64_zeroed(v)
    try:
        return row_hash_of_bytes(xz, vz)
    finally:
        scrub_copies(xz, vz)


def row_hash_of_bytes(xz, vz) -> int:
    """:func:`row_hash` of a key's and value's float64 bytes, each with -0.0 as 0.0
    (bytes, or C-contiguous float64 arrays hashed in place: no copy of the data)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(xz)
    h.update(vz)
    return int.from_bytes(h.digest(), "little", signed=True)


def token_hash(tid: int, x: np.ndarray, v: np.ndarray | None) -> int:
    """SHA-256 of a token's id, key and value, as an int (the set hash's summand)."""
    xb = np.ascontiguousarray(x, dtype=np.float64)
    vb = b"" if v is None else np.ascontiguousarray(v, dtype=np.float64)
    try:
        return token_hash_of_bytes(tid, xb, vb)
    finally:
        scrub_copies(*(c for c, src in ((xb, x), (vb, v)) if not _shares(c, src)))


def token_hash_of_bytes(tid: int, xb, vb) -> int:
    """:func:`token_hash` of a token's id and its key's and value's float64 bytes as
    stored (b"" for no value; bytes, or C-contiguous float64 arrays hashed in place)."""
    h = hashlib.sha256(int(tid).to_bytes(8, "big", signed=False))
    h.update(xb)
    h.update(vb)
    return int.from_bytes(h.digest(), "big")


def block_hashes(tids: list[int], xs: np.ndarray, vs: np.ndarray | None
                 ) -> tuple[list[int], list[int]]:
    """:func:`token_hash` and :func:`row_hash`
    of each new row (``row_hash`` of the value row as stored: empty when values are
    the keys), each row hashed in place; the -0.0-as-0.0 copies are zeroed after."""
    x = np.ascontiguousarray(xs, dtype=np.float64)
    xz = x + 0.0
    v = vz = None
    if vs is not None:
        v = np.ascontiguousarray(vs, dtype=np.float64)
        vz = v + 0.0
    try:
        ths = [token_hash_of_bytes(tid, x[r], b"" if v is None else v[r])
               for r, tid in enumerate(tids)]
        rhs = [row_hash_of_bytes(xz[r], b"" if vz is None else vz[r])
               for r in range(len(tids))]
    finally:
        scrub_copies(xz, vz, *(c for c, src in ((x, xs), (v, vs)) if not _shares(c, src)))
    return ths, rhs


def float64_zeroed(a) -> np.ndarray:
    """A new C-contiguous float64 copy of ``a`` with -0.0 written as 0.0 (equal values,
    equal bytes); the caller zeroes it with :func:`scrub_copies` when done."""
    return np.ascontiguousarray(a, dtype=np.float64) + 0.0


def scrub_copies(*arrays: np.ndarray | bytes | None) -> None:
    """Zero temporary copies of token data before they are freed (nothing erased may
    survive in freed memory); ``None`` and ``b""`` are skipped."""
    for a in arrays:
        if isinstance(a, np.ndarray):
            a.fill(0)


def _shares(copy, source) -> bool:
    """Whether ``copy`` is ``source``'s own buffer (then it is the caller's, not a copy)."""
    return not isinstance(copy, np.ndarray) or (isinstance(source, np.ndarray)
                                                and np.may_share_memory(copy, source))


__all__ = ["block_hashes", "float64_zeroed", "row_hash", "row_hash_of_bytes", "scrub_copies",
           "token_hash", "token_hash_of_bytes"]
