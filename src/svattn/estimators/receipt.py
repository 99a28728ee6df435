"""What :meth:`SVDD.forget <svattn.estimators.SVDD.forget>` hands out, and its check.

A :class:`ForgetReceipt` says which rows went (their ids as the user gave them, and
their positions, the exact core's token ids), the data subject when the forget was a
subject's, the core's records of the removal (one :class:`~svattn.exact.DeletionCertificate`
per row, or for a subject the core's one
:class:`~svattn.exact.records.certificate.ErasureReceipt`), the model's digest and size
after, and the recipe of the fresh fit the model now equals: ``SVDD(C=C, gamma=gamma,
kernel=kernel)`` on the remaining rows (an auditor's ``SVDD(nu=...)`` refit differs:
``C_ = 1/(nu n)`` moves with n). It is JSON (:meth:`ForgetReceipt.to_json`,
:meth:`ForgetReceipt.from_json`) and, when the model holds the controller's key,
signed (:mod:`svattn.exact.records.signing`).

:func:`verify_forget_receipt` checks one against the model right after the forget,
through the core's verifiers (:func:`~svattn.exact.auditor.verify.verify_deletion`,
:func:`~svattn.exact.auditor.verify.verify_erasure`), with the model's audit log and
the controller's public key where given.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from svattn.exact import DeletionCertificate
from svattn.exact.auditor.verify import verify_deletion, verify_erasure
from svattn.exact.core.kernels import kernel_names
from svattn.exact.records.certificate import (
    ErasureReceipt,
    certificate_dict_errors,
    finite_number,
    json_fields,
    signer_errors,
)
from svattn.exact.records.receipts import (
    FORM,
    LOG,
    OPTIMALITY,
    SIGNATURE,
    STATE,
    HasVerdict,
    Verdict,
    judge,
)
from svattn.exact.records.signing import load_public_key, signature_errors

FORGET_RECEIPT_VERSION = 2  # 2: ids, positions, subject, erasure, refit_with, signed
_HEX = frozenset("0123456789abcdef")
_SIGNED_PREFIX = b"svattn-estimator-forget-receipt-v2|"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


@dataclass(frozen=True)
class ForgetReceipt:
    """What :meth:`SVDD.forget <svattn.estimators.SVDD.forget>` did.

    Attributes
    ----------
    ids : tuple of int or str
        The ids of the rows removed (index labels, ``ids=``, or positions), in the
        order removed.
    positions : tuple of int
        Their positions (running sample indices: the core's token ids), aligned.
    subject : str or None
        The data subject whose rows these were (``forget(subject=...)``), else None.
        In clear: the receipt is the subject's; the audit log keeps only a keyed hash.
    certificates : tuple of DeletionCertificate
        One exact-removal certificate per row (empty for a subject's forget, whose
        certificates the erasure receipt carries).
    erasure : ErasureReceipt or None
        For a subject's forget, the core's one receipt of it (its keyed tag hash, the
        positions erased, every certificate, copies of the data other subjects hold).
    state_digest : str
        The model's state digest after the forget.
    n_samples : int
        Rows the model holds afterwards.
    refit_with : dict
        ``{"C": C_, "gamma": gamma_, "kernel": kernel}``: the model equals
        ``SVDD(C=C, gamma=gamma, kernel=kernel).fit(remaining rows)``.
    issued_at : str
        UTC time of issue (ISO 8601).
    version : int
    signer, signature : str or None
        The controller's Ed25519 key fingerprint and signature over every other field,
        when the model holds its key (``SVDD(signing_key=...)``).
    weights : dict or None
        The ``sample_weight`` the model holds its rows under (absent: 1 each). Equal
        weights: ``{"uniform": w}``, the core's certificates as usual. Unequal weights
        (the weighted solver, no certificates): ``{"removed": [the removed rows'
        weights], "sha256": weight_digest of the rows left (in ``ids_`` order), "n",
        "sum", "kkt_residual_after"}``. The model equals
        ``SVDD(**refit_with).fit(rows left, sample_weight=their weights)``.
    """

    # What binds each field (svattn.exact.records.receipts). The audit log is the core
    # memory's: it records each removal's certificate and a subject's erasure receipt
    # (tag hash, never the subject), not the ids a user gave; those, the subject in clear
    # and the time are the controller's word, bound by its signature. The digest and size
    # after are the last removal's (checked equal), which the log records.
    CHECKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "ids": (SIGNATURE,),
        "positions": (LOG, SIGNATURE),
        "subject": (SIGNATURE,),
        "certificates": (LOG, SIGNATURE),
        "erasure": (LOG, SIGNATURE),
        "state_digest": (STATE, LOG, SIGNATURE),
        "n_samples": (STATE, LOG, SIGNATURE),
        "refit_with": (STATE, SIGNATURE),
        "weights": (STATE, SIGNATURE),
        "issued_at": (SIGNATURE,),
        "version": (FORM,),
        "signer": (SIGNATURE,),
        "signature": (SIGNATURE,),
    }
    CLAIMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "exact optimum of the remaining tokens": (OPTIMALITY,)}

    ids: tuple
    positions: tuple[int, ...]
    subject: str | None
    certificates: tuple[DeletionCertificate, ...]
    erasure: ErasureReceipt | None
    state_digest: str
    n_samples: int
    refit_with: dict[str, Any]
    issued_at: str = field(default_factory=_now_iso)
    version: int = FORGET_RECEIPT_VERSION
    signer: str | None = None
    signature: str | None = None
    weights: dict[str, Any] | None = None

    # ------------------------------------------------------------ reading
    def deletion_certificates(self) -> list[DeletionCertificate]:
        """Every removal's certificate, in order (a subject's: its erasure receipt's)."""
        if self.erasure is not None:
            return self.erasure.deletion_certificates()
        return list(self.certificates)

    def summary(self) -> str:
        """One line for people."""
        certs = self.deletion_certificates()
        worst = max((c.kkt_residual_after for c in certs), default=0.0)
        if self.weights is not None and "sha256" in self.weights:
            worst = float(self.weights["kkt_residual_after"])
        bound = "<= 1e-10" if worst <= 1e-10 else f"max {worst:.1e}"
        who = f" of subject {self.subject!r}" if self.subject is not None else ""
        shown = ", ".join(map(repr, self.ids[:5])) + (", …" if len(self.ids) > 5 else "")
        signed = "signed" if self.signature is not None else "unsigned"
        how = f"{len(certs)} certificates" if certs else "a weighted re-solve"
        return (f"forgot {len(self.ids)} samples{who} exactly (ids {shown}; {how}, "
                f"all KKT {bound}; {signed}); state digest "
                f"{self.state_digest[:16]}…, {self.n_samples} samples left; refit with "
                f"C={self.refit_with['C']!r}, gamma={self.refit_with['gamma']!r}")

    # ------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready data (tuples as lists, records as objects)."""
        # (no weights: the field is left out, as receipts before it were written and signed)
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if not (f.name == "weights" and self.weights is None)}

    def to_json(self) -> str:
        """Serialise to a JSON string (round-trips through :meth:`from_json`)."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    def signed_bytes(self) -> bytes:
        """What a signature covers: the canonical JSON of every field but ``signature``."""
        body = {k: v for k, v in self.to_dict().items() if k != "signature"}
        return _SIGNED_PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=True, allow_nan=False).encode()

    @classmethod
    def from_json(cls, text: str) -> ForgetReceipt:
        """Parse a receipt written by :meth:`to_json`.

        Raises
        ------
        ValueError
            Not JSON, not an object, a field missing or unknown, a field of the wrong
            form (each named).
        """
        data = json_fields(text, cls, "forget receipt",
                           optional={"issued_at", "signer", "signature", "weights"})
        errs = []
        if not isinstance(data["ids"], list):
            errs.append("ids must be a list of ids (ints or strs)")
        if not isinstance(data["positions"], list):
            errs.append("positions must be a list of ints")
        certs = data["certificates"]
        if not isinstance(certs, list):
            errs.append("certificates must be a list of certificate objects")
        else:
            for k, c in enumerate(certs):
                errs += [f"certificates[{k}]: {e}" for e in certificate_dict_errors(c)]
        erasure = data["erasure"]
        if erasure is not None:
            if not isinstance(erasure, dict):
                errs.append("erasure must be an erasure receipt object or null")
            else:
                try:
                    erasure = ErasureReceipt.from_json(json.dumps(erasure))
                except ValueError as exc:
                    errs.append(f"erasure: {exc}")
        if errs:
            raise ValueError("forget receipt: " + "; ".join(errs))
        receipt = cls(**{**data, "ids": tuple(data["ids"]),
                         "positions": tuple(data["positions"]),
                         "certificates": tuple(DeletionCertificate(**c) for c in certs),
                         "erasure": erasure})
        errs = receipt.field_errors()
        if errs:
            raise ValueError("forget receipt: " + "; ".join(errs))
        return receipt

    def field_errors(self) -> list[str]:
        """Fields of the wrong type or form, each named (empty list when well-formed)."""
        errs = []

        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if not (isinstance(self.ids, tuple) and self.ids
                and all(integer(i) or isinstance(i, str) for i in self.ids)):
            errs.append("ids must be a non-empty list of ids (ints or strs)")
        elif len(set(self.ids)) != len(self.ids):
            errs.append("ids lists a row twice")
        if not (isinstance(self.positions, tuple)
                and all(integer(t) and t >= 0 for t in self.positions)):
            errs.append("positions must be a list of ints >= 0")
        elif isinstance(self.ids, tuple) and len(self.positions) != len(self.ids):
            errs.append(f"positions must give one position per id ({len(self.ids)} ids, "
                        f"{len(self.positions)} positions)")
        if not (self.subject is None or (isinstance(self.subject, str) and self.subject)):
            errs.append("subject must be a non-empty string or null")
        if not (isinstance(self.certificates, tuple)
                and all(isinstance(c, DeletionCertificate) for c in self.certificates)):
            errs.append("certificates must be a list of deletion certificates")
        else:
            for k, c in enumerate(self.certificates):
                errs += [f"certificates[{k}]: {e}" for e in c.field_errors()]
        if self.erasure is not None and not isinstance(self.erasure, ErasureReceipt):
            errs.append("erasure must be an erasure receipt or null")
        elif self.erasure is not None:
            errs += [f"erasure: {e}" for e in self.erasure.field_errors()]
        weighted = isinstance(self.weights, dict) and "sha256" in self.weights
        errs += _weights_errors(self.weights)
        if (self.erasure is None) != (self.subject is None):
            errs.append("subject: a subject's forget carries its erasure receipt, and only it")
        elif weighted and (self.certificates or self.erasure is not None):
            errs.append("certificates: a forget under unequal weights carries none (its "
                        "weights record the re-solve)")
        elif not weighted and isinstance(self.certificates, tuple) and bool(
                self.certificates) == (self.erasure is not None):
            errs.append("certificates: exactly one of certificates (a forget by id) and "
                        "erasure (a subject's forget) must be given")
        if not (isinstance(self.state_digest, str) and len(self.state_digest) == 64
                and set(self.state_digest) <= _HEX):
            errs.append("state_digest must be 64 lowercase hex digits")
        if not (integer(self.n_samples) and self.n_samples >= 0):
            errs.append(f"n_samples must be an int >= 0, got {self.n_samples!r}")
        errs += _refit_errors(self.refit_with)
        if not isinstance(self.issued_at, str):
            errs.append(f"issued_at must be an ISO 8601 string, got {self.issued_at!r}")
        if self.version != FORGET_RECEIPT_VERSION:
            errs.append(f"version must be {FORGET_RECEIPT_VERSION}, got {self.version!r}")
        errs += signer_errors(self.signer, self.signature)
        return errs


def _refit_errors(recipe) -> list[str]:
    if not (isinstance(recipe, dict) and set(recipe) == {"C", "gamma", "kernel"}):
        return ["refit_with must map exactly C, gamma and kernel"]
    errs = []
    for name in ("C", "gamma"):
        v = recipe[name]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)
                and v > 0):
            errs.append(f"refit_with: {name} must be a number > 0, got {v!r}")
    if recipe["kernel"] not in kernel_names():
        errs.append(f"refit_with: kernel must be one of {sorted(kernel_names())}, got "
                    f"{recipe['kernel']!r}")
    return errs


def _weights_errors(record) -> list[str]:
    if record is None:
        return []
    if isinstance(record, dict) and set(record) == {"uniform"}:
        w = record["uniform"]
        ok = isinstance(w, (int, float)) and not isinstance(w, bool) and finite_number(w) and w > 0
        return [] if ok else [f"weights: uniform must be a number > 0, got {w!r}"]
    keys = {"removed", "sha256", "n", "sum", "kkt_residual_after"}
    if not (isinstance(record, dict) and set(record) == keys):
        return ["weights must be null, {uniform} or {removed, sha256, n, sum, "
                "kkt_residual_after}"]
    errs = []
    removed = record["removed"]
    if not (isinstance(removed, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)
            and v >= 0 for v in removed)):
        errs.append("weights: removed must be a list of numbers >= 0")
    sha = record["sha256"]
    if not (isinstance(sha, str) and len(sha) == 64 and set(sha) <= _HEX):
        errs.append("weights: sha256 must be 64 lowercase hex digits")
    for name in ("sum", "kkt_residual_after"):
        v = record[name]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)
                and v >= 0):
            errs.append(f"weights: {name} must be a number >= 0")
    if not (isinstance(record["n"], int) and not isinstance(record["n"], bool)
            and record["n"] >= 0):
        errs.append("weights: n must be an int >= 0")
    return errs


def _plain(value):
    """A field's value as JSON-ready data."""
    if isinstance(value, (DeletionCertificate, ErasureReceipt)):
        return asdict(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- verification


@dataclass(frozen=True)
class ForgetReceiptVerification(HasVerdict):
    """Result of :func:`verify_forget_receipt`: ``ok`` (nothing failed), the failures,
    and the :class:`~svattn.exact.records.receipts.Verdict` on the receipt's fields
    (``status``: VERIFIED only when every field was checked and passed)."""

    ok: bool
    reasons: tuple[str, ...]
    verdict: Verdict

    def summary(self) -> str:
        """One line for people."""
        out = self.verdict.headline()
        if self.reasons:
            out += ": " + "; ".join(self.reasons)
        return out


def verify_forget_receipt(model, receipt: ForgetReceipt, *, retrain: bool = True,
                          tol: float = 1e-8, log=None, public_key=None
                          ) -> ForgetReceiptVerification:
    """Check :meth:`SVDD.forget <svattn.estimators.SVDD.forget>`'s receipt against the
    model right after the forget (as it was saved then, :meth:`SVDD.save
    <svattn.estimators.SVDD.save>`) or, with its audit log, any later state of it that
    ends the log (*checked later*, as the core's verifiers do).

    Parameters
    ----------
    model : SVDD
        The fitted model.
    receipt : ForgetReceipt
    retrain : bool
        Check the last removal against the core's independent re-solve of the rows
        that remain (:func:`~svattn.exact.auditor.verify.verify_deletion`).
    tol : float
        Tolerance of that comparison.
    log : path-like, optional
        The model's audit log (``SVDD(audit_log=...)``): it must record every removal
        (or the subject's erasure) exactly as the receipt carries it, and end at the model;
        its checkpoint must be the root of its entries and, with ``public_key``, signed
        by it (an unsigned log, or no key: ``verdict.authenticity_unchecked``, the status
        at best UNCHECKED).
    public_key : Ed25519PublicKey or path, optional
        The controller's public key: the receipt, every certificate and the erasure
        receipt must carry its valid signatures.

    What is checked: the receipt's form; the certificates (or the erasure receipt) by
    the core's verifiers against the model's memory (the last removal in full, each
    earlier one against the log or, without it, as far as the present state allows);
    that the positions are the ones they removed, in order; the digest and size as the
    last removal left them and, right after the forget, as the model's (and no id held);
    the refit recipe against the model; the signature. The ids, the
    subject in clear and the time are the controller's word: only the signature binds
    them, so without ``public_key`` the verdict is at best UNCHECKED.

    Returns
    -------
    ForgetReceiptVerification
    """
    if public_key is not None and not hasattr(public_key, "verify"):
        public_key = load_public_key(public_key)
    errs = receipt.field_errors() if isinstance(receipt, ForgetReceipt) else [
        "receipt: not a ForgetReceipt"]
    if errs:
        return ForgetReceiptVerification(ok=False, reasons=tuple(errs),
                                         verdict=judge(receipt, (), errs))
    mem = model.memory_
    if isinstance(receipt.weights, dict) and "sha256" in receipt.weights:
        return _verify_weighted(model, receipt, retrain, tol, log, public_key)
    reasons: list[str] = []
    authenticity: list[str] = []  # what of the log's checkpoint the core could not check
    if receipt.erasure is not None:
        v = verify_erasure(mem, receipt.erasure, retrain, tol=tol, public_key=public_key,
                           log=log)
        reasons += [f"erasure: {r}" for r in v.reasons]
        authenticity += v.verdict.authenticity_unchecked if v.verdict is not None else ()
        removed = list(receipt.erasure.erased_ids)
    else:
        certs = receipt.certificates
        for k, c in enumerate(certs):
            last = k == len(certs) - 1
            if last or log is not None:
                v = verify_deletion(mem, c, retrain and last, tol=tol, log=log,
                                    public_key=public_key)
                reasons += [f"certificates[{k}]: {r}" for r in v.reasons]
                authenticity += v.verdict.authenticity_unchecked if v.verdict else ()
            else:  # an earlier removal without the log: what the present state allows
                errs = c.consistency_errors()
                if (c.C, c.kernel, c.gamma) != (mem.C, mem.kernel, mem.gamma_value):
                    errs.append("C, kernel, gamma: not the model's")
                if mem.view.holds(c.removed_id):
                    errs.append(f"removed_id: token {c.removed_id} is still held")
                if public_key is not None:
                    errs += signature_errors(c, public_key)
                reasons += [f"certificates[{k}]: {e}" for e in errs]
        removed = [c.removed_id for c in certs]
    if list(receipt.positions) != removed:
        reasons.append("positions: they are not the positions the "
                       f"{'erasure' if receipt.erasure is not None else 'certificates'} "
                       "removed, in order")
    if receipt.erasure is not None:
        last_digest, last_n = receipt.erasure.state_digest, receipt.erasure.n_after
    else:
        final = receipt.certificates[-1]
        last_digest, last_n = final.state_digest, sum(final.partition_after.values())
    if receipt.state_digest != last_digest:
        reasons.append("state_digest: not the digest the last removal left")
    if receipt.n_samples != last_n:
        reasons.append(f"n_samples: the receipt says {receipt.n_samples}, the last removal "
                       f"left {last_n}")
    now = receipt.state_digest == mem.state_digest()
    if now:  # the model right after the forget
        if receipt.n_samples != len(mem):
            reasons.append(f"n_samples: the receipt says {receipt.n_samples}, the model holds "
                           f"{len(mem)}")
        held = set(model.ids_.tolist())
        back = [i for i in receipt.ids if i in held]
        if back:
            reasons.append(f"ids: {back[:5]!r} are held by the model")
    elif log is None:
        reasons.append("state_digest differs from the model's (a later model: give its "
                       "audit log to check the receipt against the chain)")
    if public_key is not None:
        reasons += signature_errors(receipt, public_key)
    recipe = {"C": model.C_, "gamma": model.gamma_, "kernel": mem.kernel}
    if receipt.refit_with != recipe:
        reasons.append(f"refit_with: the receipt says {receipt.refit_with}, the model's is "
                       f"{recipe}")
    unit = float(model.weights_[0]) if len(mem) else 1.0
    if now and (receipt.weights or {"uniform": 1.0})["uniform"] != unit:
        reasons.append(f"weights: the receipt says {receipt.weights}, the model's rows each "
                       f"carry {unit}")
    ran = {STATE} | ({LOG} if log is not None else set()) | (
        {SIGNATURE} if public_key is not None else set()) | ({OPTIMALITY} if retrain else set())
    # checked later: the chain (the core's verifiers) binds the digest and size, not the
    # state, which has moved on
    partial = {} if now else {"state_digest": {STATE}, "n_samples": {STATE}}
    return ForgetReceiptVerification(ok=not reasons, reasons=tuple(reasons),
                                     verdict=judge(receipt, ran, reasons, partial=partial,
                                                   authenticity_unchecked=authenticity))


def _verify_weighted(model, receipt: ForgetReceipt, retrain: bool, tol: float, log,
                     public_key) -> ForgetReceiptVerification:
    """:func:`verify_forget_receipt` of a forget under unequal weights: the model right
    after it (there is no log), its weights against the receipt's digest, and, with
    ``retrain``, its coefficients against the reference solver with per-sample boxes."""
    import numpy as np

    from svattn.estimators.weighted import WeightedMemory, weight_digest
    from svattn.exact.core.kernels import gram_matrix
    from svattn.exact.oracle import solve_svdd

    mem, record, reasons = model.memory_, receipt.weights, []
    if log is not None:
        reasons.append("log: a model under unequal sample weights keeps no audit log")
    if not isinstance(mem, WeightedMemory):
        reasons.append("weights: the receipt is of a forget under unequal weights, the "
                       "model holds equal ones")
    else:
        if receipt.state_digest != mem.state_digest():
            reasons.append("state_digest differs from the model's (a weighted receipt is "
                           "checked against the model right after the forget)")
        if receipt.n_samples != len(mem) or record["n"] != len(mem):
            reasons.append(f"n_samples: the receipt says {receipt.n_samples}, the model holds "
                           f"{len(mem)}")
        if record["sha256"] != weight_digest(mem.weights):
            reasons.append("weights: sha256 is not the digest of the weights the model holds")
        held = set(model.ids_.tolist())
        back = [i for i in receipt.ids if i in held]
        if back:
            reasons.append(f"ids: {back[:5]!r} are held by the model")
        if any(mem.holds(t) for t in receipt.positions):
            reasons.append("positions: some are still held")
        on = mem.weights > 0
        if retrain and on.any():
            K = gram_matrix(mem.keys[on], mem.kernel, mem.gamma_value)
            fresh = solve_svdd(K, mem.boxes()[on])
            gap = float(np.abs(fresh - mem.alpha[on]).max())
            if gap > tol:
                reasons.append(f"optimality: alpha differs from the reference re-solve of "
                               f"the rows left by {gap:.3g} > {tol:g}")
    recipe = {"C": model.C_, "gamma": model.gamma_, "kernel": mem.kernel}
    if receipt.refit_with != recipe:
        reasons.append(f"refit_with: the receipt says {receipt.refit_with}, the model's is "
                       f"{recipe}")
    if public_key is not None:
        reasons += signature_errors(receipt, public_key)
    ran = {STATE} | ({SIGNATURE} if public_key is not None else set()) | (
        {OPTIMALITY} if retrain else set())
    return ForgetReceiptVerification(ok=not reasons, reasons=tuple(reasons),
                                     verdict=judge(receipt, ran, reasons))


__all__ = ["FORGET_RECEIPT_VERSION", "ForgetReceipt", "ForgetReceiptVerification",
           "verify_forget_receipt"]
