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


__all__ = ["row_hash", "row_hash_of_bytes", "token_hash", "token_hash_of_bytes"]
