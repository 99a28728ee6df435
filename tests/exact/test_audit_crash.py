"""Crash points of an audit log append, enumerated as SQLite tests its commits: the writer
(``crash_helpers.CrashingOS``) stops at the N-th write, fsync, truncate or rename of an
append (the log line, then the checkpoint's temporary file and its rename), for every N,
the pending write dropped, written or garbled (cut short). After each crash the files on
disk hold the old or the new log (a cut last line read past), the checkpoint is the old
or the new one and a root of the log's prefix, signed, and the log verifies as honest
(never as forged)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from crash_helpers import Crash, CrashingOS, crashing
from svattn.exact.auditor.logcheck import check_authenticity
from svattn.exact.records import audit as audit_module
from svattn.exact.records import openings as openings_module
from svattn.exact.records import tlog as tlog_module
from svattn.exact.records.audit import AuditFacts, AuditLog, AuditLogError, verify_chain
from svattn.exact.records.merkle import MerkleTree
from svattn.exact.records.signing import generate_key
from svattn.exact.records.tlog import checkpoint_path, controller_verifier, open_checkpoint

KEY = generate_key()


def _facts(n: int) -> AuditFacts:
    return AuditFacts(digest=f"{n:064x}", n=n, next_id=n, n_refactorizations=0, n_resolves=0,
                      n_drift_refactorizations=0, kkt_residual=0.0)


def _append(folder: Path, monkeypatch, fake) -> tuple[Path, int]:
    """A signed log of three records, then one more appended under ``fake`` (``os`` as
    the writer sees it); returns the log and its size before that append."""
    log = folder / "a.jsonl"
    w = AuditLog.create(log, {"C": 0.5}, _facts(0), KEY)
    w.record(_facts(2), "extend", ids=[0, 1], commitments=["c" * 64] * 2, tags=None)
    w.record(_facts(3), "add", ids=[2], commitments=["d" * 64], tags=None)
    try:
        with crashing(monkeypatch, fake, (audit_module, tlog_module, openings_module)):
            w.record(_facts(4), "add", ids=[3], commitments=["e" * 64], tags=None)
    finally:
        w.close()
    return log, 3


def test_every_crash_point_of_an_append_leaves_old_or_new(tmp_path, monkeypatch):
    counter = CrashingOS()
    (tmp_path / "count").mkdir()
    _append(tmp_path / "count", monkeypatch, counter)
    total = counter.calls
    assert total >= 5  # the line's write and fsync; the checkpoint's write, fsync, rename...
    seen = set()
    for n in range(1, total + 1):
        for mode in ("dropped", "written", "garbled"):
            folder = tmp_path / f"crash{n}-{mode}"
            folder.mkdir()
            with pytest.raises(AuditLogError) as e:  # the writer names the failed write
                _append(folder, monkeypatch, CrashingOS(n, mode))
            assert isinstance(e.value.__cause__, Crash)
            log, old_size = folder / "a.jsonl", 3
            rep = verify_chain(log, allow_torn_tail=True)
            assert rep.ok, (n, mode, rep.error)
            size = len(rep.entries)
            assert size in (old_size, old_size + 1), (n, mode)
            text = checkpoint_path(log).read_text()
            cp, _ = open_checkpoint(text, [controller_verifier(KEY.public_key())])
            assert cp.size in (old_size, old_size + 1) and cp.size <= size, (n, mode)
            assert cp.root == MerkleTree(rep.leaves[:cp.size]).root(), (n, mode)
            if not rep.torn_tail:
                auth = check_authenticity(log, rep, [controller_verifier(KEY.public_key())])
                assert not auth.failed, (n, mode, auth.lines())
            seen.add((size - old_size, cp.size - old_size, rep.torn_tail))
            shutil.rmtree(folder)
    # the enumeration reached each outcome: nothing written, the line only (checkpoint
    # behind: named unchecked), the line cut, and both
    assert {(0, 0, False), (1, 0, False), (0, 0, True), (1, 1, False)} <= seen, seen
