"""A tamper-evident, append-only audit log of an :class:`SVDDMemory` (JSONL).

Enable it with ``SVDDMemory(C, ..., audit_log=path)``. Every operation appends
one line, a record in canonical JSON (sorted keys, no spaces)::

    {"digest": ..., "n": 41, "op": "remove", "prev": ..., "seq": 7,
     "sha256": ..., "time": "...", "certificate": {...}, ...}

* ``seq`` counts records from 0 (the ``open`` record with the parameters).
* ``prev`` is the SHA-256 of the previous record's line (64 zeros for record 0),
  ``sha256`` the SHA-256 of this record without its ``sha256`` field: editing a
  record breaks its own hash, and re-hashing an edited record breaks the next
  record's ``prev``; deleting or reordering records breaks ``seq``.
* ``digest`` is :meth:`SVDDMemory.state_digest` after the operation, ``n`` the
  number of tokens.

Operations: ``open``; ``add`` / ``extend`` (ids with a commitment per token,
:func:`~svattn.exact.records.certificate.commit_token`, keyed or opaque — never the data, nor
a salt that would let a low-entropy record be guessed);
``remove`` (the full :class:`~svattn.exact.records.certificate.DeletionCertificate`);
``compact`` (dropped ids); ``refactorize`` / ``resolve`` (numerical-health
events, written just before the record of the operation during which they
happened, with the count, the reason and, for drift, the condition estimate
and inverse residual); ``ill_conditioned`` (the condition estimate crossed
1e12);
``save`` (the state file's SHA-256) and ``load``.

Durability: each record is written with one ``write`` on an ``O_APPEND``
descriptor and fsynced before the operation returns; ``extend`` writes one
record (one fsync) for the whole batch. If a write fails the log refuses all
further mutating operations (:class:`AuditLogError`) so the memory and its log
cannot silently diverge.

:func:`verify_chain` re-checks the chain,
the bookkeeping (ids added / removed, counts), every certificate's
``consistency_errors()`` and, with a saved state, that the log ends at that
state; it reports the first broken record. Deleting the *last* records of a
log is only detectable against a state saved after them (a state file stores
the log head it was saved at).

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> log = os.path.join(tempfile.mkdtemp(), "audit.jsonl")
>>> mem = SVDDMemory(C=0.2, audit_log=log)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(30, 3)))
>>> cert = mem.remove(ids[4])
>>> report = verify_chain(log)
>>> report.ok, report.n_records, [r["op"] for r in report.records]
(True, 3, ['open', 'extend', 'remove'])
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from svattn.exact.records.certificate import DeletionCertificate
from svattn.exact.records.merkle import MerkleTree, leaf_hash
from svattn.exact.records.note import NoteSigner, TlogError
from svattn.exact.records.tlog import CheckpointWriter, log_origin, read_checkpoint_unverified

LOG_FORMAT = "svattn.audit"
LOG_VERSION = 2  # 2: a checkpoint beside the log; an erase names its ingest records
LOG_VERSIONS = (1, 2)  # what the verifier reads
GENESIS = "0" * 64
STATE_OPS = {"add", "extend", "remove", "compact"}
_EVENT_OPS = {"refactorize", "resolve", "ill_conditioned"}
_OPS = {"open", "save", "load", "erase"} | STATE_OPS | _EVENT_OPS


class AuditLogError(RuntimeError):
    """The audit log cannot be written or continued (the memory refuses to go on)."""


def canonical(record: dict[str, Any]) -> str:
    """The canonical JSON text of a record (what is written and hashed)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON without its own ``sha256`` field."""
    return _sha(canonical({k: v for k, v in record.items() if k != "sha256"}))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")


def _finite(x: float) -> float | str:
    return float(x) if np.isfinite(x) else repr(float(x))


# ---------------------------------------------------------------------- writer
@dataclass(frozen=True)
class AuditFacts:
    """What the memory tells its log after an operation (plain values, no memory).

    Attributes
    ----------
    digest : str
        :meth:`SVDDMemory.state_digest` after the operation.
    n, next_id : int
        Tokens held, and the next id to be issued.
    n_refactorizations, n_resolves, n_drift_refactorizations : int
        The solver's and the health monitor's counters (the log records their increase).
    cond1, inv_residual : float
        The health monitor's latest estimates.
    kkt_residual : float or None
        The KKT residual, where the record carries it (adds).
    """

    digest: str
    n: int
    next_id: int
    n_refactorizations: int
    n_resolves: int
    n_drift_refactorizations: int
    cond1: float = 0.0
    inv_residual: float = 0.0
    kkt_residual: float | None = None

    @property
    def counts(self) -> tuple[int, int, int]:
        return self.n_refactorizations, self.n_resolves, self.n_drift_refactorizations


class AuditLog:
    """Appends hash-chained records for one memory (create with :meth:`create`), and
    after each append rewrites the log's checkpoint (``LOG.checkpoint``: the RFC 6962
    tree of its lines, signed with the controller's key when there is one)."""

    def __init__(self, path: Path, fd: int, seq: int, prev: str,
                 signer: NoteSigner | None = None) -> None:
        self.path = path
        self._fd = fd
        self._seq = seq  # seq of the next record
        self._prev = prev  # sha256 of the last line
        self._pending: list[dict[str, Any]] = []
        self._failed: BaseException | None = None
        self._last_counts = (0, 0, 0)
        self._checkpoint = CheckpointWriter(path, signer)
        self._ingest: dict[int, tuple[int, str | None]] = {}  # id -> (its add record, tag)

    # -------------------------------------------------------------- opening
    @classmethod
    def create(cls, path: str | os.PathLike[str], params: dict[str, Any], facts: AuditFacts,
               signer: NoteSigner | None = None) -> AuditLog:
        """Start a new log for a new memory (the file must not exist or be empty).

        ``params`` (C, kernel, gamma, tol) go into the ``open`` record; ``signer`` signs
        the checkpoints (none: they are written unsigned)."""
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"audit_log {path} is a directory; give a file path")
        if path.exists() and path.stat().st_size > 0:
            raise ValueError(
                f"audit log {path} already has records; continue it with "
                "SVDDMemory.load(state, audit_log=...) or choose a new file"
            )
        fd = _open_locked(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        if os.fstat(fd).st_size > 0:  # another writer got there between the check and the lock
            os.close(fd)
            raise ValueError(f"audit log {path} already has records (written just now)")
        log = cls(path, fd, 0, GENESIS, signer)
        log._last_counts = facts.counts
        cont = params.get("continues")
        for tid in cont["live_ids"] if isinstance(cont, dict) else ():
            log._ingest[int(tid)] = (0, cont.get("tags", {}).get(str(tid)))
        _fsync_dir(path)
        log._append(facts, "open", {"format": LOG_FORMAT, "version": LOG_VERSION, **params})
        return log

    @classmethod
    def resume(cls, path: str | os.PathLike[str], facts: AuditFacts, *,
               state_path: Path, state_sha256: str, head: dict[str, Any] | None,
               signer: NoteSigner | None = None) -> AuditLog:
        """Continue the log of a memory just loaded from ``state_path``.

        The log must verify, and it must end at the loaded state: if it records
        state-changing operations after the state was saved, loading that state
        would undo them (resurrect removed tokens), so this refuses.
        """
        path = Path(path)
        fd = _open_locked(path, os.O_WRONLY | os.O_APPEND)  # before reading: no writer between
        try:
            return cls._resume_locked(path, fd, facts, state_path, state_sha256, head, signer)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _resume_locked(cls, path: Path, fd: int, facts: AuditFacts, state_path: Path,
                       state_sha256: str, head: dict[str, Any] | None,
                       signer: NoteSigner | None) -> AuditLog:
        report = verify_chain(path)
        if not report.ok:
            raise AuditLogError(f"audit log {path} does not verify: {report.error}")
        recs = report.records
        if head is None:
            raise AuditLogError(f"state {state_path} was saved without an audit log; "
                                f"it cannot continue {path}")
        seq = int(head["seq"])
        if seq >= len(recs) or report.hashes[seq] != head["sha256"]:
            raise AuditLogError(
                f"state {state_path} was saved at record {seq} of an audit log that {path} "
                "does not contain (another log, or records were removed)"
            )
        later = [r for r in recs[seq + 1:] if r["op"] in STATE_OPS]
        if later:
            r = later[0]
            raise AuditLogError(
                f"audit log {path} records {len(later)} operation(s) after state {state_path} "
                f"was saved (first: record {r['seq']}, {r['op']}); loading that state would "
                "undo them (and could resurrect removed tokens)"
            )
        if recs[-1]["digest"] != facts.digest:
            raise AuditLogError(f"the last record of {path} does not carry the digest of "
                                f"state {state_path}")
        problem = checkpoint_mismatch(head.get("checkpoint"), report)
        if problem is not None:
            raise AuditLogError(f"state {state_path}: the checkpoint it records {problem}")
        log = cls(path, fd, len(recs), report.hashes[-1], signer)
        log._last_counts = facts.counts
        for entry in report.entries:
            log._checkpoint.add(entry)
        log._ingest = dict(report.ingested)
        log._append(facts, "load", {"file_sha256": state_sha256, "path": state_path.name})
        return log

    def head(self) -> dict[str, Any]:
        """``{"seq", "sha256", "checkpoint"}`` of the last record written (the checkpoint:
        the signed note, or the bare body when unsigned, of the log up to it)."""
        return {"seq": self._seq - 1, "sha256": self._prev, "checkpoint": self._checkpoint.text()}

    @property
    def checkpoint_file(self) -> Path:
        """``LOG.checkpoint``: the log's latest checkpoint."""
        return self._checkpoint.file

    def close(self) -> None:
        """Close the descriptor (the memory can no longer log)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order
        try:
            self.close()
        except Exception:
            pass

    # -------------------------------------------------------------- writing
    def mark(self) -> tuple:
        """Where the log stands (for :meth:`rollback`): the file size and the chain's head."""
        size = os.fstat(self._fd).st_size if self._fd >= 0 else -1
        return (size, self._seq, self._prev, self._last_counts, list(self._pending),
                self._failed, self._checkpoint.mark())

    def rollback(self, mark: tuple) -> None:
        """Undo every record written since ``mark`` (an operation that failed is not in
        the log): truncate the file back, restore the chain's head. If the truncation
        itself fails the log stays failed (the memory then refuses further operations)."""
        size, seq, prev, counts, pending, failed, tree = mark
        if size < 0 or self._fd < 0:
            return
        try:
            if os.fstat(self._fd).st_size != size:
                os.ftruncate(self._fd, size)
                os.fsync(self._fd)
            if self._checkpoint.tree.size != tree[0].size:
                self._checkpoint.restore(tree)
                self._checkpoint.write()
        except OSError as exc:
            self._failed = exc
            return
        self._seq, self._prev, self._last_counts = seq, prev, counts
        self._pending, self._failed = pending, failed
        if any(at >= seq for at, _ in self._ingest.values()):
            self._ingest = {t: v for t, v in self._ingest.items() if v[0] < seq}

    def ready(self) -> None:
        """Raise :class:`AuditLogError` if a previous write failed (called before ops)."""
        if self._failed is not None:
            raise AuditLogError(
                f"audit log {self.path} failed earlier ({self._failed}); the memory refuses "
                "further operations (save it and resume the log after fixing the cause)"
            )
        if self._fd < 0:
            raise AuditLogError(f"audit log {self.path} is closed")

    def record(self, facts: AuditFacts, op: str, *, events: list[dict[str, Any]] = (),
               **info: Any) -> None:
        """Write the numerical-health events of operation ``op``, then its record.

        Refactorizations and re-solves are read off the memory's counters (so
        the solver needs no hooks); ``events`` come from the health monitor.
        """
        refac, res, drift = facts.counts
        refac0, res0, drift0 = self._last_counts
        self._last_counts = (refac, res, drift)
        if drift > drift0:
            self._pending.append({
                "op": "refactorize", "count": drift - drift0,
                "reason": "inverse drift beyond the conditioning bound",
                "cond1": _finite(facts.cond1), "inv_residual": _finite(facts.inv_residual)})
        if refac - refac0 > drift - drift0:
            self._pending.append({"op": "refactorize", "count": refac - refac0 - (drift - drift0),
                                  "reason": "KKT residual above tol after an operation"})
        if res > res0:
            self._pending.append({"op": "resolve", "count": res - res0,
                                  "reason": "degenerate incremental step or residual above tol"})
        for ev in events:  # drift refactorizations are counted above
            if ev["event"] == "ill_conditioned":
                self._pending.append({"op": "ill_conditioned", "cond1": _finite(ev["cond1"]),
                                      "inv_residual": _finite(ev["inv_residual"])})
        lines = []
        for ev in self._pending:
            fields = {k: v for k, v in ev.items() if k != "op"}
            fields["within"] = op
            lines.append(self._line(facts, ev["op"], fields))
        self._pending = []
        lines.append(self._line(facts, op, self._fields(facts, op, info)))
        self._write(lines)

    def record_save(self, facts: AuditFacts, path: Path, sha256: str) -> None:
        """Record a save whose bytes are durable, just before they replace the file (if
        the record fails, the save does not happen)."""
        self.ready()
        self._write([self._line(facts, "save", {"file_sha256": sha256, "path": path.name})])

    def _fields(self, facts: AuditFacts, op: str, info: dict[str, Any]) -> dict[str, Any]:
        if op in ("add", "extend"):
            ids, commits = info["ids"], info["commitments"]
            tags = info.get("tags") or [None] * len(ids)
            toks = []
            for r, tid in enumerate(ids):
                self._ingest[int(tid)] = (self._seq, None if tags[r] is None else tags[r].hex())
                # the commitment the memory keeps (and a removal's certificate repeats):
                # keyed or opaque, never with a salt that would let it be opened
                tok = {"id": int(tid), "commitment": commits[r]}
                if tags[r] is not None:  # the subject's keyed hash, never the tag
                    tok["tag"] = tags[r].hex()
                toks.append(tok)
            return {"tokens": toks, "kkt_residual": _finite(facts.kkt_residual)}
        if op == "remove":
            cert: DeletionCertificate = info["certificate"]
            return {"certificate": asdict(cert)}
        if op == "compact":
            return {"dropped": [int(i) for i in info["dropped"]]}
        if op == "erase":  # the request: its removals are the records before it
            r = info["receipt"]
            foreign = [t for t in r.erased_ids if self._ingest.get(t, (0, None))[1] != r.tag_hash]
            if foreign:
                raise AuditLogError(f"erase of ids {foreign[:5]} that this log never ingested "
                                    f"under subject {r.tag_hash[:12]}…: refused")
            return {"erasure": {"tag_hash": r.tag_hash, "erased_ids": list(r.erased_ids),
                                "ingested_at": [self._ingest[t][0] for t in r.erased_ids],
                                "signer": r.signer, "signature": r.signature,
                                "receipt_sha256": r.sha256()}}
        raise ValueError(f"unknown audit operation {op!r}")

    def _line(self, facts: AuditFacts, op: str, fields: dict[str, Any]) -> bytes:
        rec = dict(fields)
        rec.update(seq=self._seq, op=op, prev=self._prev, time=_now(),
                   digest=facts.digest, n=facts.n, next_id=facts.next_id)
        rec["sha256"] = record_hash(rec)
        text = canonical(rec)
        self._seq += 1
        self._prev = _sha(text)
        return text.encode() + b"\n"

    def _write(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        try:
            view = memoryview(data)
            while view:
                k = os.write(self._fd, view)
                if k <= 0:
                    raise OSError("short write")
                view = view[k:]
            os.fsync(self._fd)
            for line in lines:
                self._checkpoint.add(line[:-1])
            self._checkpoint.write()
        except BaseException as exc:
            self._failed = exc
            raise AuditLogError(f"writing audit log {self.path} failed: {exc}") from exc

    def _append(self, facts: AuditFacts, op: str, fields: dict[str, Any]) -> None:
        self._write([self._line(facts, op, fields)])


def lock_log(path: str | os.PathLike[str]) -> int:
    """Hold the log's writer lock (``os.close`` the returned descriptor to release it):
    a reader that must see the log stand still, such as recovery, takes it too."""
    return _open_locked(Path(path), os.O_RDONLY)


def _open_locked(path: Path, flags: int) -> int:
    """Open the log for appending with an exclusive lock: one writer per log, or two
    memories would interleave their chains and corrupt it for good."""
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AuditLogError(
            f"audit log {path} is being written by another memory (it holds the log's lock); "
            "close that one first (SVDDMemory.close_audit_log()) or use another file"
        ) from None
    return fd


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------------- verifier
@dataclass
class AuditReport:
    """Result of :func:`verify_log`.

    Attributes
    ----------
    ok : bool
    n_records : int
        Records read (up to and including the broken one).
    broken_record : int or None
        Number (= expected ``seq``, 0-based; line ``broken_record + 1``) of the
        first broken record.
    error : str or None
        What broke, naming the record.
    final_digest : str or None
        Digest carried by the last record.
    state_checked : bool
        Whether a state file was compared.
    records, hashes : list
        The parsed records and the SHA-256 of each line.
    entries, leaves : list of bytes
        Each record's exact bytes (its line without the newline: what the log's Merkle
        tree hashes) and its RFC 6962 leaf hash.
    ingested : dict
        Each id the log ingested: ``(index of the record that added it, its subject's
        tag hash or None)`` (the ``open`` record, index 0, for a chain that continues a
        state).
    version : int
        The log's format version (its ``open`` record's).
    """

    ok: bool = True
    n_records: int = 0
    broken_record: int | None = None
    error: str | None = None
    final_digest: str | None = None
    state_checked: bool = False
    n_certificates: int = 0
    torn_tail: bool = False
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    hashes: list[str] = field(default_factory=list, repr=False)
    entries: list[bytes] = field(default_factory=list, repr=False)
    leaves: list[bytes] = field(default_factory=list, repr=False)
    ingested: dict[int, tuple[int, str | None]] = field(default_factory=dict, repr=False)
    version: int = LOG_VERSION

    def summary(self) -> str:
        """One line for people."""
        if self.ok:
            n = self.n_certificates
            s = (f"OK: {self.n_records} record{'s' * (self.n_records != 1)}, chain intact, "
                 f"{n} deletion certificate{'s' * (n != 1)} consistent")
            if self.state_checked:
                s += ", final digest matches the state"
            return s
        where = "" if self.broken_record is None else f" at record {self.broken_record}"
        return f"BROKEN{where}: {self.error}"


def _fail(rep: AuditReport, i: int, msg: str) -> AuditReport:
    rep.ok = False
    rep.broken_record = i
    rep.error = f"record {i} (line {i + 1}): {msg}"
    return rep


def verify_chain(path: str | os.PathLike[str], *, allow_torn_tail: bool = False) -> AuditReport:
    """Verify an audit log's chain and bookkeeping (the state side is
    :func:`svattn.exact.auditor.verify.verify_log`).

    Parameters
    ----------
    path : path-like
        The JSONL log.
    allow_torn_tail : bool
        Read past a last line cut by a crash (no trailing newline) instead of
        failing on it (``torn_tail`` says so): what recovery needs.

    Returns
    -------
    AuditReport
        ``ok`` False names the first broken record and what broke.

    Examples
    --------
    >>> import os, tempfile
    >>> from svattn.exact import SVDDMemory
    >>> log = os.path.join(tempfile.mkdtemp(), "a.jsonl")
    >>> mem = SVDDMemory(C=0.5, audit_log=log)
    >>> _ = mem.extend([[0.0], [1.0], [2.0]])
    >>> lines = open(log).read().splitlines()
    >>> _ = open(log, "w").write(lines[1] + "\\n")  # drop the first record
    >>> verify_chain(log).error
    'record 0 (line 1): seq is 1, expected 0 (records were deleted, inserted or reordered)'
    """
    rep = AuditReport()
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        last = len(lines) - 1
        if len(lines) == 1 and lines[0] == b"":
            lines = []
        elif allow_torn_tail:
            lines.pop()
            rep.torn_tail = True
        else:
            rep.n_records = last + 1
            return _fail(rep, last, "incomplete record (no trailing newline: a write was cut)")
    prev = GENESIS
    live: set[int] = set()
    next_id = 0
    for i, raw in enumerate(lines):
        rep.n_records = i + 1
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            return _fail(rep, i, f"not valid JSON ({exc})")
        if not isinstance(rec, dict):
            return _fail(rep, i, "not a JSON object")
        if rec.get("seq") != i:
            return _fail(rep, i, f"seq is {rec.get('seq')!r}, expected {i} (records were "
                                 "deleted, inserted or reordered)")
        if rec.get("sha256") != record_hash(rec):
            return _fail(rep, i, "content does not match its sha256 (the record was edited)")
        if raw.decode("utf-8") != canonical(rec):
            return _fail(rep, i, "not in canonical form (the line was edited)")
        if rec.get("prev") != prev:
            if i > 0:
                rep.n_records = i
                return _fail(rep, i - 1, f"its hash does not match record {i}'s prev (record "
                                         f"{i - 1} was edited and re-hashed, or replaced)")
            return _fail(rep, i, "prev is not the genesis value (records before it are missing)")
        op = rec.get("op")
        if op not in _OPS:
            return _fail(rep, i, f"unknown operation {op!r}")
        if (i == 0) != (op == "open"):
            return _fail(rep, i, "a log starts with exactly one 'open' record")
        if op == "open":
            if rec.get("format") != LOG_FORMAT or rec.get("version") not in LOG_VERSIONS:
                return _fail(rep, i, f"unsupported log format {rec.get('format')!r} version "
                                     f"{rec.get('version')!r} (expected {LOG_FORMAT} "
                                     f"{' or '.join(map(str, LOG_VERSIONS))})")
            rep.version = rec["version"]
        # bookkeeping: which ids are live (a record of the wrong shape, re-hashed so
        # that the chain holds, is reported by its index, never raised)
        try:
            error, next_id, certified = _bookkeep(rec, op, live, next_id, rep.records,
                                                  rep.ingested, rep.version)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            error = f"malformed record ({type(exc).__name__}: {exc})"
        if error is not None:
            return _fail(rep, i, error)
        rep.n_certificates += certified
        rep.records.append(rec)
        rep.hashes.append(_sha(raw))
        rep.entries.append(raw)
        rep.leaves.append(leaf_hash(raw))
        prev = rep.hashes[-1]
    if not lines:
        return _fail(rep, 0, "the log is empty (no 'open' record)")
    rep.final_digest = rep.records[-1].get("digest")
    return rep


def _bookkeep(rec: dict[str, Any], op: str, live: set[int], next_id: int,
              earlier: list[dict[str, Any]], ingested: dict[int, tuple[int, str | None]],
              version: int) -> tuple[str | None, int, int]:
    """Apply one record to the live ids (and ``ingested``, each id's add record and
    subject): ``(error or None, next id, certificates)``."""
    certified = 0
    if op == "open" and "continues" in rec:  # a chain that starts from a saved state
        cont = rec["continues"] if isinstance(rec["continues"], dict) else {}
        ids, nid = cont.get("live_ids"), cont.get("next_id")
        if not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in ids)
                and isinstance(nid, int) and all(0 <= t < nid for t in ids)
                and len(set(ids)) == len(ids)):
            return "continues must list the live ids and the next id of its state", next_id, 0
        tags = cont.get("tags", {})
        if not isinstance(tags, dict):
            return "continues' tags must map ids to subjects' tag hashes", next_id, 0
        live.update(ids)
        ingested.update({t: (0, tags.get(str(t))) for t in ids})
        next_id = nid
    elif op in ("add", "extend"):
        tokens = rec.get("tokens", [])
        if not isinstance(tokens, list):
            return f"tokens is {type(tokens).__name__}, not a list", next_id, 0
        for tok in tokens:
            if not isinstance(tok, dict):
                return f"a token entry is {type(tok).__name__}, not an object", next_id, 0
            tid = tok.get("id")
            if not isinstance(tid, int) or isinstance(tid, bool) or tid < next_id:
                return f"adds id {tid!r}, but ids below {next_id} were already issued", \
                    next_id, 0
            if not (isinstance(tok.get("commitment"), str) and len(tok["commitment"]) == 64):
                return f"token {tid} lacks a SHA-256 commitment", next_id, 0
            live.add(tid)
            ingested[tid] = (rec["seq"], tok.get("tag"))
            next_id = tid + 1
    elif op == "remove":
        fields = rec.get("certificate")
        if not isinstance(fields, dict):
            return "malformed deletion certificate (not an object)", next_id, 0
        try:
            cert = DeletionCertificate(**fields)
        except (KeyError, TypeError) as exc:
            return f"malformed deletion certificate ({exc})", next_id, 0
        errs = cert.consistency_errors()
        if errs:
            return "certificate inconsistent: " + "; ".join(errs), next_id, 0
        if cert.state_digest != rec.get("digest"):
            return "the certificate's state digest differs from the record's", next_id, 0
        if not isinstance(cert.removed_id, int) or cert.removed_id not in live:
            return f"removes id {cert.removed_id!r}, which is not live", next_id, 0
        live.discard(cert.removed_id)
        certified = 1
    elif op == "erase":
        er = rec.get("erasure")
        ids = er.get("erased_ids") if isinstance(er, dict) else None
        if not (isinstance(ids, list) and ids and all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            return "erasure must list the erased ids", next_id, 0
        back = [t for t in ids if t in live or t >= next_id]
        if back:
            return f"erases ids {back[:5]} that are live or were never issued", next_id, 0
        error = _erase_bound_to_ingest(er, ids, ingested, version)
        if error is not None:
            return error, next_id, 0
    elif op == "compact":
        dropped = rec.get("dropped", [])
        if not isinstance(dropped, list) or not all(isinstance(t, int) for t in dropped):
            return "dropped is not a list of ids", next_id, 0
        missing = [t for t in dropped if t not in live]
        if missing:
            return f"compacts ids {missing[:5]} that are not live", next_id, 0
        live.difference_update(dropped)
    elif op == "load" and earlier and rec.get("digest") != earlier[-1].get("digest"):
        return "the loaded state's digest differs from the log's state", next_id, 0
    # every record but a health event (written before its operation's record, with the
    # counts after it) states the tokens and the next id the operations leave
    if op not in _EVENT_OPS:
        if rec.get("n") != len(live):
            return (f"says n = {rec.get('n')!r}, but the log's operations leave {len(live)} "
                    "tokens", next_id, 0)
        if op != "open" and rec.get("next_id") != next_id and not (
                op == "load" and isinstance(rec.get("next_id"), int)
                and rec["next_id"] >= next_id):
            return (f"says next_id = {rec.get('next_id')!r}, but the log's operations have "
                    f"issued ids below {next_id}", next_id, 0)
    return None, next_id, certified


def _erase_bound_to_ingest(er: dict[str, Any], ids: list[int],
                           ingested: dict[int, tuple[int, str | None]], version: int
                           ) -> str | None:
    """Why an erase record is not bound to what the log ingested (None: it is): every
    erased id was added under the erasure's subject, at the record the erase names
    (version 2; a version-1 erase names none, and an add without a tag is not compared)."""
    tag = er.get("tag_hash")
    if version >= 2:
        at = er.get("ingested_at")
        if not (isinstance(at, list) and len(at) == len(ids)):
            return "erasure must name, per erased id, the record that ingested it"
        wrong = [t for t, a in zip(ids, at, strict=True) if ingested.get(t, (None,))[0] != a]
        if wrong:
            return (f"erasure names ingest records that did not add ids {wrong[:5]} (a "
                    "fabricated erase)")
        foreign = [t for t in ids if ingested[t][1] != tag]
    else:
        foreign = [t for t in ids if t not in ingested
                   or ingested[t][1] is not None and ingested[t][1] != tag]
    if foreign:
        return (f"erases ids {foreign[:5]} that were never ingested under subject "
                f"{str(tag)[:12]}… (a fabricated erase)")
    return None


def checkpoint_mismatch(text: str | None, rep: AuditReport) -> str | None:
    """Why a checkpoint (a signed note or a bare body; its signature NOT checked here) is
    not a checkpoint of the log ``rep`` read (None: it is, or ``text`` is None)."""
    if text is None:
        return None
    try:
        cp = read_checkpoint_unverified(text)
    except TlogError as exc:
        return f"does not parse ({exc})"
    if cp.size > len(rep.leaves):
        return (f"covers {cp.size} entries, and the log holds {len(rep.leaves)} (entries "
                "were removed from its end)")
    if rep.entries and cp.origin != log_origin(rep.entries[0]):
        return f"is of another log ({cp.origin}, and this log is {log_origin(rep.entries[0])})"
    if MerkleTree(rep.leaves[:cp.size]).root() != cp.root:
        return (f"has another root than the log's first {cp.size} entries (the log was "
                "edited or rewritten)")
    return None


__all__ = ["LOG_VERSION", "LOG_VERSIONS", "STATE_OPS", "AuditFacts", "AuditLog", "AuditLogError",
           "AuditReport", "canonical", "checkpoint_mismatch",
           "lock_log",
           "record_hash", "verify_chain"]
