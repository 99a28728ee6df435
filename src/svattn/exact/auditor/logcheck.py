"""The audit log's side of verification: a log against a certificate and a saved state.

:func:`matches_the_log` checks that a hash-chained audit log records a deletion
certificate exactly (:func:`svattn.exact.auditor.verify.verify_deletion` with ``log``);
:func:`verify_log` re-checks a log's chain and, given a saved state, that the log ends
at exactly that state; :func:`check_authenticity` checks the log's checkpoint (and the
one the state records) against the log's Merkle tree and the controller's verifier
key, naming what it could not check (``docs/design.md`` §4); :func:`with_log_authenticity`
adds what it found to a receipt's verification.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from svattn.exact.memory import SVDDMemory
from svattn.exact.records.audit import STATE_OPS, AuditReport, checkpoint_mismatch, verify_chain
from svattn.exact.records.certificate import KEYED, DeletionCertificate
from svattn.exact.records.fileformat import StateFileError, parse_header, read_metadata
from svattn.exact.records.note import NoteVerifier, TlogError, key_id
from svattn.exact.records.receipts import with_authenticity
from svattn.exact.records.signing import load_public_key
from svattn.exact.records.tlog import (
    checkpoint_path,
    controller_verifier,
    log_origin,
    open_checkpoint,
    read_checkpoint_unverified,
)


@dataclass(frozen=True)
class LogIndex:
    """A verified chain's removals and adds by token id, and its keyed adds by
    commitment, read once (an erasure checks one certificate per token against it)."""

    removals: dict[int, list[dict]]
    """removed id -> its remove records, in order"""
    adds: dict[int, list[tuple[int, dict]]]
    """token id -> ``(seq, token entry)`` of the add / extend records that added it"""
    by_commitment: dict[str, list[tuple[int, int]]]
    """commitment -> ``(seq, id)`` of every token added with it"""


def index_log(rep: AuditReport) -> LogIndex:
    """The :class:`LogIndex` of a verified chain ``rep`` (one pass over its records)."""
    removals: dict[int, list[dict]] = {}
    for r in rep.records:
        if r["op"] == "remove":
            removals.setdefault(r["certificate"].get("removed_id"), []).append(r)
    adds: dict[int, list[tuple[int, dict]]] = {}
    by_commitment: dict[str, list[tuple[int, int]]] = {}
    for q, tok in added_tokens(rep.records):
        adds.setdefault(tok.get("id"), []).append((q, tok))
        c = tok.get("commitment")
        if isinstance(c, str):
            by_commitment.setdefault(c, []).append((q, tok.get("id")))
    return LogIndex(removals, adds, by_commitment)


def matches_the_log(cert: DeletionCertificate, rep: AuditReport, reasons: list[str],
                    present: str, index: LogIndex | None = None) -> tuple[bool, int | None]:
    """Whether the log's chain holds, records exactly this certificate (any edited field
    shows as a difference), added the token with its commitment, and (keyed) never
    added the record again after the removal (``rep``: :func:`verify_chain` of the log;
    ``index``: its :func:`index_log`, read once by a caller that checks many). A record
    pruned with its subject (:func:`removal_pruned`) is compared by its place and digest
    only."""
    if not rep.ok:
        reasons.append(f"the audit log does not verify: {rep.error}")
        return False, None
    index = index_log(rep) if index is None else index
    removals = index.removals.get(cert.removed_id, [])
    recorded = [r["certificate"] for r in removals]
    if not recorded:
        reasons.append(f"the audit log records no removal of token {cert.removed_id}")
        return False, None
    mine = asdict(cert)
    pruned = recorded[-1].get("pruned") is True  # its subject forgotten: only its place
    diff = [] if pruned else sorted(k for k in set(mine) | set(recorded[-1])
                                    if mine.get(k) != recorded[-1].get(k))
    if diff:
        reasons.append(f"the audit log recorded this removal with other {', '.join(diff)}")
        return False, None
    ok = True
    at = max(r["seq"] for r in removals)
    later = None
    if present != cert.state_digest:  # the memory moved on: check it is the log's end
        later = at
        if rep.records[at].get("digest") != cert.state_digest:
            reasons.append(f"state_digest: the audit log's record {at} has another digest")
            ok = False
        if rep.final_digest != present:
            reasons.append("state_digest differs from the memory's, and the memory is not "
                           "the audit log's end (its final digest is another)")
            ok = False
    elif rep.final_digest != present:  # the removal's own state, but the log went on
        reasons.append("state_digest: the memory is the one this removal left, but not the "
                       "audit log's end: the log records operations after it (a stale state; "
                       "check the memory's present state)")
        ok = False
    added = index.adds.get(cert.removed_id, [])
    # (an add record of a version-1 log carries its own salted commitment: not comparable)
    if (added and "salt" not in added[-1][1] and added[-1][1].get("pruned") is not True
            and added[-1][1].get("commitment") != cert.commitment):
        reasons.append(f"commitment: the audit log added token {cert.removed_id} (record "
                       f"{added[-1][0]}) with another commitment")
        ok = False
    if cert.commitment_scheme == KEYED:  # equal data, equal commitment: re-entry shows
        back = [(q, t) for q, t in index.by_commitment.get(cert.commitment, []) if q > at]
        if back:
            reasons.append(f"the erased record re-entered after its removal: record "
                           f"{back[0][0]} adds it again as token {back[0][1]}")
            ok = False
    return ok, later


def removal_pruned(cert: DeletionCertificate, index: LogIndex) -> bool:
    """Whether the log's record of this removal was pruned (its subject forgotten): the
    log then proves where the removal stands and the digest it left, not its fields
    (an erasure receipt binds them through its SHA-256, which the erase record keeps)."""
    removals = index.removals.get(cert.removed_id, [])
    return bool(removals) and removals[-1]["certificate"].get("pruned") is True


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
    unbound = unbound_tokens(rep, mem)
    if unbound:
        rep.ok = False
        rep.broken_record = last
        rep.error = (f"state {state}: live tokens {unbound[:5]} carry another commitment or "
                     "data-subject tag than the log's add records gave them (the digest does "
                     "not cover them: an edited state)")


def added_tokens(records: list[dict]) -> list[tuple[int, dict]]:
    """``(seq, token entry)`` of every token the add / extend records among ``records``
    added (a verified chain's records: the entries are objects with an id)."""
    return [(r["seq"], tok) for r in records if r["op"] in ("add", "extend")
            for tok in r.get("tokens", []) if isinstance(tok, dict)]


def unbound_tokens(rep: AuditReport, mem: SVDDMemory) -> list[int]:
    """Live ids whose stored commitment or tag hash differs from their add record (ids
    the chain started from, and tokens of older formats, have none to compare)."""
    added = {tok["id"]: tok for _, tok in added_tokens(rep.records)}
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


@dataclass
class Authenticity:
    """What :func:`check_authenticity` found: each item one line for people.

    Attributes
    ----------
    checked : list of str
        What was checked and held.
    failed : list of str
        What was checked and failed.
    unchecked : list of str
        What could not be checked, each with what would check it.
    covered : int
        Entries of the log under a checkpoint that matched it (0: none).
    """

    checked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    covered: int = 0

    @property
    def exit_status(self) -> int:
        """1 something failed, 3 nothing failed but something was not checked, 0 all held."""
        return 1 if self.failed else 3 if self.unchecked else 0

    def lines(self) -> list[str]:
        """``checked: ...``, ``FAILED: ...``, ``UNCHECKED: ...`` lines."""
        return ([f"checked: {c}" for c in self.checked] + [f"FAILED: {c}" for c in self.failed]
                + [f"UNCHECKED: {c}" for c in self.unchecked])


def _check_one(auth: Authenticity, what: str, text: str, rep: AuditReport,
               verifiers: Sequence[NoteVerifier]) -> bool:
    """One checkpoint (the log's, or the one a state records) against the log's tree and
    the verifier keys; False when it failed."""
    problem = checkpoint_mismatch(text, rep)
    if problem is not None:
        auth.failed.append(f"{what} {problem}")
        return False
    cp = read_checkpoint_unverified(text)
    auth.checked.append(f"{what} is the root of the log's first {cp.size} entries")
    if "\n\n" not in text:
        if verifiers:  # the auditor holds the controller's key: its log is signed
            auth.failed.append(f"{what} is unsigned, and the controller's key was given "
                               "(a signed log's checkpoint was replaced)")
            return False
        auth.unchecked.append(f"{what} is unsigned: the log's authenticity is unchecked "
                              "(anyone can rewrite an unsigned log and its checkpoint; a "
                              "memory given signing_key= signs them)")
        return True
    if not verifiers:
        auth.unchecked.append(f"the signature of {what} (give the controller's public key: "
                              "--public-key or --vkey, public_key=)")
        return True
    origin = log_origin(rep.entries[0])
    # a held key also under the log's origin as key name (how svattn signs a checkpoint
    # too: tlog.log_signers); the key is what the auditor trusts, not the name
    held = list(verifiers) + [NoteVerifier(origin, key_id(origin, v.public_key), v.public_key)
                              for v in verifiers if v.name != origin]
    try:
        _, opened = open_checkpoint(text, held, origin)
    except TlogError as exc:
        auth.failed.append(f"{what}: {exc}")
        return False
    names = [v.name for v in opened.verified if v.name != origin] or [origin]
    auth.checked.append(f"{what} is signed by {names[0]}"
                        + (" (and under the log's origin as key name)"
                           if len(opened.verified) > len(names) else "")
                        + (f" (+{len(opened.unverified)} signatures of keys not held, "
                           "ignored)" if opened.unverified else ""))
    return True


def check_authenticity(path: str | os.PathLike[str], rep: AuditReport,
                       verifiers: Sequence[NoteVerifier] = (),
                       state: str | os.PathLike[str] | None = None) -> Authenticity:
    """Check a log's checkpoint (``LOG.checkpoint``), and the checkpoint a saved state
    records, against the log's Merkle tree and the controller's note verifier keys.

    Parameters
    ----------
    path : path-like
        The log (its checkpoint is read from ``LOG.checkpoint``).
    rep : AuditReport
        :func:`verify_chain` of the log (a verified chain).
    verifiers : sequence of NoteVerifier
        The keys whose signature makes a checkpoint authentic (none: signatures are named
        unchecked).
    state : path-like, optional
        A state saved with this log.

    Returns
    -------
    Authenticity
        Its ``exit_status`` is 0 only when every checkpoint matched the log, was signed
        by a held key, and covers every entry.
    """
    auth = Authenticity()
    if not rep.ok or not rep.entries:
        auth.failed.append("the log's chain does not verify")
        return auth
    n = len(rep.entries)
    file = checkpoint_path(path)
    if not file.is_file():
        missing = (f"the log has no checkpoint ({file.name} is missing"
                   + (", as in every version-1 log" if rep.version < 2 else "")
                   + "): nothing binds its entries to the controller's key")
        # a version-2 log always has one; with the controller's key given, it was removed
        (auth.failed if verifiers and rep.version >= 2 else auth.unchecked).append(missing)
    else:
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            auth.failed.append(f"{file.name} cannot be read as text ({exc})")
            text = None
        if text is not None and _check_one(auth, file.name, text, rep, verifiers):
            size = read_checkpoint_unverified(text).size
            auth.covered = size
            if size < n:
                auth.unchecked.append(f"entries {size}..{n - 1} are after the checkpoint "
                                      "(appended later, or a crash before the checkpoint "
                                      "was rewritten): no signature covers them")
    if state is not None:
        header = parse_header(Path(state).read_bytes(), str(state))[0]
        head = read_metadata(header, str(state)).get("audit_head") or {}
        if head.get("checkpoint") is None:
            auth.unchecked.append(f"state {Path(state).name} records no checkpoint (saved "
                                  "by an older svattn, or without a log)")
        else:
            _check_one(auth, f"the checkpoint of state {Path(state).name}",
                       head["checkpoint"], rep, verifiers)
    return auth


def with_log_authenticity(v, log: str | os.PathLike[str] | None, report: AuditReport | None,
                          public_key=None):
    """A verification result ``v`` (with ``ok``, ``reasons`` and ``verdict``) with the log's
    checkpoint checked against its Merkle tree and, with ``public_key``, its signature
    (:func:`~svattn.exact.auditor.logcheck.check_authenticity`): a failure fails ``v``,
    what could not be checked goes to ``verdict.authenticity_unchecked``. Unchanged
    without a log, or with one whose chain does not verify (``v`` failed on it)."""
    if log is None or report is None or not report.ok or v.verdict is None:
        return v
    if public_key is not None and not isinstance(public_key, Ed25519PublicKey):
        public_key = load_public_key(public_key)
    keys = [] if public_key is None else [controller_verifier(public_key)]
    auth = check_authenticity(log, report, keys)
    if not auth.failed and not auth.unchecked:
        return v
    verdict = with_authenticity(v.verdict, auth.failed, auth.unchecked)
    return dataclasses.replace(v, ok=v.ok and not auth.failed, reasons=verdict.reasons,
                               verdict=verdict)


__all__ = ["Authenticity", "LogIndex", "added_tokens", "check_authenticity", "index_log",
           "matches_the_log", "unbound_tokens", "verify_log", "with_log_authenticity"]
