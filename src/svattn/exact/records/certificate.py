"""Deletion certificates: the record an exact removal issues.

A :class:`DeletionCertificate` is what :meth:`SVDDMemory.remove` hands to an
auditor: which id went, a commitment to its key and value (never the data itself,
and never anything that lets the data be guessed: see :func:`commit_token`), the
partition sizes before and after, the KKT residual after, whether the optimum is
unique, and a digest of the state it left. Checking one against a memory and a
retrain is the auditor's side, :func:`svattn.exact.auditor.verify.verify_deletion`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from svattn.exact.core.hashes import float64_zeroed, scrub_copies
from svattn.exact.records.receipts import FORM, LOG, OPTIMALITY, RESOLVE, SIGNATURE, STATE

CERTIFICATE_VERSION = 2  # 2: commitments without a salt beside them (keyed or opaque)
KEYED, OPAQUE = "hmac-sha256", "opaque"  # the two commitment schemes (commit_token)
_HEX = frozenset("0123456789abcdef")
_COMMIT_LABEL = b"svattn-commit-v2|"  # the first bytes of every committed body


def commit_token(key: np.ndarray, value: np.ndarray | None, commit_key: bytes | None
                 ) -> tuple[str, str]:
    """A token's commitment (hex) and its scheme.

    With the controller's ``commit_key`` (:func:`commitment_key`): HMAC-SHA256 of the
    key and value, ``"hmac-sha256"`` — equal data gives equal commitments, so copies
    and re-entries are visible, and nobody without the key can test a guess. Without
    a key: SHA-256 under a random 16-byte nonce that is never stored, ``"opaque"`` —
    it links a certificate to its log record and reveals nothing, not even equality.
    Either way no salt sits beside a commitment: a log or a receipt alone never lets
    a low-entropy record (a quantised vital sign) be brute-forced.

    Examples
    --------
    >>> import numpy as np
    >>> c, scheme = commit_token(np.zeros(2), None, b"k" * 32)
    >>> len(c), scheme, c == commit_token(-np.zeros(2), None, b"k" * 32)[0]
    (64, 'hmac-sha256', True)
    >>> c == commit_token(np.zeros(1), np.zeros(1), b"k" * 32)[0]  # another split
    False
    >>> commit_token(np.zeros(2), None, None)[1]
    'opaque'
    """
    k = float64_zeroed(key)
    v = b"" if value is None else float64_zeroed(value)
    try:
        return commit_digest(k, v, commit_key).hex(), OPAQUE if commit_key is None else KEYED
    finally:
        scrub_copies(k, v)


def commit_digest(kz, vz, commit_key: bytes | None, *, nonce: bytes | None = None) -> bytes:
    """:func:`commit_token`'s commitment, as its 32 bytes, of a token's key and value
    given as float64 bytes in C order with -0.0 written as 0.0 (b"" for no value), or as
    C-contiguous float64 arrays hashed in place (no copy of the data is made). Without
    a ``commit_key``, under ``nonce`` (16 random bytes; drawn here when None)."""
    # the lengths first: a key and value split elsewhere must not commit alike
    head = b"".join([_COMMIT_LABEL, memoryview(kz).nbytes.to_bytes(8, "big"),
                     memoryview(vz).nbytes.to_bytes(8, "big")])
    if commit_key is None:
        h = hashlib.sha256((secrets.token_bytes(16) if nonce is None else nonce) + head)
    else:
        h = hmac.new(commit_key, head, hashlib.sha256)
    h.update(kz)
    h.update(vz)
    return h.digest()


def commit_tokens(keys: np.ndarray, values: np.ndarray | None, commit_key: bytes | None
                  ) -> list[str]:
    """:func:`commit_token` of each row of ``keys`` (n, d) and ``values`` (n, dv) (hex),
    with the rows converted once (each hashed in place, the copies zeroed after) and,
    without a key, the nonces drawn at once (each still random, independent and never
    stored): an extend's commitments in one pass. ``tests/exact/test_fastpath.py`` holds
    it equal to :func:`commit_token`."""
    k = float64_zeroed(keys)
    v = None if values is None else float64_zeroed(values)
    try:
        if commit_key is None:
            nonces = secrets.token_bytes(16 * len(k))
            return [commit_digest(k[r], b"" if v is None else v[r], None,
                                  nonce=nonces[16 * r:16 * (r + 1)]).hex()
                    for r in range(len(k))]
        return [commit_digest(k[r], b"" if v is None else v[r], commit_key).hex()
                for r in range(len(k))]
    finally:
        scrub_copies(k, v)


def commitment_key_id(commit_key: bytes | None) -> str | None:
    """A public name of a commitment key (32 hex digits, HMAC with its own label): a
    state records which key its keyed commitments are under, never the key."""
    if commit_key is None:
        return None
    return hmac.new(commit_key, b"svattn commitment key id", hashlib.sha256).hexdigest()[:32]


def commitment_key(tag_key: bytes | None) -> bytes | None:
    """The key of keyed commitments, derived from the controller's tag key (HMAC with
    its own label: an auditor given it can check commitments but not tags)."""
    if tag_key is None:
        return None
    return hmac.new(tag_key, b"svattn commitment key v1", hashlib.sha256).digest()


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


@dataclass(frozen=True)
class DeletionCertificate:
    """Proof-carrying record of one exact removal.

    Attributes
    ----------
    removed_id : int
    commitment : str
        The removed key and value's commitment, as the memory made it when the token
        was added (the log's add record carries the same): see :func:`commit_token`.
    commitment_scheme : str
        ``"hmac-sha256"`` (keyed by the controller) or ``"opaque"`` (a memory
        without a key).
    live_copies : list of int
        Live tokens that held the same key and value when the token was removed (the
        memory's own check; for a plain removal it must be empty to verify, for an
        erasure they are the subject's other tokens or other subjects' copies).
    partition_before, partition_after : dict
        Sizes of the ``margin``, ``error`` and ``reserve`` sets.
    kkt_residual_after : float
        Largest KKT violation after the removal (units of the largest K_ii).
    n_events : int
        Solver events the removal took: each token that changed set on the way,
        plus the removed token's exit (0: reserve token or warm-up; -1: the
        memory fell back to an exact batch re-solve). Along the solution path
        these are its events; a path followed on a working set counts the set
        changes of the end it reached.
    unique_optimum : bool
        Whether exactness of alpha is claimed: the optimum is unique and the state
        meets the KKT conditions to the memory's ``tol``. False for duplicate keys
        (alpha is then determined only up to its split among the copies of a key:
        the decision function and each group's sum are unique, the memory keeps one
        member of a group free and the others at a bound, ``docs/design.md`` §3) and
        for near-copies that leave the residual above ``tol``; the decision function
        is still checked, and an oracle cross-check compares the groups' sums.
    state_digest : str
        :meth:`SVDDMemory.state_digest` after the removal.
    C, kernel, gamma
        The memory's parameters.
    issued_at : str
        UTC time of issue (ISO 8601).
    version : int
    compacted : int
        Tokens :meth:`SVDDMemory.compact` had dropped before this removal (−1:
        unknown). When > 0 the removal is exact relative to the tokens the memory
        kept, not to the stream it saw: a dropped token might have re-entered the
        support had it been kept.
    signer, signature : str or None
        For a memory with a signing key (:mod:`svattn.exact.records.signing`): the SHA-256 of
        the controller's Ed25519 public key and the signature (hex) over every other
        field (:meth:`signed_bytes`); any edited byte fails its verification.
    """

    # What binds each field (svattn.exact.records.receipts; docs/design.md, "Receipts: fields and
    # what checks each"). "state" only where the state right after the removal pins the
    # field: an id the memory issued and removed, a commitment, a copy list, sizes before,
    # an event count or a time are its own word, bound only by the log or the signature.
    # The KKT residual and uniqueness are recomputed from the keys ("optimality"), not
    # read from the memory's own account of them.
    CHECKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "removed_id": (LOG, SIGNATURE),
        "commitment": (LOG, SIGNATURE),
        "commitment_scheme": (LOG, SIGNATURE),
        "live_copies": (LOG, SIGNATURE),
        "partition_before": (LOG, SIGNATURE),
        "partition_after": (STATE, LOG, SIGNATURE),
        "kkt_residual_after": (OPTIMALITY, LOG, SIGNATURE),
        "n_events": (LOG, SIGNATURE),
        "unique_optimum": (OPTIMALITY, LOG, SIGNATURE),
        "state_digest": (STATE, LOG, SIGNATURE),
        "C": (STATE, LOG, SIGNATURE),
        "kernel": (STATE, LOG, SIGNATURE),
        "gamma": (STATE, LOG, SIGNATURE),
        "issued_at": (LOG, SIGNATURE),
        "version": (FORM,),
        "compacted": (STATE, LOG, SIGNATURE),
        "signer": (LOG, SIGNATURE),
        "signature": (LOG, SIGNATURE),
    }
    CLAIMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "exact optimum of the remaining tokens": (OPTIMALITY, RESOLVE)}

    removed_id: int
    commitment: str
    commitment_scheme: str
    live_copies: list[int]
    partition_before: dict[str, int]
    partition_after: dict[str, int]
    kkt_residual_after: float
    n_events: int
    unique_optimum: bool
    state_digest: str
    C: float
    kernel: str
    gamma: float
    # ISO 8601 in UTC, as datetime's isoformat(timespec="seconds") writes it; time.gmtime
    # is what a removal can afford (datetime.now(UTC) costs ~20 µs on a cold cache)
    issued_at: str = field(default_factory=_now_iso)
    version: int = CERTIFICATE_VERSION
    compacted: int = 0
    signer: str | None = None
    signature: str | None = None

    @classmethod
    def issue(cls, **fields: Any) -> DeletionCertificate:
        """Construct from every field but ``issued_at`` and ``version`` (set here),
        without the dataclass ``__init__``: the removal's hot path, where each
        interpreted call runs on caches the solver has just evicted (~5 µs less
        per removal at n = 4k). The result is an ordinary frozen certificate."""
        cert = object.__new__(cls)
        cert.__dict__.update(fields, issued_at=_now_iso(), version=CERTIFICATE_VERSION,
                             signer=None, signature=None)
        return cert

    def signed_bytes(self) -> bytes:
        """What a signature covers: the canonical JSON of every field but ``signature``."""
        return _signed_bytes(b"svattn-deletion-certificate-v1|", self)

    def to_json(self) -> str:
        """Serialise to a JSON string (round-trips through :meth:`from_json`)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeletionCertificate:
        """Parse a certificate written by :meth:`to_json`; precise errors on bad input."""
        data = json_fields(text, cls, "certificate",
                            optional={"issued_at", "version", "compacted", "signer", "signature"})
        if data.get("version", CERTIFICATE_VERSION) != CERTIFICATE_VERSION:
            raise ValueError(
                f"certificate version {data['version']} is not supported "
                f"(expected {CERTIFICATE_VERSION})"
            )
        cert = cls(**data)
        errs = cert.field_errors()
        if errs:
            raise ValueError("certificate: " + "; ".join(errs))
        return cert

    def matches_token(self, key: np.ndarray, value: np.ndarray | None = None, *,
                      commit_key: bytes) -> bool:
        """True when ``key``/``value`` are the token this (keyed) certificate committed
        to; only the holder of the commitment key can tell."""
        if self.commitment_scheme != KEYED:
            raise ValueError("an opaque commitment cannot be opened (the memory had no key)")
        return hmac.compare_digest(commit_token(key, value, commit_key)[0], self.commitment)

    def field_errors(self) -> list[str]:
        """Fields of the wrong type or form, each named (empty list when well-formed)."""
        errs = []

        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def real(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)

        def hexdigits(v, n: int) -> bool:
            return isinstance(v, str) and len(v) == n and all(c in _HEX for c in v)

        if not (integer(self.removed_id) and self.removed_id >= 0):
            errs.append(f"removed_id must be an int >= 0, got {self.removed_id!r}")
        if not hexdigits(self.commitment, 64):
            errs.append("commitment must be 64 lowercase hex digits (a SHA-256)")
        if self.commitment_scheme not in (KEYED, OPAQUE):
            errs.append(f"commitment_scheme must be {KEYED!r} or {OPAQUE!r}, got "
                        f"{self.commitment_scheme!r}")
        if not (isinstance(self.live_copies, list)
                and all(integer(t) and t >= 0 for t in self.live_copies)):
            errs.append(f"live_copies must be a list of ids, got {self.live_copies!r}")
        if not hexdigits(self.state_digest, 64):
            errs.append("state_digest must be 64 lowercase hex digits (a SHA-256)")
        for name in ("partition_before", "partition_after"):
            part = getattr(self, name)
            if not (isinstance(part, dict) and set(part) == {"margin", "error", "reserve"}
                    and all(integer(v) and v >= 0 for v in part.values())):
                errs.append(f"{name} must map margin/error/reserve to counts >= 0")
        if not (real(self.kkt_residual_after) and self.kkt_residual_after >= 0):
            errs.append(f"kkt_residual_after must be a number >= 0, got "
                        f"{self.kkt_residual_after!r}")
        if not (integer(self.n_events) and self.n_events >= -1):
            errs.append(f"n_events must be an int >= -1, got {self.n_events!r}")
        if not isinstance(self.unique_optimum, bool):
            errs.append(f"unique_optimum must be true or false, got {self.unique_optimum!r}")
        if not (real(self.C) and self.C > 0):
            errs.append(f"C must be a number > 0, got {self.C!r}")
        if self.kernel not in ("rbf", "exp"):
            errs.append(f"kernel must be 'rbf' or 'exp', got {self.kernel!r}")
        if not (real(self.gamma) and self.gamma > 0):
            errs.append(f"gamma must be a number > 0, got {self.gamma!r}")
        if not isinstance(self.issued_at, str):
            errs.append(f"issued_at must be an ISO 8601 string, got {self.issued_at!r}")
        if self.version != CERTIFICATE_VERSION:
            errs.append(f"version must be {CERTIFICATE_VERSION}, got {self.version!r}")
        if not (integer(self.compacted) and self.compacted >= -1):
            errs.append(f"compacted must be an int >= -1, got {self.compacted!r}")
        if (self.signer is None) != (self.signature is None):
            errs.append("signer and signature come together (both or neither)")
        elif self.signer is not None and not (hexdigits(self.signer, 64)
                                              and hexdigits(self.signature, 128)):
            errs.append("signer must be 64 and signature 128 lowercase hex digits (Ed25519)")
        return errs

    def consistency_errors(self) -> list[str]:
        """Problems of form (:meth:`field_errors`) and internal consistency (empty list
        when the certificate is well-formed and consistent with itself)."""
        errs = self.field_errors()
        if errs:
            return errs
        for name in ("partition_before", "partition_after"):
            part = getattr(self, name)
            if set(part) != {"margin", "error", "reserve"} or any(
                not isinstance(v, int) or v < 0 for v in part.values()
            ):
                errs.append(f"{name} must map margin/error/reserve to counts >= 0")
        if not errs:
            nb = sum(self.partition_before.values())
            na = sum(self.partition_after.values())
            if na != nb - 1:
                errs.append(f"sizes do not drop by one token ({nb} -> {na})")
        return errs




@dataclass(frozen=True)
class ErasureReceipt:
    """One receipt for one erasure request: every live token of a data subject, removed.

    Attributes
    ----------
    tag_hash : str
        The subject's tag as the memory keeps it: HMAC-SHA256 under the controller's
        tag key (hex), never the tag itself.
    erased_ids : list of int
        The tokens removed, in id order.
    certificates : list of dict
        Each removal's :class:`DeletionCertificate`, as a dict, in the same order.
    copies_kept : dict
        For an erased id, the live ids of *other* subjects (or untagged) that hold
        the same key and value: that data is theirs and stays.
    state_digest : str
        The memory's digest after the last removal.
    n_after : int
        Tokens left.
    issued_at : str
    version : int
    signer, signature : str or None
        As in :class:`DeletionCertificate` (signed over :meth:`signed_bytes`).
    """

    # What binds each field (svattn.exact.records.receipts). The log binds every field through
    # its erase record (tag hash, ids, signer, signature and the receipt's SHA-256) and
    # the removal records before it (each certificate); a log without the receipt's hash
    # (older) binds copies_kept and issued_at only through the signature.
    CHECKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "tag_hash": (LOG, SIGNATURE),
        "erased_ids": (LOG, SIGNATURE),
        "certificates": (LOG, SIGNATURE),
        "copies_kept": (LOG, SIGNATURE),
        "state_digest": (STATE, LOG, SIGNATURE),
        "n_after": (STATE, LOG, SIGNATURE),
        "issued_at": (LOG, SIGNATURE),
        "version": (FORM,),
        "signer": (LOG, SIGNATURE),
        "signature": (LOG, SIGNATURE),
    }
    CLAIMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "exact optimum of the remaining tokens": (OPTIMALITY, RESOLVE)}

    tag_hash: str
    erased_ids: list[int]
    certificates: list[dict[str, Any]]
    copies_kept: dict[str, list[int]]
    state_digest: str
    n_after: int
    issued_at: str = field(default_factory=_now_iso)
    version: int = 1
    signer: str | None = None
    signature: str | None = None

    def sha256(self) -> str:
        """SHA-256 (hex) of the canonical JSON of every field, signature included: what
        the audit log's erase record keeps of the receipt."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=True, allow_nan=False).encode()
                              ).hexdigest()

    def deletion_certificates(self) -> list[DeletionCertificate]:
        """The per-token certificates as objects."""
        return [DeletionCertificate(**c) for c in self.certificates]

    def signed_bytes(self) -> bytes:
        """What a signature covers: the canonical JSON of every field but ``signature``."""
        return _signed_bytes(b"svattn-erasure-receipt-v1|", self)

    def to_json(self) -> str:
        """Serialise to a JSON string (round-trips through :meth:`from_json`)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ErasureReceipt:
        """Parse a receipt written by :meth:`to_json`; precise errors on bad input."""
        data = json_fields(text, cls, "erasure receipt",
                            optional={"issued_at", "version", "signer", "signature"})
        receipt = cls(**data)
        errs = receipt.field_errors()
        if errs:
            raise ValueError("erasure receipt: " + "; ".join(errs))
        return receipt

    def field_errors(self) -> list[str]:
        """Fields of the wrong type or form, each named (empty list when well-formed)."""
        errs = []
        if not (isinstance(self.tag_hash, str) and len(self.tag_hash) == 64
                and all(c in _HEX for c in self.tag_hash)):
            errs.append("tag_hash must be 64 lowercase hex digits (an HMAC-SHA256)")
        if not (isinstance(self.erased_ids, list) and self.erased_ids and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0
                for t in self.erased_ids)):
            errs.append("erased_ids must be a non-empty list of ids")
        if not (isinstance(self.certificates, list) and all(
                isinstance(c, dict) for c in self.certificates)):
            errs.append("certificates must be a list of certificate objects")
        else:
            for k, c in enumerate(self.certificates):
                errs += [f"certificates[{k}]: {e}" for e in certificate_dict_errors(c)]
        if not (isinstance(self.copies_kept, dict) and all(
                isinstance(k, str) and isinstance(v, list)
                and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
                for k, v in self.copies_kept.items())):
            errs.append("copies_kept must map erased ids to lists of live ids")
        if not _hexdigits(self.state_digest, 64):
            errs.append("state_digest must be 64 lowercase hex digits")
        if not (isinstance(self.n_after, int) and not isinstance(self.n_after, bool)
                and self.n_after >= 0):
            errs.append("n_after must be an int >= 0")
        if not isinstance(self.issued_at, str):
            errs.append(f"issued_at must be an ISO 8601 string, got {self.issued_at!r}")
        if self.version != 1:
            errs.append(f"version must be 1, got {self.version!r}")
        errs += signer_errors(self.signer, self.signature)
        return errs


def finite_number(v: int | float) -> bool:
    """A finite float, or an int a float can hold (a JSON int past ~1.8e308 is not a
    number a field can mean: ``math.isfinite`` raises OverflowError on it)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _hexdigits(v, n: int) -> bool:
    return isinstance(v, str) and len(v) == n and all(c in _HEX for c in v)


def signer_errors(signer, signature) -> list[str]:
    """Why ``signer`` / ``signature`` are not an Ed25519 signature's fields (both None,
    or 64 and 128 lowercase hex digits): empty when they are."""
    if (signer is None) != (signature is None):
        return ["signer and signature come together (both or neither)"]
    if signer is not None and not (_hexdigits(signer, 64) and _hexdigits(signature, 128)):
        return ["signer must be 64 and signature 128 lowercase hex digits (Ed25519)"]
    return []


def certificate_dict_errors(c) -> list[str]:
    """Why the object ``c`` (a certificate as a dict, inside another receipt) is not a
    well-formed :class:`DeletionCertificate`: not an object, a field missing or unknown,
    a field of the wrong form (empty: it is one)."""
    if not isinstance(c, dict):
        return [f"must be a certificate object, got {type(c).__name__}"]
    names = {f.name for f in fields(DeletionCertificate)}
    optional = {"issued_at", "version", "compacted", "signer", "signature"}
    missing, unknown = sorted(names - set(c) - optional), sorted(set(c) - names)
    if missing or unknown:
        return [f"missing fields {missing}, unknown fields {unknown}"]
    return DeletionCertificate(**c).field_errors()


def _signed_bytes(prefix: bytes, record) -> bytes:
    """``prefix`` and the canonical JSON of every field of ``record`` but ``signature``."""
    body = {k: v for k, v in asdict(record).items() if k != "signature"}
    return prefix + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                               allow_nan=False).encode()


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: an object naming a key twice is refused
    (``json.loads`` keeps the last, a reader of the file may see the first: the receipt
    would say two things)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
        raise ValueError(f"a JSON object names the keys {twice} more than once")
    return out


def json_fields(text: str, cls, what: str, *, optional: set[str]) -> dict[str, Any]:
    """The JSON object ``text`` holding exactly ``cls``'s fields (``optional`` may be
    missing); ``ValueError`` naming ``what`` and the fields otherwise."""
    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} JSON must be an object")
    names = {f.name for f in fields(cls)}
    missing = names - set(data) - optional
    if missing:
        raise ValueError(f"{what} is missing fields: {sorted(missing)}")
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{what} has unknown fields: {sorted(unknown)}")
    return data
