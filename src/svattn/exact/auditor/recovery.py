"""Recovery after a crash between a logged operation and the next save.

The audit log is written before an operation returns, a state only when saved.
A crash in between leaves a log that records operations the saved state lacks,
and continuing that log from the state would undo them, removals included (the
memory refuses: it would resurrect erased tokens). :func:`recover` is the way
out: it loads the last saved state, **replays every removal** the log recorded
after that save (their certificates are issued again, by the loaded memory),
and starts a **new chain** whose ``open`` record cites the saved state and the
old log's last record, then records the replayed removals in it. A subject's erase
(log format 3) is replayed as an erase of the same subject, so that the new chain prunes
the subject's data as the old one did; an erase the crash cut before its prune is pruned
in the old log.

What cannot be replayed is reported, not hidden: tokens added after the save
(the log holds commitments, never data) are lost, and so are their later
removals, which have nothing to act on. A last line cut by the crash is read
past and reported.

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> d = tempfile.mkdtemp()
>>> log, state = os.path.join(d, "a.jsonl"), os.path.join(d, "m.safetensors")
>>> mem = SVDDMemory(C=0.2, audit_log=log)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(30, 2)))
>>> _ = mem.save(state)
>>> _ = mem.remove(ids[3])  # logged, then the process dies before the next save
>>> mem.close_audit_log()
>>> again, report = recover(state, log, os.path.join(d, "b.jsonl"))
>>> report.replayed, ids[3] in again.ids
((3,), False)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from svattn.exact.memory import SVDDMemory
from svattn.exact.records.audit import AuditLogError, lock_log, verify_chain
from svattn.exact.records.certificate import DeletionCertificate
from svattn.exact.records.fileformat import parse_header, read_metadata
from svattn.exact.records.openings import prune_openings


@dataclass(frozen=True)
class RecoveryReport:
    """What :func:`recover` did.

    Attributes
    ----------
    state_record : int
        The old log's record the state was saved at.
    old_records : int
        Records of the old log (a torn last line not counted).
    torn_tail : bool
        The old log's last line was cut by the crash (read past).
    replayed : tuple of int
        Ids removed again: erasures (and compactions) logged after the save.
    certificates : tuple of DeletionCertificate
        The replayed removals' certificates, from the recovered memory.
    lost_adds : tuple of int
        Ids added after the save: their data was never in a saved file.
    moot : tuple of int
        Ids whose removal the log recorded but the state never held (lost adds).
    """

    state_record: int
    old_records: int
    torn_tail: bool
    replayed: tuple[int, ...]
    certificates: tuple[DeletionCertificate, ...]
    lost_adds: tuple[int, ...]
    moot: tuple[int, ...]

    def summary(self, *, old_state_removed: bool = False) -> str:
        """One line for people (and, when removals were replayed, that the old state
        file still holds their tokens, unless ``old_state_removed``: it was deleted)."""
        line = (f"recovered from the state saved at record {self.state_record} of "
                f"{self.old_records}: {len(self.replayed)} removals replayed, "
                f"{len(self.lost_adds)} tokens added after the save lost"
                + (", a torn last line read past" if self.torn_tail else ""))
        if self.replayed and old_state_removed:
            line += (f"; the old state file, which held the {len(self.replayed)} tokens "
                     "removed again, was overwritten with zeros and deleted")
        elif self.replayed:
            line += (f"; the old state file still holds the {len(self.replayed)} tokens "
                     f"removed again (ids {list(self.replayed)[:10]}): delete it, or they "
                     "are not erased")
        return line


def recover(state: str | os.PathLike[str], log: str | os.PathLike[str],
            new_log: str | os.PathLike[str], *, signing_key=None, tag_key: bytes | None = None
            ) -> tuple[SVDDMemory, RecoveryReport]:
    """The last saved state with every later logged removal replayed, on a new log.

    Parameters
    ----------
    state : path-like
        The last state saved with ``log``.
    log : path-like
        Its audit log (it may end with a line cut by the crash).
    new_log : path-like
        A new (or empty) file: the recovered memory's log, citing the old one.
    signing_key : optional
        Sign the replayed certificates (see :class:`SVDDMemory`).
    tag_key : bytes, optional
        The tag key, when it is not derived from ``signing_key``: the recovered memory
        keeps committing under the same key (see :class:`SVDDMemory`).

    Raises
    ------
    AuditLogError
        The old log does not verify, or the state was not saved with it.
    """
    state, log = Path(state), Path(log)
    lock = lock_log(log)  # no writer may append while the removals are read and replayed
    try:
        return _recover_locked(state, log, Path(new_log), signing_key, tag_key)
    finally:
        os.close(lock)


def _recover_locked(state: Path, log: Path, new_log: Path, signing_key, tag_key
                    ) -> tuple[SVDDMemory, RecoveryReport]:
    rep = verify_chain(log, allow_torn_tail=True, allow_unpruned=True)
    if not rep.ok:
        raise AuditLogError(f"audit log {log} does not verify: {rep.error}")
    if rep.unpruned:  # an erase the crash cut before its prune: finish it (no writer holds
        prune_openings(log, rep.unpruned)  # the old log: recovery holds its lock)
    data = state.read_bytes()
    head = read_metadata(parse_header(data, str(state))[0], str(state)).get("audit_head")
    if head is None:
        raise AuditLogError(f"state {state} was saved without an audit log")
    seq = int(head["seq"])
    if seq >= len(rep.records) or rep.hashes[seq] != head["sha256"]:
        raise AuditLogError(f"state {state} was not saved with the log {log} (its record "
                            f"{seq} is not in it)")
    memory = SVDDMemory.load(state, signing_key=signing_key, tag_key=tag_key)
    # the state must be the one this log saved: its digest at the record it names, and a
    # save record of exactly these bytes after it (an older state relabelled with a later
    # head would otherwise skip the removals in between)
    sha = hashlib.sha256(data).hexdigest()
    if rep.records[seq].get("digest") != memory.state_digest():
        raise AuditLogError(f"state {state} does not carry the digest of record {seq} of "
                            f"{log}: it is not the state saved there")
    if not any(r["op"] == "save" and r.get("file_sha256") == sha
               for r in rep.records[seq + 1:]):
        raise AuditLogError(f"the log {log} does not record saving state {state} "
                            f"(sha256 {sha[:12]}…) after record {seq}")
    held = set(memory.ids)
    replay, lost, moot = [], [], []
    steps: list[tuple[str, object]] = []  # ("remove", id) or ("erase", its subject's hash)
    erased_by = {j: r["seq"] for r in rep.records[seq + 1:] if r["op"] == "erase"
                 for j in r["erasure"].get("removed_at", [])}
    for rec in rep.records[seq + 1:]:
        if rec["op"] in ("add", "extend"):
            lost += [t["id"] for t in rec["tokens"] if t["id"] not in held]
        elif rec["op"] in ("remove", "compact"):
            gone = ([rec["certificate"]["removed_id"]] if rec["op"] == "remove"
                    else rec["dropped"])
            for tid in gone:
                (replay if tid in held and tid not in replay else moot).append(tid)
                if replay and replay[-1] == tid and rec["seq"] not in erased_by:
                    steps.append(("remove", tid))
        elif rec["op"] == "erase" and rec["seq"] in erased_by.values():  # (version 3)
            # erased again as a subject, so that the new chain prunes it too: its hash
            # from the state (the log's may be pruned already)
            mine = [t for t in rec["erasure"]["erased_ids"] if t in held]
            if mine:
                ss = memory.solver_state
                steps.append(("erase", ss.tags[ss.id_to_slot[mine[0]]].tobytes().hex()))
    last = len(rep.records) - 1
    memory.attach_audit_log(new_log, cites={
        "state": state.name, "state_sha256": sha,
        "log": log.name, "state_record": seq,
        "log_last_record": {"seq": last, "sha256": rep.hashes[last]},
        "replays_removals_after": seq, "torn_tail": rep.torn_tail,
    })
    certs: list[DeletionCertificate] = []
    for what, arg in steps:
        if what == "remove":
            certs.append(memory.remove(arg))
        else:
            certs += memory.erase(tag_hash=arg).deletion_certificates()
    certs = tuple(certs)
    return memory, RecoveryReport(
        state_record=seq, old_records=len(rep.records), torn_tail=rep.torn_tail,
        replayed=tuple(replay), certificates=certs, lost_adds=tuple(lost),
        moot=tuple(t for t in moot if t not in replay))


__all__ = ["RecoveryReport", "recover"]
