"""Checkpoints, offline inclusion proofs and consistency checks of a transparency log.

Formats (each parsed strictly; anything else is :attr:`Verdict.MALFORMED`):

* a **checkpoint** (https://c2sp.org/tlog-checkpoint) is the text of a signed note
  (:mod:`svattn.exact.records.note`)::

      <origin>\\n<tree size, decimal, no leading zero>\\n<base64 RFC 6962 root>\\n
      [<extension line>\\n ...]

* a **proof file** (https://c2sp.org/tlog-proof, ``.tlog-proof``)::

      c2sp.org/tlog-proof@v1\\n
      [extra <base64 opaque data>\\n]
      index <zero-based index, decimal>\\n
      <base64 hash>\\n ...          (the inclusion path, leaf sibling first)
      \\n
      <the checkpoint's signed note, verbatim>

* a **consistency proof** between two checkpoints of one origin is the list of
  hashes of RFC 9162 §2.1.4 (:func:`consistency_proof_text` writes one hash per line,
  base64).

:func:`verify_proof` checks a proof file against the entry's bytes and the held
verifier keys; :func:`verify_consistency_between` two signed checkpoints. Each
refusal is a :class:`~svattn.exact.records.note.TlogError` with its
:class:`~svattn.exact.records.note.Verdict`.

Examples
--------
>>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
>>> from svattn.exact.records.merkle import MerkleTree, leaf_hash
>>> from svattn.exact.records.note import NoteSigner
>>> entries = [b"a", b"b", b"c"]
>>> tree = MerkleTree([leaf_hash(e) for e in entries])
>>> signer = NoteSigner("example.com/log", Ed25519PrivateKey.generate())
>>> cp = Checkpoint("example.com/log", 3, tree.root()).sign([signer])
>>> text = proof_text(1, tree.inclusion_path(1), cp)
>>> verify_proof(text, b"b", [signer.verifier()]).size
3
>>> verify_proof(text, b"x", [signer.verifier()])
Traceback (most recent call last):
...
svattn.exact.records.note.TlogError: inclusion failed: ...
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from svattn.exact.records.merkle import (
    HASH_SIZE,
    CompactRange,
    leaf_hash,
    root_from_inclusion,
    verify_consistency,
)
from svattn.exact.records.note import (
    NoteSigner,
    NoteVerifier,
    OpenedNote,
    TlogError,
    Verdict,
    b64decode,
    b64encode,
    check_text,
    open_note,
    parse_note,
    sign_note,
)

PROOF_HEADER = "c2sp.org/tlog-proof@v1"
ORIGIN_PREFIX = "svattn.audit/"  # + the first 32 hex digits of SHA-256(the open entry)
KEY_NAME_PREFIX = "svattn.controller/"  # + the first 16 hex digits of the key's fingerprint
CHECKPOINT_SUFFIX = ".checkpoint"  # LOG.checkpoint, beside the log
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,18}")


def _malformed(reason: str) -> TlogError:
    return TlogError(Verdict.MALFORMED, reason)


def _decimal(text: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text):
        raise _malformed(f"{what} is not a decimal without leading zeroes: {text[:40]!r}")
    return int(text)


def _hash(text: str, what: str) -> bytes:
    raw = b64decode(text, what)
    if len(raw) != HASH_SIZE:
        raise _malformed(f"{what} is {len(raw)} bytes, not a SHA-256 hash")
    return raw


# ------------------------------------------------------------------ checkpoints
@dataclass(frozen=True)
class Checkpoint:
    """A tree head: the log's origin, its size and its RFC 6962 root.

    Attributes
    ----------
    origin : str
        The log's name (non-empty; no newline).
    size : int
        Number of entries.
    root : bytes
        The 32-byte root of the tree of those entries.
    extensions : tuple of str
        Extension lines (opaque, non-empty; the format allows them, svattn writes none).
    """

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.origin or "\n" in self.origin:
            raise ValueError("a checkpoint's origin is one non-empty line")
        if not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"a checkpoint's size is a count, got {self.size!r}")
        if not isinstance(self.root, bytes) or len(self.root) != HASH_SIZE:
            raise ValueError("a checkpoint's root is a 32-byte hash")
        if any(not e or "\n" in e for e in self.extensions):
            raise ValueError("a checkpoint's extension lines are non-empty lines")

    def body(self) -> str:
        """The note text: origin, size, base64 root (and extensions), one per line."""
        lines = [self.origin, str(self.size), b64encode(self.root), *self.extensions]
        text = "\n".join(lines) + "\n"
        check_text(text)
        return text

    def sign(self, signers: Sequence[NoteSigner]) -> str:
        """The signed note of this checkpoint."""
        return sign_note(self.body(), signers)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """Parse a checkpoint's note text strictly (``TlogError``, MALFORMED)."""
        check_text(text)
        lines = text[:-1].split("\n")
        if len(lines) < 3 or any(not line for line in lines):
            raise _malformed("a checkpoint is at least three non-empty lines: origin, tree "
                             "size, root")
        return cls(lines[0], _decimal(lines[1], "the tree size"),
                   _hash(lines[2], "the root hash"), tuple(lines[3:]))


def open_checkpoint(msg: str | bytes, verifiers: Sequence[NoteVerifier],
                    origin: str | None = None) -> tuple[Checkpoint, OpenedNote]:
    """A checkpoint whose note a held key signed (and of ``origin``, when given).

    Raises
    ------
    TlogError
        MALFORMED, BAD_SIGNATURE or UNKNOWN_KEY.
    """
    opened = open_note(msg, verifiers)
    cp = Checkpoint.parse(opened.text)
    if origin is not None and cp.origin != origin:
        raise _malformed(f"the checkpoint is of log {cp.origin!r}, not {origin!r}")
    return cp, opened


def read_checkpoint_unverified(msg: str) -> Checkpoint:
    """The checkpoint of a note or of a bare body, its signatures NOT checked (what a
    verifier without the key can still compare with a log; say so when used)."""
    if "\n\n" in msg:
        return Checkpoint.parse(parse_note(msg).text)
    return Checkpoint.parse(msg)


# ------------------------------------------------------------------ proof files
@dataclass(frozen=True)
class ProofFile:
    """A parsed ``c2sp.org/tlog-proof@v1`` file (nothing verified yet)."""

    index: int
    path: tuple[bytes, ...]
    checkpoint: str  # the signed note, verbatim
    extra: bytes | None = None


def proof_text(index: int, path: Sequence[bytes], checkpoint_note: str,
               extra: bytes | None = None) -> str:
    """The text of a ``.tlog-proof`` file."""
    if not isinstance(index, int) or index < 0:
        raise ValueError(f"index must be a count, got {index!r}")
    parse_note(checkpoint_note)  # a signed note, or refused here
    lines = [PROOF_HEADER]
    if extra is not None:
        lines.append(f"extra {b64encode(extra)}")
    lines.append(f"index {index}")
    lines += [b64encode(h) for h in path]
    return "\n".join(lines) + "\n\n" + checkpoint_note


def parse_proof(text: str | bytes) -> ProofFile:
    """Parse a ``.tlog-proof`` file strictly (``TlogError``, MALFORMED)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("a proof file is UTF-8 text") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise _malformed("no blank line between the inclusion proof and the checkpoint")
    lines = head.split("\n")
    if lines[0] != PROOF_HEADER:
        raise _malformed(f"the first line is not {PROOF_HEADER!r}")
    i, extra = 1, None
    if i < len(lines) and lines[i].startswith("extra "):
        extra = b64decode(lines[i][len("extra "):], "the extra data")
        i += 1
    if i >= len(lines) or not lines[i].startswith("index "):
        raise _malformed("no 'index N' line")
    index = _decimal(lines[i][len("index "):], "the index")
    path = tuple(_hash(h, f"inclusion proof line {k + 1}") for k, h in enumerate(lines[i + 1:]))
    parse_note(note)
    return ProofFile(index, path, note, extra)


def verify_proof(text: str | bytes | ProofFile, entry: bytes,
                 verifiers: Sequence[NoteVerifier], origin: str | None = None) -> Checkpoint:
    """Check a ``.tlog-proof``: its checkpoint signed by a held key (of ``origin``, when
    given), and ``entry`` (the exact bytes logged) at its index under that root.

    Returns
    -------
    Checkpoint
        The checkpoint the entry is proved in.

    Raises
    ------
    TlogError
        MALFORMED, BAD_SIGNATURE, UNKNOWN_KEY or INCLUSION_FAILED.
    """
    proof = text if isinstance(text, ProofFile) else parse_proof(text)
    cp, _ = open_checkpoint(proof.checkpoint, verifiers, origin)
    got = root_from_inclusion(leaf_hash(entry), proof.index, cp.size, proof.path)
    if got is None:
        raise TlogError(Verdict.INCLUSION_FAILED, f"a path of {len(proof.path)} hashes "
                        f"cannot prove index {proof.index} in a tree of {cp.size}")
    if got != cp.root:
        raise TlogError(Verdict.INCLUSION_FAILED, f"the entry at index {proof.index} and "
                        "the path lead to another root than the checkpoint's")
    return cp


# ------------------------------------------------------------------ consistency
def consistency_proof_text(proof: Sequence[bytes]) -> str:
    """A consistency proof as text: one base64 hash per line."""
    return "".join(b64encode(h) + "\n" for h in proof)


def parse_consistency_proof(text: str) -> list[bytes]:
    """The hashes of :func:`consistency_proof_text` (``TlogError``, MALFORMED)."""
    if text and not text.endswith("\n"):
        raise _malformed("a consistency proof ends with a newline")
    return [_hash(h, f"consistency proof line {k + 1}")
            for k, h in enumerate(text[:-1].split("\n") if text else [])]


def verify_consistency_between(old: str | bytes, new: str | bytes, proof: Sequence[bytes],
                               verifiers: Sequence[NoteVerifier]) -> tuple[Checkpoint,
                                                                           Checkpoint]:
    """Check that the signed checkpoint ``new`` extends ``old`` (same origin, a size not
    smaller, the proof of RFC 9162 §2.1.4 between the roots).

    Raises
    ------
    TlogError
        MALFORMED, BAD_SIGNATURE, UNKNOWN_KEY or CONSISTENCY_FAILED.
    """
    cp_old, _ = open_checkpoint(old, verifiers)
    cp_new, _ = open_checkpoint(new, verifiers, cp_old.origin)
    if cp_new.size < cp_old.size:
        raise TlogError(Verdict.CONSISTENCY_FAILED, f"the new checkpoint ({cp_new.size} "
                        f"entries) is smaller than the old ({cp_old.size})")
    if not verify_consistency(cp_old.size, cp_new.size, proof, cp_old.root, cp_new.root):
        raise TlogError(Verdict.CONSISTENCY_FAILED, f"the proof does not show the tree of "
                        f"{cp_old.size} entries a prefix of the tree of {cp_new.size}: the "
                        "log's history was rewritten, or the proof is wrong")
    return cp_old, cp_new


# ------------------------------------------------------------------ svattn's logs
def log_origin(open_entry: bytes) -> str:
    """The origin of an svattn audit log: ``svattn.audit/`` and the first 32 hex digits
    of the SHA-256 of its first entry (the ``open`` record, which holds its creation
    time): one name per log, that the log itself proves."""
    return ORIGIN_PREFIX + hashlib.sha256(open_entry).hexdigest()[:32]


def controller_key_name(public_key: Ed25519PublicKey) -> str:
    """The note key name of a controller's key: ``svattn.controller/`` and the first 16
    hex digits of its fingerprint (SHA-256 of the raw key): one verifier key
    (``svattn keygen``'s ``PREFIX.vkey``) checks every log the key signs."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_NAME_PREFIX + hashlib.sha256(raw).hexdigest()[:16]


def controller_signer(private_key: Ed25519PrivateKey) -> NoteSigner:
    """The note signer of a controller's Ed25519 key."""
    return NoteSigner(controller_key_name(private_key.public_key()), private_key)


def controller_verifier(public_key: Ed25519PublicKey) -> NoteVerifier:
    """The note verifier key of a controller's Ed25519 public key."""
    return NoteVerifier.from_public_key(controller_key_name(public_key), public_key)


def log_signers(origin: str, signer: NoteSigner) -> list[NoteSigner]:
    """Who signs a log's checkpoint: the controller's key under the log's origin as its
    key name (C2SP tlog-checkpoint: the log's key name SHOULD match the origin), then
    the same key under its controller name (:func:`controller_key_name`), so that the
    one verifier key ``svattn keygen`` writes checks every log the key signs, and
    checkpoints signed before the origin-named signature still verify."""
    return [NoteSigner(origin, signer.private_key), signer]


def log_verifier(origin: str, public_key: Ed25519PublicKey) -> NoteVerifier:
    """The verifier key of the log ``origin`` (key name = origin): ``svattn audit vkey``."""
    return NoteVerifier.from_public_key(origin, public_key)


def checkpoint_path(log: str | os.PathLike[str]) -> Path:
    """Where a log's latest checkpoint is kept: ``LOG.checkpoint``."""
    return Path(f"{os.fspath(log)}{CHECKPOINT_SUFFIX}")


class CheckpointWriter:
    """The tree of a log being written, and its checkpoint file (rewritten atomically
    after each append: temporary file, fsync, rename, fsync of the folder).

    The checkpoint is signed with ``signer`` when there is one; without, the file holds
    the bare checkpoint body, which a verifier names as unsigned (authenticity unchecked).
    """

    def __init__(self, log: str | os.PathLike[str], signer: NoteSigner | None) -> None:
        self.file = checkpoint_path(log)
        self.signer = signer
        self.tree = CompactRange()
        self.origin: str | None = None

    def add(self, entry: bytes) -> None:
        """Append one entry (a log line's bytes, without its newline)."""
        if self.tree.size == 0:
            self.origin = log_origin(entry)
        self.tree.append(leaf_hash(entry))

    def text(self) -> str:
        """The current checkpoint: a signed note, or the bare body when unsigned."""
        if self.origin is None:
            raise ValueError("an empty log has no checkpoint")
        cp = Checkpoint(self.origin, self.tree.size, self.tree.root())
        return cp.sign(log_signers(self.origin, self.signer)) if self.signer is not None \
            else cp.body()

    def write(self) -> str:
        """Replace the checkpoint file with :meth:`text` atomically; return the text."""
        text = self.text()
        tmp = self.file.with_name(f".{self.file.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.file)
        try:
            dfd = os.open(self.file.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:  # the rename is done: unsynced, a crash may bring back the previous
            pass  # checkpoint, which the log extends (as after a crash before this rewrite:
            # verifiers name the entries after it, and the next append rewrites it)
        return text

    def mark(self) -> tuple[CompactRange, str | None]:
        """Where the tree stands (for :meth:`restore`)."""
        return self.tree.copy(), self.origin

    def restore(self, mark: tuple[CompactRange, str | None]) -> None:
        """Back to ``mark`` (the caller rewrites the file)."""
        tree, self.origin = mark
        self.tree = tree.copy()


__all__ = ["CHECKPOINT_SUFFIX", "KEY_NAME_PREFIX", "ORIGIN_PREFIX", "PROOF_HEADER", "Checkpoint",
           "CheckpointWriter", "ProofFile", "checkpoint_path", "consistency_proof_text",
           "controller_key_name", "controller_signer", "controller_verifier", "log_origin",
           "log_signers", "log_verifier", "open_checkpoint", "parse_consistency_proof",
           "parse_proof", "proof_text", "read_checkpoint_unverified",
           "verify_consistency_between", "verify_proof"]
