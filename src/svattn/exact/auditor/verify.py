"""The auditor's side: checks of a deletion certificate and of an audit log with its state.

Nothing here trusts the solver. :func:`verify_deletion` re-solves the remaining
tokens with the independent oracle (:func:`svattn.exact.oracle.solve_svdd`,
which shares only :mod:`svattn.exact.core.conventions` with the solver) and compares
partition, alpha, decision function and readout; :func:`verify_log` re-checks an
audit log's chain (:func:`svattn.exact.records.audit.verify_chain`) and, given a saved
state, that the log ends at exactly that state (``docs/design.md`` §4).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from svattn.exact.auditor.crosscheck import ORACLE_MAX_TOKENS, oracle_comparison, refuse_oracle
from svattn.exact.auditor.logcheck import (
    LogIndex,
    added_tokens,
    index_log,
    matches_the_log,
    removal_pruned,
    verify_log,
    with_log_authenticity,
)
from svattn.exact.auditor.optimality import (
    OptimalityReport,
    Progress,
    check_optimality,
    parameter_errors,
)
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.memory import SVDDMemory
from svattn.exact.records.audit import AuditReport, verify_chain
from svattn.exact.records.certificate import (
    KEYED,
    DeletionCertificate,
    ErasureReceipt,
    commit_token,
)
from svattn.exact.records.receipts import (
    LOG,
    OPTIMALITY,
    RESOLVE,
    SIGNATURE,
    STATE,
    HasVerdict,
    Verdict,
    judge,
)
from svattn.exact.records.signing import load_public_key, signature_errors


@dataclass(frozen=True)
class DeletionVerification(HasVerdict):
    """Result of :func:`verify_deletion`.

    ``ok`` is True only when the certificate is well-formed, its parameters are
    the memory's, the digest matches, the id was issued and is gone, every
    recomputable field (sizes after, KKT residual, uniqueness) agrees, no live
    token holds the erased key and value, the log (when given) records exactly
    this certificate, and (with ``retrain``) the state is proven the optimum of the
    remaining tokens from their keys (``optimality``: the
    :class:`~svattn.exact.auditor.optimality.OptimalityReport`); with the oracle
    (``retrained``) the memory also agrees with a from-scratch solve: identical
    partition and alpha, decision function and readout within tolerance when the
    optimum is unique; the decision function (which is unique even when alpha is
    not) when it is not. ``kkt_residual`` is the proof's (recomputed from the keys)
    when it ran, else the memory's own. ``reasons`` names every failed check, by
    field where one is to blame.

    ``ok`` says only that nothing failed. ``verdict`` (:mod:`svattn.exact.records.receipts`) says
    which fields were checked and which no check that ran binds: ``status`` is
    ``"VERIFIED"`` only when every field was checked and passed, ``"UNCHECKED"`` when
    nothing failed but a field was not checked (without ``log`` or ``public_key`` the
    commitment, the id and the other fields only the controller's word binds), and
    ``"FAILED"`` otherwise.
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
    verdict: Verdict | None = None
    optimality: OptimalityReport | None = None

    def summary(self) -> str:
        """One line for people."""
        verdict = self.status
        if self.issued_at_record is not None:
            parts = [f"{verdict} later: issued at audit record {self.issued_at_record} "
                     f"(digest {'ok' if self.digest_matches else 'MISMATCH'} there), the "
                     f"state since checked as the log's end", f"KKT now {self.kkt_residual:.1e}"]
        else:
            parts = [f"{verdict}: digest {'ok' if self.digest_matches else 'MISMATCH'}",
                     f"KKT {self.kkt_residual:.1e}"]
        if self.optimality is not None:
            parts.append(f"optimality proven from the keys ({self.optimality.summary()})"
                         if self.optimality.ok else "optimality NOT proven")
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
        if self.verdict is not None and self.verdict.unchecked:
            parts.append(f"UNCHECKED (nothing checked them): {self.verdict.unchecked_line()}")
        if self.verdict is not None and self.verdict.authenticity_unchecked:
            parts.append(f"the audit log's authenticity UNCHECKED: "
                         f"{self.verdict.authenticity_line()}")
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
    oracle: bool = False,
    oracle_force: bool = False,
    progress: Progress | None = None,
) -> DeletionVerification:
    """Check a deletion certificate against a memory: that the state is the optimum a
    retrain of the remaining tokens finds, proven from their keys.

    Parameters
    ----------
    memory : SVDDMemory
        The memory right after the removal; or, with ``log``, any later state of it
        (*checked later*: see below).
    certificate : DeletionCertificate
    retrain : bool
        Prove that the state is the retrain's optimum (the ``optimality`` check,
        :func:`svattn.exact.auditor.optimality.check_optimality`): from the keys alone,
        every token's ``g`` from the support's kernel columns (one blocked pass,
        O(n·|S|·d) time, bounded memory; never the memory's caches), feasibility, the
        KKT residual ``<= tol`` and the uniqueness test (a Cholesky factor of ``K`` on
        the margin and tied tokens). For this convex QP a feasible KKT point is an
        optimum: a complete proof, no solver needed. False: only what the state's own
        account and the records allow.
    probes : array, shape (m, d), optional
        With ``oracle``: query points; default: the remaining keys plus 64 points
        around them.
    tol : float
        Bound on the KKT residual (``docs/design.md`` §1 scale); with ``oracle``, also
        the tolerance on |Δalpha|, the decision-function deviation (units of the
        largest K_ii) and the readout deviation (units of the largest |value|, at least
        1: a readout is a convex combination of the values).
    log : path-like, optional
        The memory's audit log: its chain must verify, record exactly this
        certificate, and have recorded the same commitment when the token was added;
        for a keyed commitment, no later add may carry it again (the erased record
        re-entered). Without a log or a signature an edited commitment cannot be told
        from a real one: it describes data the verifier does not hold. The log's
        checkpoint (``LOG.checkpoint``) must be the root of its entries and, with
        ``public_key``, signed by it
        (:func:`~svattn.exact.auditor.logcheck.check_authenticity`, as ``svattn
        verify-deletion --log`` checks it): an unsigned log, a signature not checked
        (no ``public_key``) or entries after the checkpoint are named in
        ``verdict.authenticity_unchecked`` and the status is at best UNCHECKED.
    public_key : Ed25519PublicKey or path, optional
        The controller's public key: the certificate must carry its valid
        signature (:mod:`svattn.exact.records.signing`); any edited byte fails.
    commit_key : bytes, optional
        The controller's commitment key (:func:`svattn.exact.records.certificate.commitment_key`
        of its tag key): every live token's data is then re-committed and compared
        with a keyed certificate's commitment, so a copy is found even in a state
        whose stored commitments were forged. Without it, copies are found from the
        commitments the state stores (keyed ones repeat for equal data) and from the
        certificate's own ``live_copies``.
    oracle : bool
        Also re-solve the remaining tokens with the independent dense oracle
        (:func:`svattn.exact.oracle.solve_svdd`, the ``re-solve`` check) and compare
        partition, alpha, decision function and readout: a cross-check that holds the
        n×n problem (up to about 100·n² bytes: 1.2 GB and 60 s measured at n = 4,000).
    oracle_force : bool
        Run the oracle above :data:`ORACLE_MAX_TOKENS` tokens (refused otherwise).
    progress : callable, optional
        ``progress(stage, done, total)`` as the checks advance (the command line prints
        it on stderr when a check runs over 2 s).

    Raises
    ------
    ValueError
        The state's C cannot describe a memory (C <= 0, C > 1, C below 2**-53, or a
        solved state with n·C < 1): malformed input; or ``oracle`` above
        :data:`ORACLE_MAX_TOKENS` tokens without ``oracle_force``.

    Checked later (``log`` given and the memory has moved on): the chain must record
    this certificate at a record whose digest is the certificate's, and end at the
    memory's present digest; the removed token must still be gone, no live token may
    hold its data, and a keyed record must never have been added again. What the
    removal left (its sizes, KKT residual, uniqueness) is then attested by the chain,
    where the memory recorded it, and the optimality proof checks the present state.

    Right after the removal, every field the state can confirm is recomputed and a
    mismatch is named:
    the parameters (C, kernel, gamma), the digest, that ``removed_id`` was issued
    and is gone, the sizes after, the KKT residual and uniqueness (from the keys, with
    ``retrain``); and no live token may hold the erased key and value (a copy under
    another id). The proof is skipped when the parameters differ (it would prove
    another problem).

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.2)
    >>> ids = mem.extend(np.random.default_rng(1).normal(size=(40, 3)))
    >>> verify_deletion(mem, mem.remove(ids[3])).ok
    True
    """
    refuse_malformed_state(memory)
    if retrain and oracle:
        refuse_oracle(len(memory), oracle_force)
    report = None if log is None else verify_chain(Path(log))
    v = _check_deletion(memory, certificate, retrain, probes=probes, tol=tol, seed=seed,
                        public_key=public_key, commit_key=commit_key, report=report,
                        oracle=oracle, progress=progress)
    return with_log_authenticity(v, log, report, public_key)


def refuse_malformed_state(memory: SVDDMemory) -> None:
    """Raise ``ValueError`` when the memory's C cannot describe a state any memory builds
    (:func:`svattn.exact.auditor.optimality.parameter_errors`)."""
    bad = parameter_errors(memory.C, len(memory), memory.warm)
    if bad:
        raise ValueError(f"malformed state: {bad[0]}")


def _check_deletion(memory: SVDDMemory, cert: DeletionCertificate, retrain: bool, *,
                    probes: np.ndarray | None = None, tol: float = 1e-8, seed: int = 0,
                    public_key=None, commit_key: bytes | None = None,
                    report: AuditReport | None = None, oracle: bool = False,
                    progress: Progress | None = None, index: LogIndex | None = None
                    ) -> DeletionVerification:
    """:func:`verify_deletion` with the log already read and its chain checked
    (``report``: :func:`verify_chain` of it, or None without a log)."""
    if public_key is not None and not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(public_key)
    malformed = cert.field_errors()
    if malformed:  # nothing else is worth comparing with a certificate of the wrong form
        return DeletionVerification(
            ok=False, digest_matches=False, removed_absent=False, kkt_residual=float("nan"),
            retrained=False, unique_optimum=False, tolerance=tol, parameters_match=False,
            reasons=tuple(malformed),
            verdict=judge(cert, (), malformed))
    ran = {STATE} | ({LOG} if report is not None else set()) | (
        {SIGNATURE} if public_key is not None else set())
    reasons = _parameter_mismatches(memory, cert)
    params_ok = not reasons
    logged, at_record = None, None
    if report is not None:
        index = index_log(report) if index is None and report.ok else index
        logged, at_record = matches_the_log(cert, report, reasons, memory.state_digest(),
                                            index)
        if logged and removal_pruned(cert, index):  # the log no longer holds its fields
            ran.discard(LOG)
    signed = None
    if public_key is not None:
        bad_signature = signature_errors(cert, public_key)
        signed = not bad_signature
        reasons += bad_signature
    now = at_record is None  # False: checked later, against the chain
    digest_ok = memory.state_digest() == cert.state_digest if now else bool(logged)
    if not digest_ok and now:
        reasons.append("state_digest differs from the memory's: the certificate describes "
                       "another state" + ("" if report is not None else
                       " (if the memory has changed since this removal, give its audit log, "
                       "log= / --log, to check the certificate against the chain)"))
    ss = memory.solver_state
    absent = cert.removed_id not in ss.id_to_slot
    if not absent:
        reasons.append(f"removed_id: token {cert.removed_id} is still in the memory")
    elif cert.removed_id >= ss.next_id:
        reasons.append(f"removed_id: token {cert.removed_id} was never added (the memory "
                       f"has issued ids 0..{ss.next_id - 1})")
    proof = None
    if retrain and params_ok:  # the proof, from the keys (not the memory's caches)
        ran.add(OPTIMALITY)
        proof = check_optimality(memory.keys, memory.alpha, memory.mu, memory.C,
                                 memory.kernel, memory.gamma_value, warm=memory.warm,
                                 tol=tol, progress=progress)
        kkt, unique = proof.kkt_residual, proof.unique
        reasons += list(proof.reasons)
        reasons += _label_mismatches(memory)
    else:  # the state's own account: compared, but binds nothing (its caches)
        kkt = memory.kkt_residual()
        # checked later, what the removal left is the chain's word (the present state's
        # uniqueness is the last removal's business: its Cholesky test is not repeated)
        unique = memory.unique_optimum() if now else cert.unique_optimum
        if not kkt <= tol:
            reasons.append(f"KKT residual {kkt:.2e} above {tol:.0e}")
    reasons += cert.consistency_errors()
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
    common = dict(digest_matches=digest_ok, removed_absent=absent, kkt_residual=kkt,
                  unique_optimum=unique, tolerance=tol, parameters_match=params_ok,
                  copies=copies, logged=logged, signed=signed, compacted=ss.n_compacted,
                  signature_present=cert.signature is not None, issued_at_record=at_record,
                  optimality=proof)
    if not (retrain and oracle) or len(memory) == 0 or not params_ok:
        return DeletionVerification(
            ok=not reasons, retrained=False, reasons=tuple(reasons), **common,
            verdict=judge(cert, ran, reasons, blame=_CLAIMED))
    if progress is not None:
        progress("oracle", 0, len(memory))
    cross = oracle_comparison(memory, probes=probes, tol=tol, seed=seed, unique=unique)
    if progress is not None:
        progress("oracle", len(memory), len(memory))
    reasons += list(cross.reasons)
    return DeletionVerification(
        ok=not reasons, retrained=True, partition_equal=cross.partition_equal,
        max_alpha_dev=cross.max_alpha_dev, decision_dev=cross.decision_dev,
        readout_dev=cross.readout_dev, n_probes=cross.n_probes, reasons=tuple(reasons),
        **common, verdict=judge(cert, ran | {RESOLVE}, reasons, blame=_CLAIMED),
    )


def _label_mismatches(memory: SVDDMemory) -> list[str]:
    """Live tokens whose set label (the state's partition) is not the one their alpha
    says: reserve at 0, error at C, margin between (warm-up: every token margin)."""
    if memory.warm or len(memory) == 0:
        return []
    ss = memory.solver_state
    slots = ss.ordered_slots()
    a, code, C = ss.alpha[slots], ss.state[slots], memory.C
    fits = np.where(code == RESERVE, a == 0,
                    np.where(code == ERROR, a == C, (code == MARGIN) & (a > 0) & (a < C)))
    wrong = ss.slot_id[slots[~fits]]
    if not len(wrong):
        return []
    return [f"partition_after: the state labels tokens {sorted(wrong.tolist())[:5]} with a "
            "set their alpha is not in (reserve: 0, error: C, margin: between)"]


# failures of the re-solve, charged to the claim it checks
_EXACT = "exact optimum of the remaining tokens"
_CLAIMED = {"decision function differs": _EXACT, "partition differs": _EXACT,
            "alpha differs": _EXACT, "readout differs": _EXACT,
            # the optimality proof's failures (svattn.exact.auditor.optimality)
            "KKT residual": _EXACT, "alpha": _EXACT, "mu:": _EXACT,
            "the state is in warm-up": _EXACT}


@dataclass(frozen=True)
class ErasureVerification(HasVerdict):
    """Result of :func:`verify_erasure`: ``ok`` (nothing failed), every failed check
    named, each certificate's own verification, and the :class:`Verdict` on the
    receipt's fields (``status``: VERIFIED only when every field was checked)."""

    ok: bool
    erased: int
    last_removal: DeletionVerification | None
    signed: bool | None = None
    reasons: tuple[str, ...] = ()
    removals: tuple[DeletionVerification, ...] = ()
    logged: bool | None = None
    verdict: Verdict | None = None

    def summary(self) -> str:
        """One line for people."""
        sig = "" if self.signed is None else (", signature ok" if self.signed
                                              else ", signature INVALID")
        log = "" if self.logged is None else (", audit log records it" if self.logged
                                              else ", audit log DISAGREES")
        tail = "; ".join(self.reasons)
        out = (f"{self.status}: erasure of {self.erased} tokens ({len(self.removals)} "
               f"certificates checked){sig}{log}" + (f"; {tail}" if tail else ""))
        if self.verdict is not None and self.verdict.unchecked:
            out += f"; UNCHECKED (nothing checked them): {self.verdict.unchecked_line()}"
        if self.verdict is not None and self.verdict.authenticity_unchecked:
            out += f"; the audit log's authenticity UNCHECKED: {self.verdict.authenticity_line()}"
        return out


def verify_erasure(memory: SVDDMemory, receipt: ErasureReceipt, retrain: bool = True, *,
                   tol: float = 1e-8, public_key=None, seed: int = 0,
                   log: str | os.PathLike[str] | None = None, oracle: bool = False,
                   oracle_force: bool = False, progress: Progress | None = None
                   ) -> ErasureVerification:
    """Check an :class:`ErasureReceipt` against the memory right after the erasure (or,
    with ``log``, any later state of it that is the log's end).

    Every id was issued and is gone; no live token carries the subject's tag hash;
    the receipt's certificates are the removals of exactly those ids, and *every* one
    is checked: the last in full against the state (:func:`verify_deletion`, retrain
    included), each earlier one against the state as far as it can be (well-formed,
    consistent, the memory's parameters, its token gone) and, with ``log``, against
    the chain (checked later: the log records it at a record with its digest). A live
    token holding an erased record's key and value must be one the receipt lists as
    another subject's copy; the digest and size are the memory's.

    ``retrain``, ``oracle``, ``oracle_force`` and ``progress`` are
    :func:`verify_deletion`'s, for the last certificate: the optimality proof of the
    remaining tokens from their keys, and optionally the dense oracle's cross-check.
    A malformed state's C raises ``ValueError`` (as :func:`verify_deletion`).

    With ``public_key`` the receipt's signature and each certificate's must verify.
    With ``log`` the chain must verify; the receipt must equal the log's ``erase``
    record of these ids (tag hash, erased ids, signer, signature and, in logs that keep
    it, the receipt's SHA-256, which binds every other field); its digest and size must
    be the record's; and no live token may be one the log's add records gave the
    subject's tag (a state whose stored tags were edited). The log's checkpoint is
    checked as :func:`verify_deletion` checks it: the status is at best UNCHECKED over
    an unsigned log or without ``public_key``.
    """
    refuse_malformed_state(memory)
    if retrain and oracle:
        refuse_oracle(len(memory), oracle_force)
    reasons = list(receipt.field_errors())
    if reasons:
        return ErasureVerification(ok=False, erased=0, last_removal=None,
                                   reasons=tuple(reasons), verdict=judge(receipt, (), reasons))
    ran = {STATE} | ({LOG} if log is not None else set())
    signed = None
    if public_key is not None:
        ran.add(SIGNATURE)
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
    present = memory.state_digest()
    rep, logged, partial = None, None, {}
    if log is not None:
        rep = verify_chain(Path(log))
        logged, partial = _erasure_matches_the_log(receipt, rep, reasons, present, len(memory))
        if rep.ok:
            tagged = sorted(tok["id"] for _, tok in added_tokens(rep.records)
                            if tok.get("tag") == receipt.tag_hash
                            and tok.get("id") in ss.id_to_slot)
            if tagged:
                reasons.append(f"tag_hash: the audit log added live tokens {tagged[:5]} for "
                               "this subject (the state's tags were edited)")
    later = rep is not None and rep.ok and receipt.state_digest != present
    if not later:  # checked now: the state is the one the erasure left
        if receipt.state_digest != present:
            reasons.append("state_digest differs from the memory's")
        if receipt.n_after != len(memory):
            reasons.append(f"n_after: the receipt says {receipt.n_after}, the memory holds "
                           f"{len(memory)}")
    index = index_log(rep) if rep is not None and rep.ok else None
    removals = []
    for k, c in enumerate(certs):
        last = k == len(certs) - 1
        if last or rep is not None:  # the state right after it, or the chain
            v = _check_deletion(memory, c, retrain and last, tol=tol, seed=seed,
                                public_key=public_key, report=rep, oracle=oracle,
                                progress=progress, index=index)
            skip = ("live tokens",) if log is None else ("live tokens", "the audit log does not")
            reasons += [f"certificates[{k}]: {r}" for r in v.reasons if not r.startswith(skip)]
        else:  # an earlier removal, without the chain: what the present state allows
            errs = c.consistency_errors() + _parameter_mismatches(memory, c)
            if public_key is not None:
                errs += signature_errors(c, public_key)
            reasons += [f"certificates[{k}]: {r}" for r in errs]
            v = DeletionVerification(
                ok=not errs, digest_matches=False, removed_absent=c.removed_id not in
                ss.id_to_slot, kkt_residual=float("nan"), retrained=False,
                unique_optimum=c.unique_optimum, tolerance=tol, reasons=tuple(errs),
                verdict=judge(c, {SIGNATURE} if public_key is not None else (), errs))
        removals.append(v)
        if progress is not None:
            progress("certificates", k + 1, len(certs))
    for c, v in zip(certs, removals, strict=True):  # copies may stay only as others' data
        copies = v.copies if v.retrained or v.issued_at_record is not None or v.copies else \
            _live_copies(memory, c)
        extra = [t for t in copies if t not in receipt.copies_kept.get(str(c.removed_id), [])]
        if extra:
            reasons.append(f"live tokens {extra} hold the data of erased token "
                           f"{c.removed_id} and are not another subject's copies")
    if retrain and certs and removals[-1].optimality is not None:
        ran.add(OPTIMALITY)
    if retrain and certs and removals[-1].retrained:
        ran.add(RESOLVE)
    if later:
        partial = {**partial, "state_digest": {STATE}, "n_after": {STATE}}
    return with_log_authenticity(ErasureVerification(
        ok=not reasons, erased=len(receipt.erased_ids),
        last_removal=removals[-1] if removals else None, signed=signed,
        reasons=tuple(reasons), removals=tuple(removals), logged=logged,
        verdict=judge(receipt, ran, reasons, blame=_CLAIMED, partial=partial)), log, rep,
        public_key)


def _erasure_matches_the_log(receipt: ErasureReceipt, rep: AuditReport, reasons: list[str],
                             present: str, n_now: int) -> tuple[bool, dict[str, set[str]]]:
    """Whether the verified chain ``rep`` records this very receipt: its ``erase`` record
    of these ids names the same subject, signer and signature (and, where the record
    keeps it, the receipt's SHA-256), with the receipt's digest and size, and ends at
    the memory's present digest. Returns that and the fields the log could not bind
    (an older record without the receipt's hash)."""
    if not rep.ok:
        reasons.append(f"the audit log does not verify: {rep.error}")
        return False, {}
    erases = [r for r in rep.records if r["op"] == "erase"
              and r["erasure"].get("erased_ids") == receipt.erased_ids]
    if not erases:
        reasons.append(f"erased_ids: the audit log records no erasure of ids "
                       f"{receipt.erased_ids[:5]}")
        return False, {}
    rec = erases[-1]
    er, before = len(reasons), rec["erasure"]
    for name in ("tag_hash", "signer", "signature"):  # (pruned: the receipt's hash binds them)
        if before.get("pruned") is not True and before.get(name) != getattr(receipt, name):
            reasons.append(f"{name}: the audit log's erase record (record {rec['seq']}) has "
                           f"another {name}")
    partial = {}
    if "receipt_sha256" in before:
        if before["receipt_sha256"] != receipt.sha256():
            reasons.append(f"the audit log's erase record (record {rec['seq']}) holds another "
                           "receipt (its SHA-256 differs: a field was edited)")
    else:  # an older log: only the signature binds what the record does not name
        partial = {"copies_kept": {LOG}, "issued_at": {LOG}}
    if rec.get("digest") != receipt.state_digest:  # (a re-hashed log may lack it)
        reasons.append(f"state_digest: the audit log's erase record (record {rec['seq']}) has "
                       "another digest")
    if rec["n"] != receipt.n_after:
        reasons.append(f"n_after: the audit log's erase record (record {rec['seq']}) says "
                       f"{rec['n']} tokens were left")
    if rep.final_digest != present:
        reasons.append("state_digest: the memory is not the audit log's end (its final "
                       "digest is another)")
    return len(reasons) == er, partial


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
    if memory.warm:
        sizes = {"margin": len(memory), "error": 0, "reserve": 0}
    else:
        code = ss.state[ss.live_slots()]
        sizes = {"margin": int((code == MARGIN).sum()), "error": int((code == ERROR).sum()),
                 "reserve": int((code == RESERVE).sum())}
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


__all__ = ["ORACLE_MAX_TOKENS", "DeletionVerification", "ErasureVerification", "verify_deletion",
           "verify_erasure", "verify_log", "with_log_authenticity"]
