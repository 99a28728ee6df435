"""The auditor's side: checks of a deletion certificate and of an audit log with its state.

Nothing here trusts the solver. :func:`verify_deletion` re-solves the remaining
tokens with the independent oracle (:func:`svattn.exact.oracle.solve_svdd`,
which shares only :mod:`svattn.exact.conventions` with the solver) and compares
partition, alpha, decision function and readout; :func:`verify_log` re-checks an
audit log's chain (:func:`svattn.exact.audit.verify_chain`) and, given a saved
state, that the log ends at exactly that state (``docs/design.md`` §4).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from svattn.exact.audit import STATE_OPS, AuditReport, verify_chain
from svattn.exact.certificate import DeletionCertificate
from svattn.exact.fileformat import StateFileError, parse_header, read_metadata
from svattn.exact.kernels import biased_softmax_readout, decision_values, gram_matrix
from svattn.exact.memory import SVDDMemory
from svattn.exact.oracle import partition as oracle_partition
from svattn.exact.oracle import solve_svdd


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


def verify_log(path: str | os.PathLike[str], state: str | os.PathLike[str] | None = None
               ) -> AuditReport:
    """Verify an audit log (and optionally that it ends at a saved state).

    Parameters
    ----------
    path : path-like
        The JSONL log.
    state : path-like, optional
        A state file saved by :meth:`SVDDMemory.save` with this log.

    Returns
    -------
    AuditReport
        ``ok`` False names the first broken record and what broke.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> log = os.path.join(tempfile.mkdtemp(), "audit.jsonl")
    >>> mem = SVDDMemory(C=0.2, audit_log=log)
    >>> ids = mem.extend(np.random.default_rng(0).normal(size=(30, 3)))
    >>> cert = mem.remove(ids[4])
    >>> report = verify_log(log)
    >>> report.ok, report.n_records, [r["op"] for r in report.records]
    (True, 3, ['open', 'extend', 'remove'])
    """
    rep = verify_chain(path)
    if rep.ok and state is not None:
        _check_state(rep, Path(state))
    return rep


def _check_state(rep: AuditReport, state: Path) -> None:
    rep.state_checked = True
    last = len(rep.records) - 1
    try:
        mem = SVDDMemory.load(state)
    except (StateFileError, OSError) as exc:
        rep.ok = False
        rep.error = f"state {state} does not load: {exc}"
        return
    header = parse_header(state.read_bytes(), str(state))[0]
    head = read_metadata(header, str(state)).get("audit_head")
    if head is None:
        rep.ok = False
        rep.error = f"state {state} was saved without an audit log"
        return
    seq = int(head["seq"])
    if seq > last or rep.hashes[seq] != head["sha256"]:
        rep.ok = False
        rep.broken_record = min(seq, last + 1)
        what = ("lacks (records were removed from its end)" if seq > last
                else "does not contain (that record differs)")
        rep.error = (f"state {state} was saved at record {seq} (sha256 {head['sha256'][:12]}…), "
                     f"which this log {what}")
        return
    later = [r for r in rep.records[seq + 1:] if r["op"] in STATE_OPS]
    if later:
        rep.ok = False
        rep.broken_record = later[0]["seq"]
        rep.error = (f"the log records {len(later)} operation(s) after state {state} was saved "
                     f"(first: record {later[0]['seq']}, {later[0]['op']}): the state is stale")
        return
    sha = hashlib.sha256(state.read_bytes()).hexdigest()
    if not any(r["op"] == "save" and r.get("file_sha256") == sha for r in rep.records[seq + 1:]):
        rep.ok = False
        rep.broken_record = last + 1
        rep.error = (f"the log does not record saving this state (sha256 {sha[:12]}…) after "
                     f"record {seq}: its last records were removed, or the file was not saved "
                     "by this memory")
        return
    if rep.final_digest != mem.state_digest():
        rep.ok = False
        rep.broken_record = last
        rep.error = (f"record {last}: final digest {rep.final_digest[:12]}… differs from the "
                     f"state's {mem.state_digest()[:12]}…")


__all__ = ["DeletionVerification", "verify_deletion", "verify_log"]
