"""A stream's forget log as a transparency log: its checkpoint, its entries' proofs.

An :class:`~svattn.lm.stream.LMStream` keeps one entry per forget (the span, the
SHA-256 of the receipt's body, the state part after it, the hash of the entry before:
:attr:`LMStream.forget_log`). Those entries, each as the canonical JSON bytes
:func:`entry_bytes` gives, are the leaves of an RFC 6962 Merkle tree
(:mod:`svattn.exact.records.merkle`), and after every forget the stream writes the
tree's checkpoint (https://c2sp.org/tlog-checkpoint, :mod:`svattn.exact.records.tlog`):
the origin ``svattn.forgets/`` and the first 32 hex digits of the SHA-256 of the first
entry, the size, the root; signed as a C2SP signed note with the controller's key
under the origin and under the controller's key name, as the audit log's checkpoints
are (``svattn keygen``'s ``PREFIX.vkey`` verifies both), or the bare body when the
stream holds no key. The stream's folder
keeps it beside the log (the manifest's ``forget_checkpoint``).

So a :class:`~svattn.lm.forget.ModelErasureReceipt` has what the audit log's receipts
have: its entry (:func:`receipt_entry`) proved in a signed checkpoint by a
``c2sp.org/tlog-proof@v1`` file (:func:`proof_of`, ``svattn audit prove STREAM
--receipt R``) that tools which share no code with svattn check, and
:func:`check_checkpoint` (run by :func:`~svattn.lm.forget.verify_forget`) holds the
checkpoint to the log: a stream whose log is unsigned, or checked without the
controller's key, is never VERIFIED (its authenticity is named unchecked), and a
checkpoint that is not the log's root, or not signed by the key given, fails.
"""

from __future__ import annotations

import hashlib
import json

from svattn.exact.records.merkle import MerkleTree, leaf_hash
from svattn.exact.records.note import TlogError
from svattn.exact.records.tlog import (
    Checkpoint,
    controller_signer,
    controller_verifier,
    log_signers,
    log_verifier,
    open_checkpoint,
    proof_text,
    read_checkpoint_unverified,
)

ORIGIN_PREFIX = "svattn.forgets/"  # + the first 32 hex digits of SHA-256(the first entry)
WHAT = "the stream's forget-log checkpoint"


def canonical_json(obj) -> bytes:
    """The canonical JSON bytes of ``obj`` (sorted keys, no spaces, ASCII, no NaN)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()


def entry_bytes(entry: dict) -> bytes:
    """The bytes of one forget-log entry that its Merkle leaf hashes (canonical JSON)."""
    return canonical_json(entry)


def origin_of(log: list[dict]) -> str:
    """The origin of a (non-empty) forget log: one name per log, that the log proves."""
    return ORIGIN_PREFIX + hashlib.sha256(entry_bytes(log[0])).hexdigest()[:32]


def tree_of(log: list[dict]) -> MerkleTree:
    """The RFC 6962 tree of the log's entries."""
    return MerkleTree([leaf_hash(entry_bytes(e)) for e in log])


def checkpoint_of(log: list[dict], signing_key=None) -> str | None:
    """The log's checkpoint: signed by ``signing_key`` (an Ed25519 private key) when
    given, else the bare body; None for an empty log."""
    if not log:
        return None
    cp = Checkpoint(origin_of(log), len(log), tree_of(log).root())
    if signing_key is None:
        return cp.body()
    return cp.sign(log_signers(cp.origin, controller_signer(signing_key)))


def receipt_entry(log: list[dict], receipt) -> int | None:
    """The index of the entry that holds ``receipt``'s body (the last such; None)."""
    body = receipt.body_sha256()
    found = [k for k, e in enumerate(log) if e.get("receipt") == body]
    return found[-1] if found else None


def check_checkpoint(log: list[dict], text: str | None, public_key=None
                     ) -> tuple[list[str], list[str], list[str]]:
    """``(checked, failed, unchecked)`` of the checkpoint ``text`` against the forget log
    ``log`` and, with ``public_key`` (an ``Ed25519PublicKey``), the controller's key:
    each item one line for people (unchecked ones say what would check them)."""
    checked: list[str] = []
    if not log:
        return checked, [], []
    if text is None:
        return checked, [], ["the stream's forget log has no checkpoint (saved by an older "
                             "svattn): nothing binds its entries to the controller's key"]
    try:
        cp = read_checkpoint_unverified(text)
    except TlogError as exc:
        return checked, [f"{WHAT} is malformed ({exc.reason})"], []
    tree = tree_of(log)
    if (cp.origin, cp.size, cp.root) != (origin_of(log), len(log), tree.root()):
        return checked, [f"{WHAT} (origin {cp.origin}, {cp.size} entries) is not the root of "
                         f"the stream's forget log of {len(log)} entries: the log or the "
                         "checkpoint was edited"], []
    checked.append(f"{WHAT} is the root of the log's {len(log)} entries")
    if "\n\n" not in text:
        if public_key is not None:
            return checked, [f"{WHAT} is unsigned, and the controller's key was given (a "
                             "signed stream's checkpoint was replaced, or the stream never "
                             "held the key)"], []
        return checked, [], [f"{WHAT} is unsigned: the log's authenticity is unchecked "
                             "(anyone can rewrite an unsigned stream folder; a stream given "
                             "signing_key= signs it)"]
    if public_key is None:
        return checked, [], [f"the signature of {WHAT} (give the controller's public key: "
                             "--public-key, public_key=)"]
    try:
        _, opened = open_checkpoint(text, [controller_verifier(public_key), log_verifier(
            origin_of(log), public_key)], origin_of(log))
    except TlogError as exc:
        return checked, [f"{WHAT}: {exc}"], []
    checked.append(f"{WHAT} is signed by {opened.verified[0].name}")
    return checked, [], []


def proof_of(log: list[dict], text: str, index: int) -> str:
    """The ``c2sp.org/tlog-proof@v1`` text proving entry ``index`` of ``log`` in the
    signed checkpoint ``text`` (which must be the log's: ``ValueError`` otherwise)."""
    if text is None or "\n\n" not in text:
        raise ValueError("the stream's forget-log checkpoint is unsigned: a .tlog-proof "
                         "needs a signed checkpoint (a stream given signing_key= signs it)")
    cp = read_checkpoint_unverified(text)
    if (cp.size, cp.root) != (len(log), tree_of(log).root()):
        raise ValueError(f"{WHAT} is not the root of the stream's forget log")
    if not 0 <= index < len(log):
        raise ValueError(f"entry {index} is outside the forget log's entries 0..{len(log) - 1}")
    return proof_text(index, tree_of(log).inclusion_path(index), text)


__all__ = ["ORIGIN_PREFIX", "canonical_json", "check_checkpoint", "checkpoint_of",
           "entry_bytes", "origin_of", "proof_of", "receipt_entry", "tree_of"]
