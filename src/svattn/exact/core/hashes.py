"""The two per-token hashes of the solver state, each from the token's bytes.

``token_hash``: SHA-256 of a token's id, key and value — its summand in the set hash
(the digest's multiset of tokens). ``row_hash``: a 64-bit BLAKE2b of a key's and
value's bytes with -0.0 as 0.0 — equal records have equal row hashes, so the live
copies of a record are found by one array comparison. The ``*_of_bytes`` forms take
bytes already converted (the streaming add converts a row once for every hash it
needs, :mod:`svattn.exact.fastpath`).
"""

from __future__ import annotations

import hashlib

import numpy as np


def row_hash(x: np.ndarray, v: np.ndarray) -> int:
    """64-bit BLAKE2b of a key's and value's bytes, -0.0 as 0.0 (deterministic)."""
    return row_hash_of_bytes((x + 0.0).tobytes(), (v + 0.0).tobytes())


def row_hash_of_bytes(xz: bytes, vz: bytes) -> int:
    """:func:`row_hash` of a key's and value's float64 bytes, each with -0.0 as 0.0."""
    h = hashlib.blake2b(xz + vz, digest_size=8)
    return int.from_bytes(h.digest(), "little", signed=True)


def token_hash(tid: int, x: np.ndarray, v: np.ndarray | None) -> int:
    """SHA-256 of a token's id, key and value, as an int (the set hash's summand)."""
    return token_hash_of_bytes(
        tid, np.ascontiguousarray(x, dtype=np.float64).tobytes(),
        b"" if v is None else np.ascontiguousarray(v, dtype=np.float64).tobytes())


def token_hash_of_bytes(tid: int, xb: bytes, vb: bytes) -> int:
    """:func:`token_hash` of a token's id and its key's and value's float64 bytes as
    stored (b"" for no value)."""
    h = hashlib.sha256(int(tid).to_bytes(8, "big", signed=False) + xb + vb)
    return int.from_bytes(h.digest(), "big")


def block_hashes(tids: list[int], xs: np.ndarray, vs: np.ndarray | None
                 ) -> tuple[list[int], list[int]]:
    """:func:`token_hash` and :func:`row_hash`
    of each new row (``row_hash`` of the value row as stored: empty when values are
    the keys), with the rows' bytes converted once for the block."""
    x = np.ascontiguousarray(xs, dtype=np.float64)
    xb, xz, w = x.tobytes(), (x + 0.0).tobytes(), 8 * x.shape[1]
    vb = vz = b""
    u = 0
    if vs is not None:
        v = np.ascontiguousarray(vs, dtype=np.float64)
        vb, vz, u = v.tobytes(), (v + 0.0).tobytes(), 8 * v.shape[1]
    ths = [token_hash_of_bytes(tid, xb[r * w:(r + 1) * w], vb[r * u:(r + 1) * u])
           for r, tid in enumerate(tids)]
    rhs = [row_hash_of_bytes(xz[r * w:(r + 1) * w], vz[r * u:(r + 1) * u])
           for r in range(len(tids))]
    return ths, rhs


__all__ = ["block_hashes", "row_hash", "row_hash_of_bytes", "token_hash", "token_hash_of_bytes"]
