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

``erase`` (the request: its receipt's fields, and ``ingested_at``, per erased id the
record that added it; the writer refuses ids never ingested under the subject).

Format version 3 keeps a subject's data out of the entries: a token's id, commitment and
tag, a removal's certificate and an erasure's subject, ids and signature are each a
salted commitment in the entry, opened by ``LOG.openings``
(:mod:`svattn.exact.records.openings`); the erase entry names, in clear, the ingest
slots (``ingested_at``: record and slot) and the remove records (``removed_at``) it
covers, and the receipt's SHA-256. An erase **prunes** its subject at once: right after
its entry is durable the openings it names (its own too) are deleted from
``LOG.openings`` (:meth:`AuditLog.prune_pending`), and a log a crash left between the
two is pruned when it is resumed or by ``svattn audit prune``. The entries, and so every
leaf, checkpoint and proof, stay as they were.

The log is also a transparency log (``docs/design.md`` §4.0): its lines are the leaves
of an RFC 6962 Merkle tree, and after each append ``LOG.checkpoint`` is rewritten
atomically (:class:`~svattn.exact.records.tlog.CheckpointWriter`), signed with the
controller's key when the memory has one; a state file records the checkpoint it was
saved at, and :meth:`AuditLog.resume` checks it against the log.

:func:`~svattn.exact.records.logverify.verify_chain` (re-exported here) re-checks the
chain, the bookkeeping (ids added / removed, counts, each erase bound to its ingest
records), every certificate's ``consistency_errors()``; it reports the first broken
record. Deleting the *last* records of a log is detectable against a state saved after
them or a signed checkpoint that covers them.

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
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from svattn.exact.records.certificate import DeletionCertificate
from svattn.exact.records.logverify import (
    GENESIS,
    LOG_FORMAT,
    LOG_VERSION,
    LOG_VERSIONS,
    STATE_OPS,
    AuditReport,
    canonical,
    checkpoint_mismatch,
    erase_unbound,
    record_hash,
    sha256_hex,
    verify_chain,
)
from svattn.exact.records.openings import (
    append_openings,
    fsync_dir,
    opening_line,
    openings_size,
    prune_openings,
    seal,
    truncate_openings,
)
from svattn.exact.records.tlog import CheckpointWriter, controller_signer


class AuditLogError(RuntimeError):
    """The audit log cannot be written or continued (the memory refuses to go on)."""


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

    def __init__(self, path: Path, fd: int, seq: int, prev: str, signing_key=None) -> None:
        self.path = path
        self._fd = fd
        self._seq = seq  # seq of the next record
        self._prev = prev  # sha256 of the last line
        self._pending: list[dict[str, Any]] = []
        self._failed: BaseException | None = None
        self._last_counts = (0, 0, 0)
        self._checkpoint = CheckpointWriter(
            path, None if signing_key is None else controller_signer(signing_key))
        # id -> (its add record, tag, its slot there)
        self._ingest: dict[int, tuple[int, str | None, int]] = {}
        self._removed: dict[int, int] = {}  # id -> the record that removed it
        self._compacted: dict[int, int] = {}  # id -> the compact record that dropped it
        self._prune: list[tuple[int, int]] = []  # (record, slot) openings an erase named
        self._version = LOG_VERSION  # (a resumed log keeps its own)

    # -------------------------------------------------------------- opening
    @classmethod
    def create(cls, path: str | os.PathLike[str], params: dict[str, Any], facts: AuditFacts,
               signing_key=None) -> AuditLog:
        """Start a new log for a new memory (the file must not exist or be empty).

        ``params`` (C, kernel, gamma, tol) go into the ``open`` record; ``signing_key``
        (the controller's Ed25519 key) signs the checkpoints (none: written unsigned)."""
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
        log = cls(path, fd, 0, GENESIS, signing_key)
        log._last_counts = facts.counts
        cont = params.get("continues")
        opens: list[tuple[int, str, dict]] = []
        if isinstance(cont, dict):
            tags = cont.get("tags", {})
            for r, tid in enumerate(cont["live_ids"]):
                log._ingest[int(tid)] = (0, tags.get(str(tid)), r)
            sealed = []  # each subject's tag a salted commitment (prunable)
            for r, tid in enumerate(cont["live_ids"]):
                if str(tid) in tags:
                    c, salt = seal({"id": int(tid), "tag": tags[str(tid)]})
                    opens.append((r, salt, {"id": int(tid), "tag": tags[str(tid)]}))
                    sealed.append(c)
                else:
                    sealed.append(None)
            params = {**params, "continues": {**cont, "tags": sealed}}
        fsync_dir(path)
        truncate_openings(path, 0)  # a new log: no openings of another before it
        log._append(facts, "open", ({"format": LOG_FORMAT, "version": LOG_VERSION, **params},
                                    opens))
        return log

    @classmethod
    def resume(cls, path: str | os.PathLike[str], facts: AuditFacts, *,
               state_path: Path, state_sha256: str, head: dict[str, Any] | None,
               signing_key=None) -> AuditLog:
        """Continue the log of a memory just loaded from ``state_path``.

        The log must verify, and it must end at the loaded state: if it records
        state-changing operations after the state was saved, loading that state
        would undo them (resurrect removed tokens), so this refuses.
        """
        path = Path(path)
        fd = _open_locked(path, os.O_WRONLY | os.O_APPEND)  # before reading: no writer between
        try:
            return cls._resume_locked(path, fd, facts, state_path, state_sha256, head,
                                      signing_key)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _resume_locked(cls, path: Path, fd: int, facts: AuditFacts, state_path: Path,
                       state_sha256: str, head: dict[str, Any] | None,
                       signing_key) -> AuditLog:
        report = verify_chain(path, allow_unpruned=True)
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
        log = cls(path, fd, len(recs), report.hashes[-1], signing_key)
        log._last_counts = facts.counts
        for entry in report.entries:
            log._checkpoint.add(entry)
        log._ingest, log._version = dict(report.ingested), report.version
        log._removed = {r["certificate"]["removed_id"]: r["seq"] for r in recs
                        if r["op"] == "remove"}
        log._compacted = {t: r["seq"] for r in recs if r["op"] == "compact"
                          for t in r["dropped"]}
        if log._version >= 3:  # finish a prune a crash cut; drop openings of no entry
            log._prune = list(report.unpruned)
            log.prune_pending(below=len(recs))
        log._append(facts, "load", ({"file_sha256": state_sha256, "path": state_path.name}, []))
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
                self._failed, self._checkpoint.mark(), openings_size(self.path),
                list(self._prune))

    def rollback(self, mark: tuple) -> None:
        """Undo every record written since ``mark`` (an operation that failed is not in
        the log): truncate the file back, restore the chain's head. If the truncation
        itself fails the log stays failed (the memory then refuses further operations)."""
        size, seq, prev, counts, pending, failed, tree, osize, prune = mark
        if size < 0 or self._fd < 0:
            return
        try:
            if os.fstat(self._fd).st_size != size:
                os.ftruncate(self._fd, size)
                os.fsync(self._fd)
            truncate_openings(self.path, osize)
            if self._checkpoint.tree.size != tree[0].size:
                self._checkpoint.restore(tree)
                self._checkpoint.write()
        except OSError as exc:
            self._failed = exc
            return
        self._seq, self._prev, self._last_counts = seq, prev, counts
        self._pending, self._failed, self._prune = pending, failed, prune
        if any(v[0] >= seq for v in self._ingest.values()):
            self._ingest = {t: v for t, v in self._ingest.items() if v[0] < seq}
        self._removed = {t: j for t, j in self._removed.items() if j < seq}
        self._compacted = {t: j for t, j in self._compacted.items() if j < seq}

    def prune_pending(self, below: int | None = None) -> int:
        """Delete from ``LOG.openings`` the openings the log's erases named and that are
        still there (:func:`~svattn.exact.records.openings.prune_openings`; with
        ``below``, also openings of no entry): the erased subjects' data leaves the log.
        Returns the openings deleted. A failure fails the log (the memory refuses to go
        on until the prune is finished: resuming the log, or ``svattn audit prune``)."""
        if not self._prune and below is None:
            return 0
        try:
            n = prune_openings(self.path, self._prune, below)
        except OSError as exc:
            self._failed = exc
            raise AuditLogError(f"pruning the openings of audit log {self.path} failed "
                                f"({exc}); the erase is done and recorded, its subject's "
                                "data is still in the openings: `svattn audit prune LOG` "
                                "finishes it") from exc
        self._prune = []
        return n

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
            lines.append(self._line(facts, ev["op"], (fields, [])))
        self._pending = []
        lines.append(self._line(facts, op, self._fields(facts, op, info)))
        self._write(lines)

    def record_save(self, facts: AuditFacts, path: Path, sha256: str) -> None:
        """Record a save whose bytes are durable, just before they replace the file (if
        the record fails, the save does not happen)."""
        self.ready()
        self._write([self._line(facts, "save", ({"file_sha256": sha256, "path": path.name},
                                                []))])

    def _fields(self, facts: AuditFacts, op: str, info: dict[str, Any]
                ) -> tuple[dict[str, Any], list[tuple[int, str, Any]]]:
        """The entry's fields and its openings ``(slot, salt, value)`` (version 3: the
        subject's data sealed, each slot's commitment in the entry)."""
        v3 = self._version >= 3
        if op in ("add", "extend"):
            ids, commits = info["ids"], info["commitments"]
            tags = info.get("tags") or [None] * len(ids)
            toks, opens = [], []
            for r, tid in enumerate(ids):
                self._ingest[int(tid)] = (self._seq, None if tags[r] is None else tags[r].hex(),
                                          r)
                # the commitment the memory keeps (and a removal's certificate repeats):
                # keyed or opaque, never with a salt that would let it be opened
                tok = {"id": int(tid), "commitment": commits[r]}
                if tags[r] is not None:  # the subject's keyed hash, never the tag
                    tok["tag"] = tags[r].hex()
                toks.append(self._sealed(opens, r, tok) if v3 else tok)
            return {"tokens": toks, "kkt_residual": _finite(facts.kkt_residual)}, opens
        if op == "remove":
            cert: DeletionCertificate = info["certificate"]
            self._removed[int(cert.removed_id)] = self._seq
            if v3:
                opens = []
                return {"certificate": self._sealed(opens, 0, asdict(cert))}, opens
            return {"certificate": asdict(cert)}, []
        if op == "compact":
            self._compacted.update((int(i), self._seq) for i in info["dropped"])
            return {"dropped": [int(i) for i in info["dropped"]]}, []
        if op == "erase":  # the request: its removals are the records before it
            return self._erasure(info["receipt"])
        raise ValueError(f"unknown audit operation {op!r}")

    def _erasure(self, r) -> tuple[dict[str, Any], list[tuple[int, str, Any]]]:
        ids = list(r.erased_ids)
        got = [self._ingest.get(t, (None, None, None)) for t in ids]
        erasure = {"tag_hash": r.tag_hash, "erased_ids": ids,
                   "ingested_at": [g[0] for g in got],
                   "signer": r.signer, "signature": r.signature, "receipt_sha256": r.sha256()}
        opens: list[tuple[int, str, Any]] = []
        if self._version >= 3:  # the subject sealed; in clear what the prune names
            private = {k: erasure[k] for k in ("tag_hash", "erased_ids", "signer", "signature")}
            erasure = {"ingested_at": [[g[0], g[2]] for g in got],
                       "removed_at": [self._removed.get(t) for t in ids],
                       "receipt_sha256": erasure["receipt_sha256"],
                       "prunes": self._gone_of(r.tag_hash, set(ids))}
            unbound = erase_unbound({**private, **erasure}, ids, self._ingest, self._version)
            if None in erasure["removed_at"]:
                unbound = unbound or "the erased ids were not removed in this erase"
            erasure["opening"] = self._sealed(opens, 0, private)
        else:
            unbound = erase_unbound(erasure, ids, self._ingest, self._version)
        if unbound is not None:  # the rule the verifier applies to this log's version
            raise AuditLogError(f"refused: {unbound}")
        if opens:  # what the prune deletes once the erase is durable
            self._prune += [tuple(a) for a in erasure["ingested_at"]]
            self._prune += [(j, 0) for j in erasure["removed_at"]] + [(self._seq, 0)]
            for a in erasure["prunes"]:
                self._prune += [(a[0], a[1]), (a[2], 0)] if len(a) == 3 else [(a[0], a[1])]
        return {"erasure": erasure}, opens

    def _gone_of(self, tag_hash: str, erased: set[int]) -> list[list[int]]:
        """``[record, slot]`` of the subject's tokens that left before this erase (removed
        one by one: ``[record, slot, remove record]``; compacted), pruned with it."""
        return sorted([seq, slot] + ([self._removed[t]] if t in self._removed else [])
                      for t, (seq, tag, slot) in self._ingest.items()
                      if tag == tag_hash and t not in erased
                      and (t in self._removed or t in self._compacted))

    @staticmethod
    def _sealed(opens: list[tuple[int, str, Any]], slot: int, value: Any) -> str:
        c, salt = seal(value)
        opens.append((slot, salt, value))
        return c

    def _line(self, facts: AuditFacts, op: str,
              fields: tuple[dict[str, Any], list[tuple[int, str, Any]]]
              ) -> tuple[bytes, list[bytes]]:
        """The entry's line and its openings' lines."""
        rec = dict(fields[0])
        rec.update(seq=self._seq, op=op, prev=self._prev, time=_now(),
                   digest=facts.digest, n=facts.n, next_id=facts.next_id)
        rec["sha256"] = record_hash(rec)
        text = canonical(rec)
        opens = [opening_line(self._seq, slot, salt, value) for slot, salt, value in fields[1]]
        self._seq += 1
        self._prev = sha256_hex(text)
        return text.encode() + b"\n", opens

    def _write(self, written: list[tuple[bytes, list[bytes]]]) -> None:
        lines = [line for line, _ in written]
        data = b"".join(lines)
        try:
            append_openings(self.path, [o for _, opens in written for o in opens])
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

    def _append(self, facts: AuditFacts, op: str,
                fields: tuple[dict[str, Any], list[tuple[int, str, Any]]]) -> None:
        self._write([self._line(facts, op, fields)])


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune_log` deleted.

    Attributes
    ----------
    pruned : tuple of (int, int)
        ``(record, slot)`` of each opening deleted (each named by an erase).
    erases : tuple of int
        The erase records whose prune this finished.
    """

    pruned: tuple[tuple[int, int], ...]
    erases: tuple[int, ...]


def prune_log(path: str | os.PathLike[str], tag_hash: str | None = None) -> PruneReport:
    """Finish the prunes of a log's erases: delete from ``LOG.openings`` every opening an
    erase names that is still there (an erase prunes its subject itself; this finishes a
    prune a crash or a failed write cut), and openings of no entry.

    With ``tag_hash`` (a subject's tag hash, hex) it refuses unless that subject was
    forgotten: if the log holds an opening of a token of that subject that no erase
    names, nothing is deleted.

    Raises
    ------
    AuditLogError
        The log does not verify, is being written, or the subject was not forgotten.
    """
    path = Path(path)
    fd = _open_locked(path, os.O_RDONLY)  # no writer appends meanwhile
    try:
        rep = verify_chain(path, allow_unpruned=True)
        if not rep.ok:
            raise AuditLogError(f"audit log {path} does not verify: {rep.error}")
        if rep.version < 3:
            raise AuditLogError(f"audit log {path} is of format version {rep.version}: its "
                                "entries hold their data themselves (nothing beside them "
                                "to prune); a new log (version 3) starts from a saved state")
        pending = set(rep.unpruned)
        if tag_hash is not None:
            kept = [(r["seq"], k, tok["id"]) for r in rep.records if r["op"] in ("add", "extend")
                    for k, tok in enumerate(r["tokens"]) if tok.get("tag") == tag_hash]
            cont = rep.records[0].get("continues")
            if isinstance(cont, dict):  # the tokens a chain that continues a state started with
                kept += [(0, k, t) for k, t in enumerate(cont["live_ids"])
                         if cont["tags"].get(str(t)) == tag_hash]
            kept = [k for k in kept if k[:2] not in pending]
            if kept:
                raise AuditLogError(
                    f"refused: subject {tag_hash[:12]}… was not forgotten: record {kept[0][0]} "
                    f"ingested its token {kept[0][2]} and no erase names it (erase the "
                    "subject first: SVDDMemory.erase)")
        prune_openings(path, pending, below=len(rep.entries))
        return PruneReport(tuple(sorted(pending)), tuple(sorted(_erases_of(rep, pending))))
    finally:
        os.close(fd)


def _erases_of(rep: AuditReport, slots: set[tuple[int, int]]) -> set[int]:
    """The erase records that name any of ``slots``."""
    out = set()
    for r in rep.records:
        if r["op"] == "erase" and rep.version >= 3:
            er = r["erasure"]
            named = {tuple(a) for a in er["ingested_at"]} | {(a[0], a[1]) for a in er["prunes"]}
            named |= {(j, 0) for j in er["removed_at"]}
            named |= {(a[2], 0) for a in er["prunes"] if len(a) == 3}
            if (named | {(r["seq"], 0)}) & slots:
                out.add(r["seq"])
    return out


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


__all__ = ["LOG_VERSION", "LOG_VERSIONS", "STATE_OPS", "AuditFacts", "AuditLog", "AuditLogError",
           "AuditReport", "PruneReport", "canonical", "checkpoint_mismatch",
           "lock_log", "prune_log",
           "record_hash", "verify_chain"]
