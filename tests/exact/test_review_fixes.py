"""Fixes of an adversarial review of the trust work (#18): each test is one finding."""

from __future__ import annotations

import os

import numpy as np
import pytest

from svattn.exact import OperationError, SVDDMemory
from svattn.exact.auditor.verify import verify_deletion, verify_erasure, verify_log
from svattn.exact.operations import rollback
from svattn.exact.records.certificate import commitment_key
from svattn.exact.records.fileformat import SavedNotDurable, StateFileError

TAG_KEY = b"review-fixes-tag-key-0123456789ab"


def _memory(**kw) -> SVDDMemory:
    mem = SVDDMemory(C=0.05, **kw)
    mem.extend(np.random.default_rng(3).normal(size=(120, 4)))
    return mem


def _move_alpha(mem: SVDDMemory, amount: float) -> None:
    ss = mem.solver_state
    a, b = ss.margin_slots()[:2]
    ss.alpha[a] += amount
    ss.alpha[b] -= amount
    ss.sync_ac()


def test_an_honest_drift_near_tol_loads(tmp_path):
    mem = _memory()
    _move_alpha(mem, 1e-9)  # what a running g can drift by between exact checks
    path = tmp_path / "m.safetensors"
    mem.save(path)
    assert SVDDMemory.load(path).state_digest() == mem.state_digest()


def test_a_forged_alpha_is_refused_even_where_no_solve_meets_tol(tmp_path):
    mem = _memory(tol=1e-18)  # no solve meets this tol: the re-solve's own residual is the bar
    _move_alpha(mem, 0.01)
    path = tmp_path / "m.safetensors"
    mem.save(path)
    with pytest.raises(StateFileError, match="re-solve of the same tokens reaches"):
        SVDDMemory.load(path)


def test_a_keyed_memory_refuses_adds_without_its_key(tmp_path):
    mem = _memory(tag_key=TAG_KEY)
    path = tmp_path / "m.safetensors"
    mem.save(path)
    back = SVDDMemory.load(path)
    before = back.state_digest()
    with pytest.raises(ValueError, match="load it with that key"):
        back.add(np.zeros(4))
    assert back.state_digest() == before and len(back) == 120
    with pytest.raises(ValueError, match="another key"):  # #35: refused at load already
        SVDDMemory.load(path, tag_key=b"another-key-0123456789abcdef")
    SVDDMemory.load(path, tag_key=TAG_KEY).add(np.zeros(4))


def test_edited_stored_commitments_and_tags_break_the_log_check(tmp_path):
    log, path = tmp_path / "a.jsonl", tmp_path / "m.safetensors"
    x = np.random.default_rng(0).normal(size=(30, 3))
    mem = SVDDMemory(C=0.1, audit_log=log, tag_key=TAG_KEY)
    mem.extend(x[:20], tags=["alice"] * 3 + ["bob"] * 17)
    ss = mem.solver_state
    ss.tags[ss.id_to_slot[1]] = 0  # untag one of alice's tokens behind the memory's back
    mem.save(path)
    rep = verify_log(log, path)
    assert not rep.ok and "[1]" in rep.error and "tag" in rep.error
    mem.close_audit_log()
    back = SVDDMemory.load(path, audit_log=log, tag_key=TAG_KEY)
    receipt = back.erase("alice")
    assert 1 in back.ids
    res = verify_erasure(back, receipt, log=log)
    assert not res.ok and any("added live tokens [1]" in r for r in res.reasons)


def test_a_forged_stored_commitment_or_a_wrong_key_is_named(tmp_path):
    x = np.random.default_rng(1).normal(size=(40, 3))
    mem = SVDDMemory(C=0.1, tag_key=TAG_KEY)
    mem.extend(x)
    cert = mem.remove(3)
    ok = verify_deletion(mem, cert, retrain=False, commit_key=commitment_key(TAG_KEY))
    assert ok.ok
    wrong = verify_deletion(mem, cert, retrain=False, commit_key=commitment_key(b"x" * 32))
    assert not wrong.ok and any(r.startswith("commit_key:") for r in wrong.reasons)


def test_a_failed_restore_leaves_a_memory_that_refuses_and_a_log_without_the_record(
        tmp_path, monkeypatch):
    log = tmp_path / "a.jsonl"
    mem = SVDDMemory(C=0.1, audit_log=log)
    ids = mem.extend(np.random.default_rng(2).normal(size=(50, 3)))
    before = log.read_bytes()

    def no_memory(*a, **k):
        raise MemoryError("restore")

    def failing_op(*a, **k):
        raise RuntimeError("the operation")

    monkeypatch.setattr(rollback, "restore", no_memory)
    monkeypatch.setattr(type(mem), "_after_op", failing_op)
    with pytest.raises(OperationError, match="NOT restored"):
        mem.remove(ids[0])
    monkeypatch.undo()
    assert log.read_bytes() == before  # the log was undone first
    with pytest.raises(OperationError, match="broken"):
        mem.add(np.zeros(3))
    with pytest.raises(OperationError, match="broken"):
        mem.save(tmp_path / "m.safetensors")


def test_a_directory_sync_failure_after_the_rename_keeps_the_save_record(tmp_path,
                                                                        monkeypatch):
    log, path = tmp_path / "a.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(C=0.1, audit_log=log)
    mem.extend(np.random.default_rng(4).normal(size=(40, 3)))
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SavedNotDurable):
        mem.save(path)
    monkeypatch.undo()
    assert verify_log(log, path).ok  # the file in place and its record agree


def test_commitments_frame_the_key_and_value_lengths():
    from svattn.exact.records.certificate import commit_token

    a = commit_token(np.array([1.0, 2.0]), np.array([3.0]), b"k" * 32)[0]
    b = commit_token(np.array([1.0]), np.array([2.0, 3.0]), b"k" * 32)[0]
    c = commit_token(np.array([1.0, 2.0, 3.0]), None, b"k" * 32)[0]
    assert len({a, b, c}) == 3
