"""Deletion certificates and their verification against retraining.

A :class:`DeletionCertificate` is what :meth:`SVDDMemory.remove` hands to an
auditor: which id went, a salted SHA-256 commitment to its key and value (never
the data itself), the partition sizes before and after, the KKT residual after,
whether the optimum is unique, and a digest of the state it left.
:func:`verify_deletion` checks a certificate against a memory and, by default,
re-solves the remaining tokens from scratch with the independent oracle.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from svattn.exact.kernels import biased_softmax_readout, decision_values, gram_matrix

if TYPE_CHECKING:  # pragma: no cover
    from svattn.exact.memory import SVDDMemory

CERTIFICATE_VERSION = 1


def commit_token(salt: bytes, key: np.ndarray, value: np.ndarray | None) -> str:
    """Salted SHA-256 commitment to a token's key and value (hex).

    Whoever holds the data and the salt can recompute it; the certificate
    itself reveals nothing of the vectors beyond this hash.

    Examples
    --------
    >>> import numpy as np
    >>> c = commit_token(b"salt", np.zeros(2), None)
    >>> len(c), c == commit_token(b"salt", np.zeros(2), np.zeros(0))
    (64, True)
    """
    parts = [b"svattn-commit-v1|", salt, _float64_bytes(key)]
    if value is not None:
        parts.append(_float64_bytes(value))
    return hashlib.sha256(b"".join(parts)).hexdigest()  # one call: removals pay per call


def _float64_bytes(x) -> bytes:
    """C-order float64 bytes of ``x`` (``tobytes`` writes C order for any layout; the
    conversion only for other input)."""
    if isinstance(x, np.ndarray) and x.dtype == np.float64:
        return x.tobytes()
    return np.ascontiguousarray(x, dtype=np.float64).tobytes()


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


@dataclass(frozen=True)
class DeletionCertificate:
    """Proof-carrying record of one exact removal.

    Attributes
    ----------
    removed_id : int
    commitment : str
        Salted SHA-256 of the removed key (and value); see :func:`commit_token`.
    salt : str
        Hex salt of the commitment.
    partition_before, partition_after : dict
        Sizes of the ``margin``, ``error`` and ``reserve`` sets.
    kkt_residual_after : float
        Largest KKT violation after the removal (units of the largest K_ii).
    n_events : int
        Solver events the removal took: each token that changed set on the way,
        plus the removed token's exit (0: reserve token or warm-up; -1: the
        memory fell back to an exact batch re-solve). Along the solution path
        these are its events; an active-set step that moves several tokens at
        once counts each of them.
    unique_optimum : bool
        Whether the optimum is unique; when False (duplicate keys) alpha is
        not determined by the token set and exactness is not claimed.
    state_digest : str
        :meth:`SVDDMemory.state_digest` after the removal.
    C, kernel, gamma
        The memory's parameters.
    issued_at : str
        UTC time of issue (ISO 8601).
    version : int
    """

    removed_id: int
    commitment: str
    salt: str
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

    @classmethod
    def _issue(cls, **fields: Any) -> DeletionCertificate:
        """Construct from every field but ``issued_at`` and ``version`` (set here),
        without the dataclass ``__init__``: the removal's hot path, where each
        interpreted call runs on caches the solver has just evicted (~5 µs less
        per removal at n = 4k). The result is an ordinary frozen certificate."""
        cert = object.__new__(cls)
        cert.__dict__.update(fields, issued_at=_now_iso(), version=CERTIFICATE_VERSION)
        return cert

    def to_json(self) -> str:
        """Serialise to a JSON string (round-trips through :meth:`from_json`)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeletionCertificate:
        """Parse a certificate written by :meth:`to_json`; precise errors on bad input."""
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"certificate is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("certificate JSON must be an object")
        names = {f for f in cls.__dataclass_fields__}
        missing = names - set(data) - {"issued_at", "version"}
        if missing:
            raise ValueError(f"certificate is missing fields: {sorted(missing)}")
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"certificate has unknown fields: {sorted(unknown)}")
        if data.get("version", CERTIFICATE_VERSION) != CERTIFICATE_VERSION:
            raise ValueError(
                f"certificate version {data['version']} is not supported "
                f"(expected {CERTIFICATE_VERSION})"
            )
        return cls(**data)

    def matches_token(self, key: np.ndarray, value: np.ndarray | None = None) -> bool:
        """True when ``key``/``value`` are the token this certificate committed to."""
        expected = commit_token(bytes.fromhex(self.salt), key, value)
        return hmac.compare_digest(expected, self.commitment)

    def consistency_errors(self) -> list[str]:
        """Internal consistency problems (empty list when consistent)."""
        errs = []
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
        if len(self.commitment) != 64 or len(self.state_digest) != 64:
            errs.append("commitment and state_digest must be SHA-256 hex digests")
        if not (self.kkt_residual_after >= 0):
            errs.append("kkt_residual_after must be >= 0")
        return errs


@dataclass(frozen=True)
class DeletionVerification:
    """Result of :func:`verify_deletion`.

    ``ok`` is True only when the digest matches, the id is gone, the KKT
    residual is within tolerance and (with retraining) the memory agrees with
    a from-scratch solve: identical partition and alpha, decision function and
    readout within tolerance when the optimum is unique; the decision function
    (which is unique even when alpha is not) when it is not.
    """

    ok: bool
    digest_matches: bool
    removed_absent: bool
    kkt_residual: float
    retrained: bool
    unique_optimum: bool
    partition_equal: bool | None = None
    max_alpha_dev: float | None = None
    decision_dev: float | None = None
    readout_dev: float | None = None
    n_probes: int = 0
    tolerance: float = 0.0
    reasons: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for people."""
        verdict = "VERIFIED" if self.ok else "FAILED"
        parts = [f"{verdict}: digest {'ok' if self.digest_matches else 'MISMATCH'}",
                 f"KKT {self.kkt_residual:.1e}"]
        if self.retrained:
            parts += [
                f"partition {'equal' if self.partition_equal else 'DIFFERS'}",
                f"max|Δalpha| {self.max_alpha_dev:.1e}",
                f"decision dev {self.decision_dev:.1e}",
                f"readout dev {self.readout_dev:.1e} ({self.n_probes} probes)",
            ]
        if not self.unique_optimum:
            parts.append("optimum NOT unique (exactness not claimed)")
        if self.reasons:
            parts.append("; ".join(self.reasons))
        return ", ".join(parts)


def verify_deletion(
    memory: SVDDMemory,
    certificate: DeletionCertificate,
    retrain: bool = True,
    *,
    probes: np.ndarray | None = None,
    tol: float = 1e-8,
    seed: int = 0,
) -> DeletionVerification:
    """Check a deletion certificate against a memory, re-solving from scratch.

    Parameters
    ----------
    memory : SVDDMemory
        The memory after the removal (and nothing since).
    certificate : DeletionCertificate
    retrain : bool
        Re-solve the remaining tokens with :func:`svattn.exact.oracle.solve_svdd`
        (independent of the incremental solver) and compare.
    probes : array, shape (m, d), optional
        Query points; default: the remaining keys plus 64 points around them.
    tol : float
        Tolerance on |Δalpha|, the decision-function deviation (units of the
        largest K_ii) and the readout deviation.

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.2)
    >>> ids = mem.extend(np.random.default_rng(1).normal(size=(40, 3)))
    >>> verify_deletion(mem, mem.remove(ids[3])).ok
    True
    """
    reasons = []
    digest_ok = memory.state_digest() == certificate.state_digest
    if not digest_ok:
        reasons.append("state digest differs from the certificate's")
    absent = certificate.removed_id not in set(memory.ids)
    if not absent:
        reasons.append(f"token {certificate.removed_id} is still in the memory")
    kkt = memory.kkt_residual()
    if not kkt <= tol:
        reasons.append(f"KKT residual {kkt:.2e} above {tol:.0e}")
    reasons += certificate.consistency_errors()
    unique = memory.unique_optimum()
    if not retrain or len(memory) == 0:
        return DeletionVerification(
            ok=not reasons, digest_matches=digest_ok, removed_absent=absent, kkt_residual=kkt,
            retrained=False, unique_optimum=unique, tolerance=tol, reasons=tuple(reasons),
        )
    from svattn.exact.oracle import partition as oracle_partition
    from svattn.exact.oracle import solve_svdd

    keys, values, alpha = memory.keys, memory.values, memory.alpha
    gamma = certificate.gamma
    K = gram_matrix(keys, memory.kernel, gamma)
    alpha_r, mu_r = solve_svdd(K, memory.C, return_mu=True)
    ids = memory.ids
    part_r = oracle_partition(alpha_r, memory.C)
    part_m = memory.partition()
    partition_equal = all(
        sorted(ids[i] for i in part_r[name]) == sorted(part_m[name])
        for name in ("margin", "error", "reserve")
    ) if not memory.warm else True
    if probes is None:
        rng = np.random.default_rng(seed)
        spread = keys.std(axis=0) + 1e-12
        noise = rng.normal(size=(64, keys.shape[1])) * spread
        around = keys[rng.integers(0, len(keys), 64)] + noise
        probes = np.concatenate([keys, around])
    probes = np.asarray(probes, dtype=np.float64)
    dec_r = decision_values(probes, keys, alpha_r, mu_r, memory.kernel, gamma)
    scale = max(1.0, float(np.diag(K).max()))
    decision_dev = float(np.max(np.abs(memory.decision_function(probes) - dec_r))) / scale
    read_r = biased_softmax_readout(probes, keys, values, alpha_r, memory.kernel, gamma)
    readout_dev = float(np.max(np.abs(memory.readout(probes) - read_r)))
    alpha_dev = float(np.max(np.abs(alpha - alpha_r)))
    if not decision_dev <= tol:
        reasons.append(f"decision function differs from retrain by {decision_dev:.2e}")
    if unique:
        if not partition_equal:
            reasons.append("partition differs from retrain")
        if not alpha_dev <= tol:
            reasons.append(f"alpha differs from retrain by {alpha_dev:.2e}")
        if not readout_dev <= tol:
            reasons.append(f"readout differs from retrain by {readout_dev:.2e}")
    return DeletionVerification(
        ok=not reasons, digest_matches=digest_ok, removed_absent=absent, kkt_residual=kkt,
        retrained=True, unique_optimum=unique, partition_equal=partition_equal,
        max_alpha_dev=alpha_dev, decision_dev=decision_dev, readout_dev=readout_dev,
        n_probes=len(probes), tolerance=tol, reasons=tuple(reasons),
    )
