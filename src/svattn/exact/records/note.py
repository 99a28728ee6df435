"""C2SP signed notes with Ed25519 keys, and the verdicts of the transparency log's checks.

A signed note (https://c2sp.org/signed-note, the format of Go's
``golang.org/x/mod/sumdb/note``) is a UTF-8 text ending in a newline, a blank line,
then one or more signature lines::

    <text ending in "\\n">
    <blank line>
    — <key name> base64(4-byte key ID || 64-byte Ed25519 signature of the text)

* the key ID is ``SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4]``
  (big-endian; ``0x01`` is the Ed25519 signature type);
* a verifier key is the string ``<name>+<8 lowercase hex digits of the key ID>+
  base64(0x01 || public key)`` (``svattn keygen`` writes it as ``PREFIX.vkey``);
* parsing is strict: a note with a control character other than newline, invalid
  UTF-8, no blank line before its signatures, a signature line not of the form above
  (an invalid name, non-canonical base64, fewer than 5 bytes) or more than
  :data:`MAX_SIGNATURES` signatures is :attr:`Verdict.MALFORMED`;
* opening a note (:func:`open_note`): signatures by keys the verifier does not hold
  (a witness's cosignature, say) are ignored, as the spec requires; one that a held
  key does not verify refuses the whole note (:attr:`Verdict.BAD_SIGNATURE`); a note
  that no held key signed is :attr:`Verdict.UNKNOWN_KEY`.

Examples
--------
>>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
>>> signer = NoteSigner("example.com/log", Ed25519PrivateKey.generate())
>>> msg = sign_note("hello\\n", [signer])
>>> vkey = signer.verifier().to_string()
>>> opened = open_note(msg, [NoteVerifier.from_string(vkey)])
>>> opened.text, [s.name for s in opened.verified]
('hello\\n', ['example.com/log'])
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519 = 0x01  # the signature type byte of Ed25519 (C2SP signed-note, "Signature types")
MAX_SIGNATURES = 100  # the spec asks for at least 16; Go's note refuses more than 100
SIG_PREFIX = "— "  # em dash, space


class Verdict(enum.Enum):
    """Why a checkpoint, note or proof was refused (or that it was accepted)."""

    ACCEPTED = "accepted"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad signature"
    UNKNOWN_KEY = "unknown key"
    INCLUSION_FAILED = "inclusion failed"
    CONSISTENCY_FAILED = "consistency failed"


class TlogError(ValueError):
    """A note, checkpoint or proof refused: ``verdict`` says why, the message how."""

    def __init__(self, verdict: Verdict, reason: str) -> None:
        super().__init__(f"{verdict.value}: {reason}")
        self.verdict = verdict
        self.reason = reason


def _malformed(reason: str) -> TlogError:
    return TlogError(Verdict.MALFORMED, reason)


def b64encode(data: bytes) -> str:
    """Standard base64 (RFC 4648 §4) with padding."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, what: str) -> bytes:
    """Strict standard base64: the canonical encoding only (padding, no stray bits)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise _malformed(f"{what} is not base64") from None
    if not text or b64encode(raw) != text:
        raise _malformed(f"{what} is not canonical base64")
    return raw


def valid_name(name: str) -> bool:
    """A key name: non-empty, no Unicode space and no plus (U+002B), no control character."""
    return (isinstance(name, str) and name != "" and "+" not in name
            and not any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in name))


def key_id(name: str, public_key: bytes) -> int:
    """``SHA-256(name || 0x0A || 0x01 || public key)[:4]`` as a big-endian integer."""
    digest = hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519]) + public_key)
    return int.from_bytes(digest.digest()[:4], "big")


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# ------------------------------------------------------------------ keys
@dataclass(frozen=True)
class NoteVerifier:
    """A note verifier key: a name, its key ID and an Ed25519 public key."""

    name: str
    key_id: int
    public_key: bytes  # 32 raw bytes

    @classmethod
    def from_public_key(cls, name: str, public_key: Ed25519PublicKey) -> NoteVerifier:
        """The verifier key of ``public_key`` under ``name``."""
        if not valid_name(name):
            raise ValueError(f"key name {name!r} is empty or holds a space or a plus")
        raw = _raw(public_key)
        return cls(name, key_id(name, raw), raw)

    @classmethod
    def from_string(cls, vkey: str) -> NoteVerifier:
        """Parse ``<name>+<hex key ID>+<base64(0x01 || public key)>`` (strict: refuses a
        key ID that is not the key's, another signature type, another key length)."""
        parts = vkey.split("+", 2) if isinstance(vkey, str) else []  # base64 may hold "+"
        if len(parts) != 3:
            raise _malformed("a verifier key is <name>+<hex key id>+<base64 key>")
        name, hex_id, key64 = parts
        if not valid_name(name):
            raise _malformed(f"verifier key name {name!r} is invalid")
        if not re.fullmatch(r"[0-9a-f]{8}", hex_id):
            raise _malformed("a verifier key's id is 8 lowercase hex digits")
        key = b64decode(key64, "the verifier key")
        if len(key) != 33 or key[0] != ED25519:
            raise _malformed("the verifier key is not an Ed25519 key (0x01 and 32 bytes)")
        if int(hex_id, 16) != key_id(name, key[1:]):
            raise _malformed("the verifier key's id is not the hash of its name and key")
        return cls(name, int(hex_id, 16), key[1:])

    def to_string(self) -> str:
        """``<name>+<8 hex digits>+<base64(0x01 || public key)>``."""
        return f"{self.name}+{self.key_id:08x}+{b64encode(bytes([ED25519]) + self.public_key)}"

    def verify(self, text: bytes, signature: bytes) -> bool:
        """Whether ``signature`` (64 bytes, without the key ID) signs ``text``."""
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, text)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class NoteSigner:
    """A name and an Ed25519 private key that sign notes."""

    name: str
    private_key: Ed25519PrivateKey

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise ValueError(f"key name {self.name!r} is empty or holds a space or a plus")

    def verifier(self) -> NoteVerifier:
        """The matching verifier key."""
        return NoteVerifier.from_public_key(self.name, self.private_key.public_key())

    def signature_line(self, text: str) -> str:
        """``— <name> base64(key ID || signature)`` of ``text``, with its newline."""
        sig = self.private_key.sign(text.encode("utf-8"))
        blob = self.verifier().key_id.to_bytes(4, "big") + sig
        return f"{SIG_PREFIX}{self.name} {b64encode(blob)}\n"


# ------------------------------------------------------------------ notes
@dataclass(frozen=True)
class NoteSignature:
    """One signature line: the key name, the key ID and the signature bytes."""

    name: str
    key_id: int
    signature: bytes
    line: str  # without its newline


@dataclass(frozen=True)
class ParsedNote:
    """A note's text and its signatures (none verified yet)."""

    text: str
    signatures: tuple[NoteSignature, ...]


@dataclass(frozen=True)
class OpenedNote:
    """A note whose text at least one held key signed."""

    text: str
    verified: tuple[NoteSignature, ...]
    unverified: tuple[NoteSignature, ...]  # by keys not held (witnesses, rotated keys)


def check_text(text: str) -> None:
    """Refuse a note text that is not UTF-8 text ending in a newline without control
    characters (``ValueError``)."""
    if not isinstance(text, str) or not text.endswith("\n"):
        raise _malformed("a note text ends with a newline")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise _malformed("a note holds no control character but newline")


def sign_note(text: str, signers: Sequence[NoteSigner]) -> str:
    """The signed note of ``text`` (its signature lines in the order of ``signers``)."""
    check_text(text)
    if not signers:
        raise ValueError("a signed note needs at least one signer")
    return text + "\n" + "".join(s.signature_line(text) for s in signers)


def add_signatures(msg: str, signers: Sequence[NoteSigner]) -> str:
    """``msg`` (a signed note) with signature lines of ``signers`` added, as a witness
    cosigns a checkpoint."""
    note = parse_note(msg)
    return msg + "".join(s.signature_line(note.text) for s in signers)


def parse_note(msg: str | bytes) -> ParsedNote:
    """Split a signed note into its text and signatures, strictly (C2SP signed-note).

    Raises
    ------
    TlogError
        :attr:`Verdict.MALFORMED`, naming what is wrong.
    """
    if isinstance(msg, bytes):
        try:
            msg = msg.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("a note is UTF-8 text") from None
    if not isinstance(msg, str):
        raise _malformed("a note is text")
    if any(ord(c) < 0x20 and c != "\n" for c in msg) or any(
            0xD800 <= ord(c) <= 0xDFFF for c in msg):
        raise _malformed("a note holds no control character but newline")
    split = msg.rfind("\n\n")
    if split < 0:
        raise _malformed("no blank line before the signatures")
    text, block = msg[:split + 1], msg[split + 2:]
    if not block or not block.endswith("\n"):
        raise _malformed("the signature lines end with a newline, and there is at least one")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise _malformed(f"more than {MAX_SIGNATURES} signatures")
    sigs = []
    for i, line in enumerate(lines):
        if not line.startswith(SIG_PREFIX):
            raise _malformed(f"signature line {i + 1} does not start with an em dash and a space")
        name, sep, b64 = line[len(SIG_PREFIX):].partition(" ")
        if not sep or not valid_name(name):
            raise _malformed(f"signature line {i + 1}: invalid key name {name!r}")
        blob = b64decode(b64, f"signature line {i + 1}'s signature")
        if len(blob) < 5:
            raise _malformed(f"signature line {i + 1}: a signature is a key id and 1+ bytes")
        sigs.append(NoteSignature(name, int.from_bytes(blob[:4], "big"), blob[4:], line))
    return ParsedNote(text, tuple(sigs))


def open_note(msg: str | bytes, verifiers: Sequence[NoteVerifier]) -> OpenedNote:
    """A note's text, when at least one of ``verifiers`` signed it and none that signed
    it fails (signatures by other keys are ignored, C2SP signed-note §Signatures).

    Raises
    ------
    TlogError
        :attr:`Verdict.MALFORMED`, :attr:`Verdict.BAD_SIGNATURE` (a held key's
        signature does not verify) or :attr:`Verdict.UNKNOWN_KEY` (no held key signed).
    """
    note = parse_note(msg)
    held = {(v.name, v.key_id): v for v in verifiers}
    verified, unverified, seen = [], [], set()
    for sig in note.signatures:
        v = held.get((sig.name, sig.key_id))
        if v is None:
            if sig.line not in seen:
                unverified.append(sig)
            seen.add(sig.line)
            continue
        if not v.verify(note.text.encode("utf-8"), sig.signature):
            raise TlogError(Verdict.BAD_SIGNATURE, f"the signature of {sig.name} "
                            f"(key {sig.key_id:08x}) does not verify: the note was edited "
                            "after signing, or signed by another key")
        if (sig.name, sig.key_id) not in {(s.name, s.key_id) for s in verified}:
            verified.append(sig)
    if not verified:
        names = ", ".join(f"{s.name}+{s.key_id:08x}" for s in note.signatures)
        want = ", ".join(f"{v.name}+{v.key_id:08x}" for v in verifiers) or "none"
        raise TlogError(Verdict.UNKNOWN_KEY, f"no key held signed the note (signed by "
                        f"{names}; keys held: {want})")
    return OpenedNote(note.text, tuple(verified), tuple(unverified))


__all__ = ["ED25519", "MAX_SIGNATURES", "NoteSignature", "NoteSigner", "NoteVerifier",
           "OpenedNote", "ParsedNote", "TlogError", "Verdict", "add_signatures", "b64decode",
           "b64encode", "check_text", "key_id", "open_note", "parse_note", "sign_note",
           "valid_name"]
