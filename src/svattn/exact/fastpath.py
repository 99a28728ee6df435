"""The streaming add: one token that lands in the reserve set, stored by one backend call.

Most tokens of a redundant stream land inside the description. Adding such a token
changes nothing but its own slot (``docs/design.md`` §2, *Adds*; §4.2 for why the
operation then needs only a light checkpoint), so :func:`store_reserve` hands the
whole decision and the slot's array writes to the backend's ``reserve_add`` (the
compiled one is a single numba call, :mod:`svattn.exact.backends.compiled.reserve`; the numpy
reference is :func:`svattn.exact.backends.reference.reserve_add`) and keeps here only what
Python must do: the id, and the token's three hashes — its set-hash summand
(SHA-256), its row hash and its commitment — from the row's bytes converted once
(:func:`token_digests`). A token outside the description, a standby refresh due,
warm-up or a full slot table return None having changed nothing, and the general
path (:func:`svattn.exact.operations.ingest.add_rows`) takes the token.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from svattn.exact.core.hashes import (
    float64_zeroed,
    row_hash_of_bytes,
    scrub_copies,
    token_hash_of_bytes,
)
from svattn.exact.core.state import DIGEST_MOD, SlotState
from svattn.exact.records.certificate import commit_digest


def token_digests(tid: int, x: np.ndarray, v: np.ndarray | None, commit_key: bytes | None
                  ) -> tuple[int, int, bytes]:
    """The token hash, row hash and commitment (32 bytes) of a new token: id ``tid``,
    float64 key ``x`` (d,) and value ``v`` (dv,) or None (values are the keys) — each
    equal to its own function's (:func:`~svattn.exact.core.hashes.token_hash`,
    :func:`~svattn.exact.core.hashes.row_hash`,
    :func:`~svattn.exact.records.certificate.commit_token`;
    ``tests/exact/test_fastpath.py``), the key and value converted once (the copy
    zeroed after)."""
    xz = float64_zeroed(x)  # -0.0 written as 0.0; x itself is hashed as stored, in place
    vz = b"" if v is None else float64_zeroed(v)
    try:
        return (token_hash_of_bytes(tid, x, b"" if v is None else v),
                row_hash_of_bytes(xz, vz), commit_digest(xz, vz, commit_key))
    finally:
        scrub_copies(xz, vz)


def store_reserve(ss: SlotState, be: ModuleType, k: np.ndarray, v: np.ndarray | None,
                  tags: list, commit_key: bytes | None) -> tuple[int, str] | None:
    """Store the validated row ``k`` (1, d) (value row ``v``) as a reserve token and
    return its id and commitment (hex), or return None having changed nothing (the
    general add path then takes it). ``tags``: as :func:`mark_tokens`; ``commit_key``:
    the controller's commitment key, or None (an opaque commitment)."""
    if ss.dim is None or ss.n + 1 <= ss.warmup_n:
        return None
    free = ss.free_slots
    slot = free[-1] if free else ss.hi
    if slot >= ss.cap:
        return None  # the slot table grows on the general path
    tid = ss.next_id
    x, xv = k[0], None if v is None else v[0]
    if not be.reserve_add(ss, x, xv, slot, tid):
        return None
    if free:
        free.pop()
    else:
        ss.hi += 1
    ss.next_id = tid + 1
    ss.n += 1
    ss.id_to_slot[tid] = slot
    th, ss.row_hash[slot], commitment = token_digests(tid, x, xv, commit_key)
    ss.token_hash[slot] = th
    ss.set_hash = (ss.set_hash + th) % DIGEST_MOD
    _mark_slot(ss, slot, tags[0], commitment, commit_key is not None)
    return tid, commitment.hex()


def mark_tokens(ss: SlotState, ids: list[int], tags: list, commitments: list[str],
                keyed: bool) -> None:
    """Keep each new token's data-subject tag (its keyed hash, or None) and commitment
    (hex; ``keyed``: an HMAC under the controller's key, else opaque)."""
    if not len(ids) == len(tags) == len(commitments):
        raise ValueError(f"{len(ids)} ids, {len(tags)} tags, {len(commitments)} commitments")
    if len(ids) <= 8:  # a few tokens (a driven add): per token is cheaper
        for tid, tag, c in zip(ids, tags, commitments, strict=True):
            _mark_slot(ss, ss.id_to_slot[tid], tag, bytes.fromhex(c), keyed)
        return
    # one write per array for the whole block (an extend's rows), not one per token
    slots = np.fromiter((ss.id_to_slot[t] for t in ids), np.int64, len(ids))
    ss.commitments[slots] = np.frombuffer(bytes.fromhex("".join(commitments)),
                                          dtype=np.uint8).reshape(len(ids), -1)
    ss.commit_keyed[slots] = keyed
    tagged = [i for i, tag in enumerate(tags) if tag is not None]
    if tagged:
        ss.tags[slots[tagged]] = np.frombuffer(b"".join(tags[i] for i in tagged),
                                               dtype=np.uint8).reshape(len(tagged), -1)


def _mark_slot(ss: SlotState, slot: int, tag: bytes | None, commitment: bytes,
               keyed: bool) -> None:
    if tag is not None:
        ss.tags[slot] = np.frombuffer(tag, dtype=np.uint8)
    ss.commitments[slot] = np.frombuffer(commitment, dtype=np.uint8)
    ss.commit_keyed[slot] = keyed


__all__ = ["mark_tokens", "store_reserve", "token_digests"]
