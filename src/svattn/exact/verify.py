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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from svattn.exact.audit import STATE_OPS, AuditReport, verify_chain
from svattn.exact.certificate import KEYED, DeletionCertificate, ErasureReceipt, commit_token
from svattn.exact.fileformat import StateFileError, parse_header, read_metadata
from svattn.exact.kernels import biased_softmax_readout, decision_values, gram_matrix
from svattn.exact.memory import SVDDMemory
from svattn.exact.oracle import partition as oracle_partition
from svattn.exact.oracle import solve_svdd
from svattn.exact.signing import load_public_key, signature_errors


@dataclass(frozen=True)
class DeletionVerification:
    """Result of :func:`verify_deletion`.

    ``ok`` is True only when the certificate is well-formed, its parameters are
    the memory's, the digest matches, the id was issued and is gone, every
    recomputable field (sizes after, KKT residual, uniqueness) agrees, no live
    token holds the erased key and value, the log (when given) records exactly
    this certificate, and (with retraining) the memory agrees with a
    from-scratch solve: identical partition and alpha, decision function and
    readout within tolerance when the optimum is unique; the decision function
    (which is unique even when alpha is not) when it is not. ``reasons`` names
    every failed check, by field where one is to blame.
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
    parameters_match: bool = True
    copies: tuple[int, ...] = ()
    logged: bool | None = None
    signed: bool | None = None
    signature_present: bool = False
    compacted: int = 0
    issued_at_record: int | None = None
    reasons: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for people."""
        verdict = "VERIFIED" if self.ok else "FAILED"
        if self.issued_at_record is not None:
            parts = [f"{verdict} later: issued at audit record {self.issued_at_record} "
                     f"(digest {'ok' if self.digest_matches else 'MISMATCH'} there), the "
                     f"state since checked as the log's end", f"KKT now {self.kkt_residual:.1e}"]
        else:
            parts = [f"{verdict}: digest {'ok' if self.digest_matches else 'MISMATCH'}",
                     f"KKT {self.kkt_residual:.1e}"]
        if self.retrained:
            parts += [
                f"partition {'equal' if self.partition_equal else 'DIFFERS'}",
                f"max|Δalpha| {self.max_alpha_dev:.1e}",
                f"decision dev {self.decision_dev:.1e}",
                f"readout dev {self.readout_dev:.1e} ({self.n_probes} probes)",
            ]
        if not self.parameters_match:
            parts.append("parameters DIFFER (not retrained)")
        if self.copies:
            parts.append(f"COPIES of the erased record live as {list(self.copies)}")
        if self.logged is not None:
            parts.append(f"audit log {'records it' if self.logged else 'DISAGREES'}")
        if self.signed is not None:
            parts.append("signature ok" if self.signed else "signature INVALID")
        elif self.signature_present:
            parts.append("signature present, NOT checked (no public key given)")
        if not self.unique_optimum:
            parts.append("optimum NOT unique (exactness not claimed)")
        if self.compacted:
            parts.append(f"exact relative to the kept tokens ({self.compacted} dropped by "
                         "compaction)" if self.compacted > 0 else
                         "compaction history unknown")
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
    log: str | os.PathLike[str] | None = None,
    public_key=None,
    commit_key: bytes | None = None,
) -> DeletionVerification:
    """Check a deletion certificate against a memory, re-solving from scratch.

    Parameters
    ----------
    memory : SVDDMemory
        The memory right after the removal; or, with ``log``, any later state of it
        (*checked later*: see below).
    certificate : DeletionCertificate
    retrain : bool
        Re-solve the remaining tokens with :func:`svattn.exact.oracle.solve_svdd`
        (independent of the incremental solver) and compare.
    probes : array, shape (m, d), optional
        Query points; default: the remaining keys plus 64 points around them.
    tol : float
        Tolerance on |Δalpha|, the decision-function deviation (units of the
        largest K_ii) and the readout deviation (units of the largest |value|,
        at least 1: a readout is a convex combination of the values, so its
        rounding is relative to them; keys stored as values at 1e8 round at 1e-8).
    log : path-like, optional
        The memory's audit log: its chain must verify, record exactly this
        certificate, and have recorded the same commitment when the token was added;
        for a keyed commitment, no later add may carry it again (the erased record
        re-entered). Without a log or a signature an edited commitment cannot be told
        from a real one: it describes data the verifier does not hold.
    public_key : Ed25519PublicKey or path, optional
        The controller's public key: the certificate must carry its valid
        signature (:mod:`svattn.exact.signing`); any edited byte fails.
    commit_key : bytes, optional
        The controller's commitment key (:func:`svattn.exact.certificate.commitment_key`
        of its tag key): every live token's data is then re-committed and compared
        with a keyed certificate's commitment, so a copy is found even in a state
        whose stored commitments were forged. Without it, copies are found from the
        commitments the state stores (keyed ones repeat for equal data) and from the
        certificate's own ``live_copies``.

    Checked later (``log`` given and the memory has moved on): the chain must record
    this certificate at a record whose digest is the certificate's, and end at the
    memory's present digest; the removed token must still be gone, no live token may
    hold its data, and a keyed record must never have been added again. What the
    removal left (its sizes, KKT residual, uniqueness) is then attested by the chain,
    where the memory recorded it, and the retrain checks the present state.

    Right after the removal, every field the state can confirm is recomputed and a
    mismatch is named:
    the parameters (C, kernel, gamma), the digest, that ``removed_id`` was issued
    and is gone, the sizes after, the KKT residual, uniqueness; and no live token
    may hold the erased key and value (a copy under another id). Retraining is
    skipped when the parameters differ (it would compare other problems).

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.2)
    >>> ids = mem.extend(np.random.default_rng(1).normal(size=(40, 3)))
    >>> verify_deletion(mem, mem.remove(ids[3])).ok
    True
    """
    cert = certificate
    if public_key is not None and not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(public_key)
    malformed = cert.field_errors()
    if malformed:  # nothing else is worth comparing with a certificate of the wrong form
        return DeletionVerification(
            ok=False, digest_matches=False, removed_absent=False, kkt_residual=float("nan"),
            retrained=False, unique_optimum=False, tolerance=tol, parameters_match=False,
            reasons=tuple(malformed))
    reasons = _parameter_mismatches(memory, cert)
    params_ok = not reasons
    logged, at_record = None, None
    if log is not None:
        logged, at_record = _matches_the_log(cert, Path(log), reasons, memory.state_digest())
    signed = None
    if public_key is not None:
        bad_signature = signature_errors(cert, public_key)
        signed = not bad_signature
        reasons += bad_signature
    now = at_record is None  # False: checked later, against the chain
    digest_ok = memory.state_digest() == cert.state_digest if now else bool(logged)
    if not digest_ok and now:
        reasons.append("state_digest differs from the memory's")
    ss = memory.solver_state
    absent = cert.removed_id not in ss.id_to_slot
    if not absent:
        reasons.append(f"removed_id: token {cert.removed_id} is still in the memory")
    elif cert.removed_id >= ss.next_id:
        reasons.append(f"removed_id: token {cert.removed_id} was never added (the memory "
                       f"has issued ids 0..{ss.next_id - 1})")
    kkt = memory.kkt_residual()
    if not kkt <= tol:
        reasons.append(f"KKT residual {kkt:.2e} above {tol:.0e}")
    reasons += cert.consistency_errors()
    unique = memory.unique_optimum()
    claim = unique and kkt <= memory.tol  # what the memory certifies (see remove)
    if now:
        reasons += _state_mismatches(memory, cert, kkt, unique, claim)
    elif cert.compacted != ss.n_compacted and not (0 <= cert.compacted <= ss.n_compacted):
        # compaction only grows the count (-1: unknown, on both sides or neither)
        had = "an unknown number of" if ss.n_compacted < 0 else f"only {ss.n_compacted}"
        reasons.append(f"compacted: the certificate says {cert.compacted}, the memory has "
                       f"dropped {had} tokens by compaction in all")
    unique = claim
    recommitted = None if commit_key is None else _recommitted(memory, commit_key)
    copies = _live_copies(memory, cert, recommitted)
    if recommitted is not None:
        bad = _commitment_mismatches(memory, recommitted)
        if bad:
            reasons.append(f"commit_key: the stored commitments of live tokens {bad[:5]} are "
                           "not their data's under this key (a forged state, or another key)")
    if copies:
        reasons.append(f"live tokens {list(copies)} hold the same key and value as the erased "
                       "record: the data is still in the memory")
    if not retrain or len(memory) == 0 or not params_ok:
        return DeletionVerification(
            ok=not reasons, digest_matches=digest_ok, removed_absent=absent, kkt_residual=kkt,
            retrained=False, unique_optimum=unique, tolerance=tol, parameters_match=params_ok,
            copies=copies, logged=logged, signed=signed, compacted=ss.n_compacted,
            signature_present=cert.signature is not None, issued_at_record=at_record,
            reasons=tuple(reasons),
        )
    keys, values, alpha = memory.keys, memory.values, memory.alpha
    gamma = memory.gamma_value  # the certificate's gamma equals it (checked above)
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
        if memory.kernel == "exp":  # stay within the keys' norms: exp(gamma p·x) is finite
            top = float(np.einsum("ij,ij->i", keys, keys).max())
            around = around[np.einsum("ij,ij->i", around, around) <= top]
        probes = np.concatenate([keys, around])
    probes = np.asarray(probes, dtype=np.float64)
    dec_r = decision_values(probes, keys, alpha_r, mu_r, memory.kernel, gamma)
    scale = max(1.0, float(np.diag(K).max()))
    decision_dev = float(np.max(np.abs(memory.decision_function(probes) - dec_r))) / scale
    read_r = biased_softmax_readout(probes, keys, values, alpha_r, memory.kernel, gamma)
    vscale = max(1.0, float(np.max(np.abs(values))))
    readout_dev = float(np.max(np.abs(memory.readout(probes) - read_r))) / vscale
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
        n_probes=len(probes), tolerance=tol, parameters_match=True, copies=copies,
        logged=logged, signed=signed, compacted=ss.n_compacted,
        signature_present=cert.signature is not None, issued_at_record=at_record,
        reasons=tuple(reasons),
    )


@dataclass(frozen=True)
class ErasureVerification:
    """Result of :func:`verify_erasure`: ``ok`` and every failed check, named."""

    ok: bool
    erased: int
    last_removal: DeletionVerification | None
    signed: bool | None = None
    reasons: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for people."""
        verdict = "VERIFIED" if self.ok else "FAILED"
        sig = "" if self.signed is None else (", signature ok" if self.signed
                                              else ", signature INVALID")
        tail = "; ".join(self.reasons)
        return f"{verdict}: erasure of {self.erased} tokens{sig}" + (f"; {tail}" if tail else "")


def verify_erasure(memory: SVDDMemory, receipt: ErasureReceipt, retrain: bool = True, *,
                   tol: float = 1e-8, public_key=None, seed: int = 0,
                   log: str | os.PathLike[str] | None = None) -> ErasureVerification:
    """Check an :class:`ErasureReceipt` against the memory right after the erasure.

    Every id was issued and is gone; no live token carries the subject's tag hash;
    the receipt's certificates are the removals of exactly those ids and the last
    one passes :func:`verify_deletion` (retrain included); a live token holding an
    erased record's key and value must be one the receipt lists as another
    subject's copy; the digest and size are the memory's; with ``public_key`` the
    receipt's signature must verify; with ``log`` no live token may be one the log's add
    records gave the subject's tag (a state whose stored tags were edited).
    """
    reasons = list(receipt.field_errors())
    if reasons:
        return ErasureVerification(ok=False, erased=0, last_removal=None,
                                   reasons=tuple(reasons))
    signed = None
    if public_key is not None:
        if not isinstance(public_key, Ed25519PublicKey):
            public_key = load_public_key(public_key)
        bad = signature_errors(receipt, public_key)
        signed = not bad
        reasons += bad
    ss = memory.solver_state
    certs = receipt.deletion_certificates()
    if [c.removed_id for c in certs] != receipt.erased_ids:
        reasons.append("certificates: they do not remove exactly erased_ids, in order")
    back = [t for t in receipt.erased_ids if t in ss.id_to_slot or t >= ss.next_id]
    if back:
        reasons.append(f"erased_ids: {back[:5]} are live or were never issued")
    tagged = ss.tagged_slots(bytes.fromhex(receipt.tag_hash))
    if len(tagged):
        reasons.append(f"tag_hash: live tokens {[int(ss.slot_id[s]) for s in tagged][:5]} "
                       "still carry the subject's tag")
    if log is not None:
        rep = verify_chain(Path(log))
        if not rep.ok:
            reasons.append(f"the audit log does not verify: {rep.error}")
        tagged = sorted(tok["id"] for _, tok in _added_tokens(rep.records)
                        if tok.get("tag") == receipt.tag_hash and tok.get("id") in ss.id_to_slot)
        if tagged:
            reasons.append(f"tag_hash: the audit log added live tokens {tagged[:5]} for this "
                           "subject (the state's tags were edited)")
    if receipt.state_digest != memory.state_digest():
        reasons.append("state_digest differs from the memory's")
    if receipt.n_after != len(memory):
        reasons.append(f"n_after: the receipt says {receipt.n_after}, the memory holds "
                       f"{len(memory)}")
    last = None
    if certs:  # the state is the one after the last removal: check that one in full
        last = verify_deletion(memory, certs[-1], retrain, tol=tol, seed=seed)
        reasons += [r for r in last.reasons if not r.startswith("live tokens")]
    for c in certs:  # copies of erased data may stay only as other subjects' data
        copies = last.copies if c is certs[-1] else _live_copies(memory, c)
        extra = [t for t in copies if t not in receipt.copies_kept.get(str(c.removed_id), [])]
        if extra:
            reasons.append(f"live tokens {extra} hold the data of erased token "
                           f"{c.removed_id} and are not another subject's copies")
    return ErasureVerification(ok=not reasons, erased=len(receipt.erased_ids),
                               last_removal=last, signed=signed, reasons=tuple(reasons))


def _state_mismatches(memory: SVDDMemory, cert: DeletionCertificate, kkt: float,
                      unique: bool, claim: bool) -> list[str]:
    """The certificate's fields that the state right after the removal contradicts."""
    out = []
    ss = memory.solver_state
    if not abs(cert.kkt_residual_after - kkt) <= 1e-12:
        out.append(f"kkt_residual_after: the certificate says {cert.kkt_residual_after:.3e}, "
                   f"the memory's is {kkt:.3e}")
    if cert.compacted != ss.n_compacted:
        out.append(f"compacted: the certificate says {cert.compacted}, the memory has "
                   f"dropped {ss.n_compacted} tokens by compaction")
    sizes = {k: len(v) for k, v in memory.partition().items()}
    if cert.partition_after != sizes:
        out.append(f"partition_after: the certificate says {cert.partition_after}, the "
                   f"memory holds {sizes}")
    if cert.unique_optimum != claim:
        out.append(f"unique_optimum: the certificate says {cert.unique_optimum}, the "
                   f"memory's optimum is {'' if unique else 'not '}unique"
                   + ("" if kkt <= memory.tol else f" and its KKT residual {kkt:.1e} is "
                      f"above its tol {memory.tol:.0e}"))
    return out


def _parameter_mismatches(memory: SVDDMemory, cert: DeletionCertificate) -> list[str]:
    """The parameters the certificate names that are not the memory's (each named)."""
    out = []
    if cert.C != memory.C:
        out.append(f"C: the certificate says {cert.C!r}, the memory has {memory.C!r}")
    if cert.kernel != memory.kernel:
        out.append(f"kernel: the certificate says {cert.kernel!r}, the memory has "
                   f"{memory.kernel!r}")
    if memory.dim is not None and cert.gamma != memory.gamma_value:
        out.append(f"gamma: the certificate says {cert.gamma!r}, the memory has "
                   f"{memory.gamma_value!r}")
    return out


def _recommitted(memory: SVDDMemory, commit_key: bytes) -> dict[int, str]:
    """Every live token's data committed again under ``commit_key``: slot -> hex."""
    ss = memory.solver_state
    return {int(s): commit_token(ss.X[s], None if ss.value_is_key else ss.V[s], commit_key)[0]
            for s in ss.ordered_slots()}


def _live_copies(memory: SVDDMemory, cert: DeletionCertificate,
                 recommitted: dict[int, str] | None = None) -> tuple[int, ...]:
    """Ids of live tokens holding the erased record's key and value (it was ingested
    again, or twice, under another id: a request is about the data, not an id).

    Found three ways, each as strong as what the verifier holds: the certificate's own
    ``live_copies`` still live; for a keyed commitment, live tokens whose stored
    commitment equals it; with the key (``recommitted``), live tokens whose data
    re-commits to it."""
    ss = memory.solver_state
    if ss.n == 0:
        return ()
    slots = ss.ordered_slots()
    found = {t for t in cert.live_copies if t in ss.id_to_slot}
    if cert.commitment_scheme == KEYED:
        want = np.frombuffer(bytes.fromhex(cert.commitment), np.uint8)
        same = slots[(ss.commitments[slots] == want).all(axis=1)]
        found.update(int(ss.slot_id[s]) for s in same)
        if recommitted is not None:
            found.update(int(ss.slot_id[s]) for s, c in recommitted.items()
                         if c == cert.commitment)
    return tuple(sorted(found))


def _commitment_mismatches(memory: SVDDMemory, recommitted: dict[int, str]) -> list[int]:
    """Live keyed tokens whose stored commitment is not their data's re-committed under
    the verifier's key (a forged state, or the wrong key)."""
    ss = memory.solver_state
    return [int(ss.slot_id[s]) for s, c in recommitted.items()
            if ss.commit_keyed[s] == 1 and c != ss.commitments[s].tobytes().hex()]


def _matches_the_log(cert: DeletionCertificate, log: Path, reasons: list[str],
                     present: str) -> tuple[bool, int | None]:
    """Whether the log's chain holds, records exactly this certificate (any edited field
    shows as a difference), added the token with its commitment, and (keyed) never
    added the record again after the removal."""
    rep = verify_chain(log)
    if not rep.ok:
        reasons.append(f"the audit log does not verify: {rep.error}")
        return False, None
    recorded = [r["certificate"] for r in rep.records
                if r["op"] == "remove" and r["certificate"].get("removed_id") == cert.removed_id]
    if not recorded:
        reasons.append(f"the audit log records no removal of token {cert.removed_id}")
        return False, None
    mine = asdict(cert)
    diff = sorted(k for k in set(mine) | set(recorded[-1])
                  if mine.get(k) != recorded[-1].get(k))
    if diff:
        reasons.append(f"the audit log recorded this removal with other {', '.join(diff)}")
        return False, None
    ok = True
    at = max(r["seq"] for r in rep.records if r["op"] == "remove"
             and r["certificate"].get("removed_id") == cert.removed_id)
    later = None
    if present != cert.state_digest:  # the memory moved on: check it is the log's end
        later = at
        if rep.records[at]["digest"] != cert.state_digest:
            reasons.append(f"state_digest: the audit log's record {at} has another digest")
            ok = False
        if rep.final_digest != present:
            reasons.append("state_digest differs from the memory's, and the memory is not "
                           "the audit log's end (its final digest is another)")
            ok = False
    added = [(q, tok) for q, tok in _added_tokens(rep.records)
             if tok.get("id") == cert.removed_id]
    # (an add record of a version-1 log carries its own salted commitment: not comparable)
    if added and "salt" not in added[-1][1] and added[-1][1].get("commitment") != cert.commitment:
        reasons.append(f"commitment: the audit log added token {cert.removed_id} (record "
                       f"{added[-1][0]}) with another commitment")
        ok = False
    if cert.commitment_scheme == KEYED:  # equal data, equal commitment: re-entry shows
        back = [(q, tok["id"]) for q, tok in _added_tokens(rep.records[at + 1:])
                if tok.get("commitment") == cert.commitment]
        if back:
            reasons.append(f"the erased record re-entered after its removal: record "
                           f"{back[0][0]} adds it again as token {back[0][1]}")
            ok = False
    return ok, later


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
        return
    unbound = _unbound_tokens(rep, mem)
    if unbound:
        rep.ok = False
        rep.broken_record = last
        rep.error = (f"state {state}: live tokens {unbound[:5]} carry another commitment or "
                     "data-subject tag than the log's add records gave them (the digest does "
                     "not cover them: an edited state)")


def _added_tokens(records: list[dict]) -> list[tuple[int, dict]]:
    """``(seq, token entry)`` of every token the add / extend records among ``records``
    added (a verified chain's records: the entries are objects with an id)."""
    return [(r["seq"], tok) for r in records if r["op"] in ("add", "extend")
            for tok in r.get("tokens", []) if isinstance(tok, dict)]


def _unbound_tokens(rep: AuditReport, mem: SVDDMemory) -> list[int]:
    """Live ids whose stored commitment or tag hash differs from their add record (ids
    the chain started from, and tokens of older formats, have none to compare)."""
    added = {tok["id"]: tok for _, tok in _added_tokens(rep.records)}
    ss = mem.solver_state
    bad = []
    for s in ss.ordered_slots():
        tok = added.get(int(ss.slot_id[s]))
        if tok is None or "salt" in tok:
            continue
        tag = ss.tags[s].tobytes().hex()
        logged_tag = tok.get("tag", "00" * len(ss.tags[s]))
        if (ss.commit_keyed[s] != 2 and tok.get("commitment") != ss.commitments[s].tobytes().hex()
                or tag != logged_tag):
            bad.append(int(ss.slot_id[s]))
    return bad


__all__ = ["DeletionVerification", "ErasureVerification", "verify_deletion", "verify_erasure",
           "verify_log"]
