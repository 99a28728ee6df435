"""Signed deletion receipts: Ed25519 keys of the controller, via the ``cryptography`` package.

A memory given a signing key (``SVDDMemory(..., signing_key=...)``) signs every
deletion certificate it issues: ``signer`` is the SHA-256 of the public key, and
``signature`` covers every other field (:meth:`DeletionCertificate.signed_bytes`),
so any edited byte of a receipt fails verification. Verifying needs only the
public key, which the controller can hand to any third party (an auditor, the
data subject); the private key never enters a state file, a log or a pickle.

``svattn keygen PREFIX`` writes ``PREFIX.key`` (private, PKCS#8 PEM, mode 0600),
``PREFIX.pub`` (SubjectPublicKeyInfo PEM) and ``PREFIX.vkey`` (the C2SP note verifier key
of the audit log's checkpoints, :func:`svattn.exact.records.tlog.controller_verifier`).

Examples
--------
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> key = generate_key()
>>> mem = SVDDMemory(C=0.2, signing_key=key)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(30, 2)))
>>> cert = mem.remove(ids[0])
>>> signature_errors(cert, key.public_key())
[]
>>> import dataclasses
>>> signature_errors(dataclasses.replace(cert, removed_id=1), key.public_key())
['signature: does not verify (the receipt was edited after signing)']
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from svattn.exact.core.state import SlotState
from svattn.exact.records.certificate import commitment_key
from svattn.exact.records.tlog import controller_verifier


def generate_key() -> Ed25519PrivateKey:
    """A new Ed25519 private key (the controller's)."""
    return Ed25519PrivateKey.generate()


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """SHA-256 (hex) of the raw public key: the ``signer`` field of a receipt."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def write_keypair(prefix: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (private, mode 0600), ``PREFIX.pub`` and ``PREFIX.vkey`` (the
    note verifier key, one line); refuse to overwrite.

    Returns
    -------
    (private key path, public key path)
    """
    prefix = Path(prefix)
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    vkey_path = Path(f"{prefix}.vkey")
    for p in (key_path, pub_path, vkey_path):
        if p.exists():
            raise FileExistsError(f"{p} exists; keys are never overwritten (choose another prefix)")
    key = generate_key()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # never overwrite
    with os.fdopen(fd, "wb") as f:
        f.write(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    fd = os.open(vkey_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(controller_verifier(key.public_key()).to_string() + "\n")
    return key_path, pub_path


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (``ValueError`` naming the file otherwise)."""
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (``ValueError`` naming the file otherwise)."""
    data = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def _read(path, what: str) -> bytes:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such {what} file: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a {what} file")
    return path.read_bytes()


def derive_tag_key(key: Ed25519PrivateKey) -> bytes:
    """A 32-byte secret for keyed tag hashes, derived from the controller's signing key
    (HKDF-SHA256 with its own label: the two uses never share key material)."""
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"svattn data-subject tag key v1").derive(raw)


def tag_hash(tag_key: bytes, tag: str) -> bytes:
    """The keyed hash a memory keeps for a data subject's tag (HMAC-SHA256, 32 bytes)."""
    return hmac.new(tag_key, b"svattn-tag-v1|" + tag.encode("utf-8"), hashlib.sha256).digest()


def resolve_tag_key(tag_key, signing: Ed25519PrivateKey | None) -> bytes | None:
    """The tag key: ``tag_key`` itself (bytes, 16 or more), else one derived from the
    signing key, else None (the memory then refuses tags)."""
    if tag_key is not None:
        if not isinstance(tag_key, bytes) or len(tag_key) < 16:
            raise ValueError("tag_key must be a secret of at least 16 bytes")
        return tag_key
    return derive_tag_key(signing) if signing is not None else None


def check_key_id(held: str | None, given: str | None, where: str) -> None:
    """Refuse a key (``given``: its commitment key id) other than the one a state's tags
    and keyed commitments are under (``held``, the key id the state records): under
    another controller's key every tag would look unknown, and ``erase`` would tell a
    data subject that nothing is held. No key, or a state without one, passes."""
    if held is not None and given is not None and given != held:
        raise ValueError(
            f"{where}: the state's tags and commitments are under the controller's key "
            f"{held[:12]}…, and the key given (signing_key= or tag_key=) is another key "
            f"({given[:12]}…); use the key the state was saved with")


def no_tag_reason(ss: SlotState) -> str:
    """Why no live token of ``ss`` carries a tag: never added, or erased — or, in a state
    that holds tags but no key id (saved before states recorded it), possibly another
    key, which is then said (never "never added" where a wrong key cannot be ruled out)."""
    live = ss.live_slots()
    if ss.commit_key_id is None and len(live) and ss.tags[live].any():
        return ("no live token carries this tag under this memory's key; the state does "
                "not record which key its tags are under, so they may be under another "
                "key: load it with the controller's key (under that key, no live token "
                "of this subject is held)")
    return "no live token carries this tag (never added, or erased)"


def tag_hashes(tags, n: int, tag_key: bytes | None) -> list[bytes | None]:
    """Checked keyed hashes of ``n`` tags (a sequence of str or None), before any change."""
    if tags is None:
        return [None] * n
    if isinstance(tags, str) or len(tags) != n:
        raise ValueError(f"tags must be a sequence of {n} tags (str or None), one per row")
    if any(t is not None and not (isinstance(t, str) and t) for t in tags):
        raise TypeError("each tag must be a non-empty str or None")
    if tag_key is None and any(t is not None for t in tags):
        raise ValueError("tags are kept as keyed hashes, and this memory has no key: give "
                         "SVDDMemory(..., signing_key=...) or tag_key=")
    return [None if t is None else tag_hash(tag_key, t) for t in tags]


def subject_hash(tag: str | None, tag_hash: str | None, tag_key: bytes | None) -> bytes:
    """The keyed hash of a subject given by its ``tag`` or as ``tag_hash`` (hex): exactly
    one of them (``ValueError`` otherwise, or for a hash that is not 32 bytes of hex)."""
    if (tag is None) == (tag_hash is None):
        raise ValueError("give the subject's tag or its tag_hash (one of them)")
    if tag is not None:
        return tag_hashes([tag], 1, tag_key)[0]
    try:
        raw = bytes.fromhex(tag_hash)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"tag_hash must be 64 hex digits, got {str(tag_hash)[:80]!r}")
    return raw


def read_commit_key(path: str | os.PathLike[str]) -> bytes:
    """The commitment key an auditor checks keyed commitments with, from a file: the
    controller's private key (PEM; the key is derived as the memory derives it) or the
    key itself as hex (what a controller hands an auditor who must not sign)."""
    data = _read(path, "commitment key")
    if data.lstrip().startswith(b"-----BEGIN"):
        return commitment_key(derive_tag_key(load_private_key(path)))
    text = data.decode("ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(f"{path}: not a commitment key (a PEM private key, or 32+ hex digits)")
    return key


def signing_key(key: Ed25519PrivateKey | str | os.PathLike[str]) -> Ed25519PrivateKey:
    """``key`` itself, or the key in the PEM file it names."""
    if isinstance(key, Ed25519PrivateKey):
        return key
    if isinstance(key, (str, os.PathLike)):
        return load_private_key(key)
    raise TypeError(f"signing_key must be an Ed25519PrivateKey or a PEM file path, got "
                    f"{type(key).__name__}")


def sign(cert, key: Ed25519PrivateKey):
    """``cert`` (a :class:`DeletionCertificate` or an ``ErasureReceipt``) with ``signer``
    and ``signature`` set."""
    unsigned = dataclasses.replace(cert, signer=fingerprint(key.public_key()), signature=None)
    return dataclasses.replace(unsigned, signature=key.sign(unsigned.signed_bytes()).hex())


def signature_errors(cert, public_key: Ed25519PublicKey) -> list[str]:
    """Why ``cert`` is not a receipt signed by ``public_key``'s owner (empty: it is)."""
    if cert.signature is None:
        return ["signature: the receipt is not signed"]
    if cert.signer != fingerprint(public_key):
        return [f"signer: signed by another key ({str(cert.signer)[:16]}…), not by "
                f"{fingerprint(public_key)[:16]}…"]
    try:
        public_key.verify(bytes.fromhex(cert.signature), cert.signed_bytes())
    except (InvalidSignature, ValueError):
        return ["signature: does not verify (the receipt was edited after signing)"]
    return []


__all__ = ["check_key_id", "derive_tag_key", "fingerprint", "generate_key", "load_private_key",
           "load_public_key", "no_tag_reason", "read_commit_key", "sign", "signature_errors",
           "signing_key", "subject_hash", "tag_hash", "resolve_tag_key", "tag_hashes",
           "write_keypair"]
