"""Reading an audit log back: its chain, its bookkeeping, a checkpoint against its tree.

:func:`verify_chain` re-checks an audit log (:mod:`svattn.exact.records.audit` writes
it): the hash chain, the bookkeeping (ids added / removed, counts), every
certificate's ``consistency_errors()``, each erase bound to the records that ingested
its ids under its subject; it reports the first broken record, and returns each
record's exact bytes and RFC 6962 leaf hash. :func:`checkpoint_mismatch` says why a
checkpoint is not one of the log's tree.

From format version 3 an entry holds salted commitments where it would hold a subject's
data (:mod:`svattn.exact.records.openings`): :func:`verify_chain` opens each from
``LOG.openings`` (an opening that does not match is an edit) and returns the records
with their openings in place; a commitment without its opening must be one an ``erase``
names (its subject forgotten, the opening pruned), and such a record reads back with
``"pruned": true`` and only what the log still proves (a token's id follows from the
entry's counters).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from svattn.exact.records.certificate import DeletionCertificate
from svattn.exact.records.merkle import MerkleTree, leaf_hash
from svattn.exact.records.note import TlogError
from svattn.exact.records.openings import (
    is_commitment,
    opening_matches,
    openings_path,
    read_openings,
)
from svattn.exact.records.tlog import log_origin, read_checkpoint_unverified

LOG_FORMAT = "svattn.audit"
LOG_VERSION = 3  # 2: a checkpoint beside the log; an erase names its ingest records
# 3: a subject's data in salted commitments, its openings beside the log and prunable
LOG_VERSIONS = (1, 2, 3)  # what the verifier reads
PRUNED = "pruned"  # the subject tag of a token whose opening was pruned
GENESIS = "0" * 64
STATE_OPS = {"add", "extend", "remove", "compact"}
EVENT_OPS = {"refactorize", "resolve", "ill_conditioned"}
_OPS = {"open", "save", "load", "erase"} | STATE_OPS | EVENT_OPS


def canonical(record: dict[str, Any]) -> str:
    """The canonical JSON text of a record (what is written and hashed)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def sha256_hex(text: str | bytes) -> str:
    """SHA-256 (hex) of a text or bytes (a record line's hash in the chain)."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def record_hash(record: dict[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON without its own ``sha256`` field."""
    return sha256_hex(canonical({k: v for k, v in record.items() if k != "sha256"}))


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
        tag hash or None (:data:`PRUNED` when its opening was pruned), its slot in that
        record)`` (the ``open`` record, index 0, for a chain that continues a state).
    version : int
        The log's format version (its ``open`` record's).
    n_pruned : int
        Commitments whose openings were pruned (version 3; each named by an erase).
    unpruned : list of (int, int)
        ``(record, slot)`` of openings an erase names that ``LOG.openings`` still holds
        (a prune not finished: with ``allow_unpruned`` the report lists them, else the
        log fails).
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
    ingested: dict[int, tuple[int, str | None, int]] = field(default_factory=dict, repr=False)
    version: int = LOG_VERSION
    n_pruned: int = 0
    unpruned: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        """One line for people."""
        if self.ok:
            n = self.n_certificates
            s = (f"OK: {self.n_records} record{'s' * (self.n_records != 1)}, chain intact, "
                 f"{n} deletion certificate{'s' * (n != 1)} consistent")
            if self.n_pruned:
                s += (f", {self.n_pruned} commitment{'s' * (self.n_pruned != 1)} of forgotten "
                      "subjects pruned (each named by an erase)")
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


def verify_chain(path: str | os.PathLike[str], *, allow_torn_tail: bool = False,
                 allow_unpruned: bool = False) -> AuditReport:
    """Verify an audit log's chain and bookkeeping (the state side is
    :func:`svattn.exact.auditor.verify.verify_log`).

    Parameters
    ----------
    path : path-like
        The JSONL log.
    allow_torn_tail : bool
        Read past a last line cut by a crash (no trailing newline) instead of
        failing on it (``torn_tail`` says so): what recovery needs.
    allow_unpruned : bool
        List the openings an erase names that are still beside the log (``unpruned``)
        instead of failing on them, and read past lines of ``LOG.openings`` that are no
        openings: what the writer needs to finish a prune. (A last line a crash cut,
        of the log or of ``LOG.openings``, is read past with either flag.)

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
    opener = _Opener(path, lines)
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
            if rep.version >= 3:  # the record with its openings in place
                error, rec = opener.open(rec, op, next_id, rep)
            else:
                error = None
            if error is None:
                error, next_id, certified = _bookkeep(rec, op, live, next_id, rep.records,
                                                      rep.ingested, rep.version)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            error = f"malformed record ({type(exc).__name__}: {exc})"
        if error is not None:
            return _fail(rep, i, error)
        rep.n_certificates += certified
        rep.records.append(rec)
        rep.hashes.append(sha256_hex(raw))
        rep.entries.append(raw)
        rep.leaves.append(leaf_hash(raw))
        prev = rep.hashes[-1]
    if not lines:
        return _fail(rep, 0, "the log is empty (no 'open' record)")
    rep.final_digest = rep.records[-1].get("digest")
    if rep.version >= 3 and opener.torn and not (allow_torn_tail or allow_unpruned):
        return _fail(rep, len(lines) - 1, "LOG.openings ends with an incomplete line (a "
                     "write was cut; resuming the log drops it)")
    if rep.version >= 3 and opener.problems and not allow_unpruned:  # (the writer, which
        # drops a line a crash cut from the openings' end before it appends again)
        return _fail(rep, len(lines) - 1, f"{opener.problems[0]} (LOG.openings was edited; "
                     "it may hold data no entry commits to)")
    if rep.unpruned and not allow_unpruned:
        k, r = rep.unpruned[0]
        return _fail(rep, opener.named[(k, r)], f"its subject's data is not gone: LOG.openings "
                     f"still holds {len(rep.unpruned)} opening(s) it erased (first: record {k} "
                     f"slot {r}); `svattn audit prune LOG` finishes the prune")
    return rep


class _Opener:
    """The openings of a version-3 log's commitments, put back into its records."""

    def __init__(self, path: str | os.PathLike[str], lines: list[bytes]) -> None:
        self.path = path
        self.found, self.problems, self.torn = read_openings(path)
        self.missing = not openings_path(path).exists()
        self.named: dict[tuple[int, int], int] = {}  # (record, slot) -> the erase naming it
        self.removal: dict[int, tuple[int, int]] = {}  # remove record -> its ingest slot
        self.slot_ids: dict[tuple[int, int], int] = {}  # (record, slot) -> the token id
        for e, raw in enumerate(lines):  # which slots erases name (each checked in turn)
            if b'"op":"erase"' not in raw:
                continue
            try:
                er = json.loads(raw)["erasure"]
                at, rm = er["ingested_at"], er["removed_at"]
                for a in at + er["prunes"]:
                    self.named[(int(a[0]), int(a[1]))] = e
                for a, j in [*zip(at, rm, strict=True),
                             *((a[:2], a[2]) for a in er["prunes"] if len(a) == 3)]:
                    self.named[(int(j), 0)] = e
                    self.removal[int(j)] = (int(a[0]), int(a[1]))
                self.named[(e, 0)] = e
            except (ValueError, KeyError, IndexError, TypeError, RecursionError):
                continue

    def _value(self, i: int, r: int, commitment: Any, rep: AuditReport
               ) -> tuple[str | None, Any]:
        """``(error, the opened value or None when pruned)`` of slot ``r`` of record ``i``."""
        if not is_commitment(commitment):
            return f"slot {r} is not a salted commitment (64 hex digits)", None
        held = self.found.get((i, r), [])
        for salt, value in held:
            if opening_matches(commitment, salt, value):
                if (i, r) in self.named:
                    rep.unpruned.append((i, r))
                return None, value
        if held:
            return (f"the opening of slot {r} in LOG.openings does not match its commitment "
                    "(LOG.openings was edited)"), None
        if (i, r) not in self.named:
            if self.missing:
                return (f"slot {r} has no opening: {openings_path(self.path).name}, which "
                        "holds the openings beside the log, is missing (copy it with the "
                        "log)"), None
            return (f"the opening of slot {r} is missing from LOG.openings, and no erase "
                    "names it (deleted without forgetting its subject)"), None
        rep.n_pruned += 1
        return None, None

    def open(self, rec: dict[str, Any], op: str, next_id: int, rep: AuditReport
             ) -> tuple[str | None, dict[str, Any]]:
        """``(error, the record with its openings in place)``."""
        i, out = rec["seq"], dict(rec)
        if op in ("add", "extend"):
            toks = []
            for r, c in enumerate(rec["tokens"]):
                error, value = self._value(i, r, c, rep)
                if error is not None:
                    return error, rec
                if value is None:
                    value = {"id": next_id + r, "pruned": True}
                elif not isinstance(value, dict) or value.get("id") != next_id + r:
                    return f"token {r}'s opening does not carry id {next_id + r}", rec
                self.slot_ids[(i, r)] = value["id"]
                toks.append(value)
            out["tokens"] = toks
        elif op == "remove":
            error, value = self._value(i, 0, rec["certificate"], rep)
            if error is not None:
                return error, rec
            if value is None:
                value = {"removed_id": self.slot_ids.get(self.removal[i]), "pruned": True}
            out["certificate"] = value
        elif op == "erase":
            er = dict(rec["erasure"])
            error, value = self._value(i, 0, er.pop("opening"), rep)
            if error is not None:
                return error, rec
            if value is None:
                value = {"erased_ids": [self.slot_ids.get((int(k), int(r)))
                                        for k, r in er["ingested_at"]], "pruned": True}
            if not isinstance(value, dict) or set(value) & set(er):
                return "the erasure's opening is not an object of its own fields", rec
            out["erasure"] = {**value, **er}
        elif op == "open" and isinstance(rec.get("continues"), dict):
            cont = dict(rec["continues"])
            tags = {}
            for r, (tid, c) in enumerate(zip(cont["live_ids"], cont["tags"], strict=True)):
                self.slot_ids[(i, r)] = tid
                if c is None:
                    continue
                error, value = self._value(i, r, c, rep)
                if error is not None:
                    return error, rec
                tags[str(tid)] = PRUNED if value is None else value["tag"]
            out["continues"] = {**cont, "tags": tags}
        return None, out


def _bookkeep(rec: dict[str, Any], op: str, live: set[int], next_id: int,
              earlier: list[dict[str, Any]], ingested: dict[int, tuple[int, str | None, int]],
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
        ingested.update({t: (0, tags.get(str(t)), r) for r, t in enumerate(ids)})
        next_id = nid
    elif op in ("add", "extend"):
        tokens = rec.get("tokens", [])
        if not isinstance(tokens, list):
            return f"tokens is {type(tokens).__name__}, not a list", next_id, 0
        for r, tok in enumerate(tokens):
            if not isinstance(tok, dict):
                return f"a token entry is {type(tok).__name__}, not an object", next_id, 0
            tid = tok.get("id")
            if not isinstance(tid, int) or isinstance(tid, bool) or tid < next_id:
                return f"adds id {tid!r}, but ids below {next_id} were already issued", \
                    next_id, 0
            pruned = tok.get("pruned") is True
            if not pruned and not (isinstance(tok.get("commitment"), str)
                                   and len(tok["commitment"]) == 64):
                return f"token {tid} lacks a SHA-256 commitment", next_id, 0
            live.add(tid)
            ingested[tid] = (rec["seq"], PRUNED if pruned else tok.get("tag"), r)
            next_id = tid + 1
    elif op == "remove":
        fields = rec.get("certificate")
        if not isinstance(fields, dict):
            return "malformed deletion certificate (not an object)", next_id, 0
        if fields.get("pruned") is True:  # its subject forgotten: the id, from the erase
            if fields.get("removed_id") not in live:
                return (f"removes id {fields.get('removed_id')!r} (pruned), which is not "
                        "live", next_id, 0)
            live.discard(fields["removed_id"])
            return _counts(rec, op, live, next_id), next_id, 0
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
        error = erase_unbound(er, ids, ingested, version) or (
            _removals_unnamed(er, ids, earlier, rec["seq"])
            or _prunes_unbound(er, live, ingested, earlier) if version >= 3 else None)
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
    return _counts(rec, op, live, next_id), next_id, certified


def _removals_unnamed(er: dict[str, Any], ids: list[int], earlier: list[dict[str, Any]],
                      at: int) -> str | None:
    """Why a version-3 erase does not name, per erased id, the earlier remove record of
    it, or lacks the receipt's SHA-256 (None: it names them)."""
    rm = er.get("removed_at")
    if not (isinstance(rm, list) and len(rm) == len(ids)):
        return "erasure must name, per erased id, the record that removed it"
    wrong = [t for t, j in zip(ids, rm, strict=True)
             if not (isinstance(j, int) and 0 < j < at and earlier[j]["op"] == "remove"
                     and earlier[j]["certificate"].get("removed_id") == t)]
    if wrong:
        return f"erasure names records that did not remove ids {wrong[:5]}"
    if not is_commitment(er.get("receipt_sha256")):
        return "erasure lacks its receipt's SHA-256"
    return None


def _prunes_unbound(er: dict[str, Any], live: set[int],
                    ingested: dict[int, tuple[int, str | None, int]],
                    earlier: list[dict[str, Any]]) -> str | None:
    """Why a version-3 erase's ``prunes`` (the subject's tokens that left before it) name
    something else (None: they do not): each ``[record, slot]`` the ingest slot of a
    token no longer live, of the erase's subject where both still say, and a third
    number the record that removed that token."""
    prunes = er.get("prunes")
    if not (isinstance(prunes, list) and all(
            isinstance(a, list) and len(a) in (2, 3) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in a) for a in prunes)):
        return "erasure must list the slots it prunes besides its ids (prunes)"
    slot_ids = {(v[0], v[2]): t for t, v in ingested.items()}
    tag = None if er.get("pruned") is True else er.get("tag_hash")
    for a in prunes:
        t = slot_ids.get((a[0], a[1]))
        if t is None or t in live:
            return f"erasure prunes record {a[0]} slot {a[1]}, which holds no token gone"
        if tag is not None and ingested[t][1] not in (tag, PRUNED):
            return f"erasure prunes token {t}, never ingested under subject {str(tag)[:12]}…"
        if len(a) == 3 and not (0 < a[2] < len(earlier) and earlier[a[2]]["op"] == "remove"
                                and earlier[a[2]]["certificate"].get("removed_id") == t):
            return f"erasure names record {a[2]} as the removal of token {t}, which it is not"
    return None


def _counts(rec: dict[str, Any], op: str, live: set[int], next_id: int) -> str | None:
    """Why a record's counts differ from what the log's operations leave (None: same)."""
    if op not in EVENT_OPS:
        if rec.get("n") != len(live):
            return (f"says n = {rec.get('n')!r}, but the log's operations leave {len(live)} "
                    "tokens")
        if op != "open" and rec.get("next_id") != next_id and not (
                op == "load" and isinstance(rec.get("next_id"), int)
                and rec["next_id"] >= next_id):
            return (f"says next_id = {rec.get('next_id')!r}, but the log's operations have "
                    f"issued ids below {next_id}")
    return None


def erase_unbound(er: dict[str, Any], ids: list[int],
                  ingested: dict[int, tuple[int, str | None, int]], version: int) -> str | None:
    """Why an erase record is not bound to what the log ingested (None: it is): every
    erased id was added under the erasure's subject, at the record the erase names
    (version 2; version 3: the record and the slot; a version-1 erase names none, and an
    add without a tag is not compared). A pruned erase (version 3) no longer holds its
    subject: the records and slots it names must be those of its ids."""
    tag = er.get("tag_hash")
    if version >= 3:
        at = er.get("ingested_at")
        if not (isinstance(at, list) and len(at) == len(ids)):
            return "erasure must name, per erased id, the record and slot that ingested it"
        wrong = [t for t, a in zip(ids, at, strict=True)
                 if list(ingested.get(t, (None, None, None))[0::2]) != a]
        if wrong:
            return (f"erasure names ingest slots that did not add ids {wrong[:5]} (a "
                    "fabricated erase)")
        foreign = [] if er.get("pruned") is True else [t for t in ids if ingested[t][1] != tag]
    elif version >= 2:
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


__all__ = ["EVENT_OPS", "GENESIS", "LOG_FORMAT", "LOG_VERSION", "LOG_VERSIONS", "PRUNED",
           "STATE_OPS",
           "AuditReport", "canonical", "checkpoint_mismatch", "erase_unbound", "record_hash",
           "sha256_hex",
           "verify_chain"]
