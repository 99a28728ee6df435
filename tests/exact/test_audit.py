"""The audit log: chain, tamper detection at the exact record (a re-hashed chain
included), CLI verifiers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from audit_forger import read_records, write_records
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.auditor.verify import verify_log
from svattn.exact.records.audit import AuditLogError, canonical
from svattn.exact.records.audit import record_hash as _self_hash


@pytest.fixture
def logged(tmp_path):
    """A memory with an audit log of ~25 records and a state saved at the end."""
    rng = np.random.default_rng(0)
    log = tmp_path / "audit.jsonl"
    state = tmp_path / "m.safetensors"
    mem = SVDDMemory(0.05, audit_log=log)
    ids = mem.extend(rng.normal(size=(80, 4)))
    certs = []
    for t in ids[:12]:
        certs.append(mem.remove(t))
    for x in rng.normal(size=(6, 4)):
        mem.add(x)
    mem.compact()
    certs.append(mem.remove(mem.support_ids()[0]))
    mem.save(state)
    return mem, log, state, certs


def _lines(log):
    return log.read_text().splitlines()


def _write(log, lines):
    log.write_text("".join(line + "\n" for line in lines))


def test_clean_log_verifies(logged):
    mem, log, state, certs = logged
    rep = verify_log(log, state)
    assert rep.ok, rep.error
    ops = [r["op"] for r in rep.records]
    assert ops[0] == "open" and ops[1] == "extend" and ops[-1] == "save"
    assert ops.count("remove") == len(certs) == rep.n_certificates
    assert rep.final_digest == mem.state_digest()
    rec = rep.records[2]
    assert rec["certificate"]["removed_id"] == certs[0].removed_id
    assert rec["digest"] == certs[0].state_digest
    assert all(len(t["commitment"]) == 64 for t in rep.records[1]["tokens"])


def test_add_commitments_open_only_with_the_controllers_key(tmp_path):
    from svattn.exact.records.certificate import commit_token, commitment_key

    log = tmp_path / "a.jsonl"
    tag_key = b"t" * 32
    mem = SVDDMemory(0.5, audit_log=log, tag_key=tag_key)
    x = np.array([0.25, -1.5])
    mem.add(x)
    tok = verify_log(log).records[1]["tokens"][0]
    assert set(tok) == {"id", "commitment"}  # no salt beside it
    assert tok["commitment"] == commit_token(x, None, commitment_key(tag_key))[0]
    assert tok["commitment"] != commit_token(x, None, commitment_key(b"u" * 32))[0]


def test_every_single_record_edit_is_detected_there(logged):
    _, log, state, _ = logged
    lines = _lines(log)
    for i in range(len(lines)):
        rec = json.loads(lines[i])
        rec["time"] = "2000-01-01T00:00:00.000000+00:00"  # valid JSON, semantically neutral
        edited = lines.copy()
        edited[i] = canonical(rec)
        _write(log, edited)
        rep = verify_log(log)
        assert not rep.ok and rep.broken_record == i, (i, rep.error)
        assert "edited" in rep.error
        # the same edit, re-hashed: caught by the next record's prev (or the state)
        rec["sha256"] = _self_hash(rec)
        edited[i] = canonical(rec)
        _write(log, edited)
        rep = verify_log(log, state)
        if i < len(lines) - 1:
            assert rep.broken_record == i and f"record {i} was edited and re-hashed" in rep.error
        else:  # the last record (the save): re-hashing a neutral edit is undetectable
            assert rep.ok
    _write(log, lines)
    assert verify_log(log, state).ok


def test_whitespace_edit_is_detected(logged):
    _, log, _, _ = logged
    lines = _lines(log)
    lines[3] = lines[3].replace(",", ", ", 1)
    _write(log, lines)
    rep = verify_log(log)
    assert rep.broken_record == 3 and "canonical" in rep.error


def test_every_deletion_is_detected_at_its_position(logged):
    _, log, state, _ = logged
    lines = _lines(log)
    for i in range(len(lines)):
        _write(log, lines[:i] + lines[i + 1 :])
        rep = verify_log(log, state)
        assert not rep.ok, i
        if i < len(lines) - 1:
            assert rep.broken_record == i, (i, rep.error)
            assert "deleted, inserted or reordered" in rep.error
        else:  # the last record (the save): only the saved state can tell
            assert verify_log(log).ok
            assert "does not record saving this state" in rep.error


def test_every_reordering_is_detected_at_the_first_moved_record(logged):
    _, log, _, _ = logged
    lines = _lines(log)
    rng = np.random.default_rng(0)
    pairs = [(i, i + 1) for i in range(len(lines) - 1)] + [
        tuple(sorted(rng.choice(len(lines), 2, replace=False))) for _ in range(10)]
    for i, j in pairs:
        moved = lines.copy()
        moved[i], moved[j] = moved[j], moved[i]
        _write(log, moved)
        rep = verify_log(log)
        assert not rep.ok and rep.broken_record == i, (i, j, rep.error)


def test_inserted_and_truncated_records(logged):
    _, log, _, _ = logged
    lines = _lines(log)
    _write(log, lines[:5] + [lines[4]] + lines[5:])  # a duplicated record
    assert verify_log(log).broken_record == 5
    log.write_text("\n".join(lines) + "\n" + lines[-1][:30])  # a cut final write
    rep = verify_log(log)
    assert rep.broken_record == len(lines) and "incomplete record" in rep.error
    log.write_text("")
    assert "empty" in verify_log(log).error


def test_inconsistent_certificate_is_reported(logged):
    _, log, _, _ = logged
    records = read_records(log)
    i = next(k for k, r in enumerate(records) if r["op"] == "remove")
    records[i]["certificate"]["partition_after"]["margin"] += 5
    write_records(log, records[: i + 1])  # the last record: the chain alone cannot see it
    rep = verify_log(log)
    assert rep.broken_record == i and "certificate inconsistent" in rep.error


def test_removing_an_unknown_id_is_reported(logged):
    _, log, _, _ = logged
    records = read_records(log)
    i = next(k for k, r in enumerate(records) if r["op"] == "remove")
    records[i]["certificate"]["removed_id"] = 10_000
    write_records(log, records[: i + 1])
    rep = verify_log(log)
    assert rep.broken_record == i and "removes id 10000, which is not live" in rep.error


def test_state_mismatch_and_stale_state(logged, tmp_path):
    mem, log, state, _ = logged
    mem.remove(mem.ids[0])  # the log moves on; the saved state is now stale
    rep = verify_log(log, state)
    assert not rep.ok and "after state" in rep.error and "stale" in rep.error
    mem.close_audit_log()  # one writer per log (see the lock test below)
    with pytest.raises(AuditLogError, match="resurrect"):
        SVDDMemory.load(state, audit_log=log)
    other = tmp_path / "other.safetensors"
    SVDDMemory(0.5).save(other)
    assert "saved without an audit log" in verify_log(log, other).error


def test_resume_continues_the_chain(logged):
    mem, log, state, _ = logged
    mem.close_audit_log()
    got = SVDDMemory.load(state, audit_log=log)
    got.remove(got.ids[0])
    got.add(np.zeros(4))
    state2 = state.with_name("m2.safetensors")
    got.save(state2)
    rep = verify_log(log, state2)
    assert rep.ok, rep.error
    assert [r["op"] for r in rep.records[-4:]] == ["load", "remove", "add", "save"]


def test_one_writer_per_log(logged, tmp_path):
    mem, log, state, _ = logged
    before = log.read_bytes()
    with pytest.raises(AuditLogError, match="being written by another memory"):
        SVDDMemory.load(state, audit_log=log)  # mem still holds the log
    assert log.read_bytes() == before  # nothing written by the refused second writer
    mem.close_audit_log()
    with pytest.raises(AuditLogError, match="closed"):
        mem.add(np.zeros(4))  # a memory whose log is released changes nothing more
    got = SVDDMemory.load(state, audit_log=log)  # now it may continue the log
    got.add(np.ones(4))
    assert verify_log(log).ok
    # a log held by another process is refused the same way
    import subprocess
    import sys

    other = tmp_path / "other.jsonl"
    other.touch()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(30)"),
        str(other)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(AuditLogError, match="being written by another memory"):
            SVDDMemory(0.1, audit_log=other)
    finally:
        holder.kill()
        holder.wait()


def test_a_directory_is_not_an_audit_log(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        SVDDMemory(0.1, audit_log=tmp_path)


def test_new_memory_refuses_an_existing_log(logged):
    _, log, _, _ = logged
    with pytest.raises(ValueError, match="already has records"):
        SVDDMemory(0.1, audit_log=log)


def test_failed_log_write_stops_the_memory(tmp_path, monkeypatch):
    log = tmp_path / "a.jsonl"
    mem = SVDDMemory(0.1, audit_log=log)
    mem.extend(np.random.default_rng(0).normal(size=(30, 3)))

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(AuditLogError, match="No space left"):
        mem.remove(0)
    monkeypatch.undo()
    n = len(mem)
    with pytest.raises(AuditLogError, match="failed earlier"):
        mem.add(np.zeros(3))
    with pytest.raises(AuditLogError, match="failed earlier"):
        mem.remove(1)
    assert len(mem) == n  # refused before any change


def test_health_events_are_logged(tmp_path):
    log = tmp_path / "a.jsonl"
    mem = SVDDMemory(0.05, audit_log=log)
    mem.extend(np.random.default_rng(0).normal(size=(60, 3)))
    check = mem.health.check

    def drifted(qinv, measure, refactorize):  # pretend the inverse drifted
        return check(qinv, lambda: (10.0, 1e-3), refactorize)

    mem.health.check = drifted
    before = mem.n_refactorizations
    mem.remove(mem.support_ids()[0])
    assert mem.n_refactorizations > before
    recs = verify_log(log).records
    ev = [r for r in recs if r["op"] == "refactorize"]
    assert ev and ev[-1]["within"] == "remove" and "drift" in ev[-1]["reason"]
    assert recs[-1]["op"] == "remove"


# ------------------------------------------------------------------------ CLI


def test_cli_audit_verify(logged, capsys):
    _, log, state, _ = logged
    # an unsigned log: chain and checkpoints hold, authenticity is named unchecked
    assert main(["audit", "verify", str(log), str(state)]) == 3
    out = capsys.readouterr().out
    assert "OK" in out and "UNCHECKED: audit.jsonl.checkpoint is unsigned" in out
    lines = _lines(log)
    # a log cut at its end still chains, but its checkpoint names the longer tree (exit 1)
    _write(log, lines[:-3])
    assert main(["audit", "verify", str(log)]) == 1
    assert "VERIFIED" not in capsys.readouterr().out
    assert main(["audit", "verify", str(log), str(state)]) == 1  # the state tells
    assert "BROKEN" in capsys.readouterr().out
    _write(log, lines[:3] + lines[4:])
    assert main(["audit", "verify", str(log)]) == 1
    assert "BROKEN at record 3" in capsys.readouterr().out
    assert main(["audit", "verify", str(log.with_name("none.jsonl"))]) == 2


def test_cli_verify_deletion(logged, tmp_path, capsys):
    mem, log, state, certs = logged
    cert_path = tmp_path / "cert.json"
    cert_path.write_text(certs[-1].to_json())
    # an unsigned log: the receipt's fields verify, the log's authenticity is unchecked
    assert main(["verify-deletion", str(state), str(cert_path), "--log", str(log)]) == 3
    out = capsys.readouterr().out
    assert "optimality:          proven" in out
    assert "receipt's fields all checked and held" in out and "VERIFIED" not in out
    assert "partition equal" not in out  # the dense oracle only on request
    assert main(["verify-deletion", str(state), str(cert_path), "--log", str(log),
                 "--oracle"]) == 3
    out = capsys.readouterr().out
    assert "partition equal:     True" in out and "VERIFIED" not in out
    # without the log the commitment (and the other unsigned fields) are the controller's
    # word: exit 3, and the verdict names them with what would check them
    assert main(["verify-deletion", str(state), str(cert_path)]) == 3
    out = capsys.readouterr().out
    assert "VERIFIED" not in out and "UNCHECKED" in out and "commitment" in out
    assert "--log" in out and "--public-key" in out
    # a certificate of an earlier removal does not match the saved state's digest
    cert_path.write_text(certs[0].to_json())
    assert main(["verify-deletion", str(state), str(cert_path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "give its audit log" in out and "--log" in out  # what to do
    # with the log it is checked later, against the chain: every field of the receipt
    # (exit 3: the unsigned log's authenticity is still unchecked)
    assert main(["verify-deletion", str(state), str(cert_path), "--log", str(log)]) == 3
    assert "the receipt later: issued at audit record" in capsys.readouterr().out
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(state.read_bytes()[:100])
    assert main(["verify-deletion", str(bad), str(cert_path)]) == 2
    assert "truncated" in capsys.readouterr().err


@pytest.mark.parametrize("op, field, value", [
    ("extend", "tokens", "abc"), ("extend", "tokens", [1, 2]), ("extend", "tokens", [{"id": "x"}]),
    ("extend", "tokens", [{"id": True, "commitment": "0" * 64}]), ("extend", "tokens", None),
    ("remove", "certificate", []), ("remove", "certificate", "cert"),
    ("remove", "certificate", {"removed_id": [1]}), ("compact", "dropped", 5),
    ("compact", "dropped", [{"id": 1}]), ("compact", "dropped", "12"),
])
def test_rehashed_malformed_records_are_named_by_index(logged, tmp_path, op, field, value):
    _, log, _, _ = logged
    records = verify_log(log).records
    i = next(k for k, r in enumerate(records) if r["op"] == op)
    bad = [dict(r) for r in records]
    bad[i][field] = value
    if op == "remove" and isinstance(value, dict):  # every other field of a real certificate
        bad[i][field] = {**records[i]["certificate"], **value}
    # the forger's tool is sound: re-chaining the untouched records verifies
    assert verify_log(write_records(tmp_path / "rechained.jsonl", records)).ok
    rep = verify_log(write_records(tmp_path / "forged.jsonl", bad))  # never raises
    assert not rep.ok and rep.broken_record == i, rep.error
    assert rep.error.startswith(f"record {i} (line {i + 1}):")


def test_an_edited_and_rehashed_last_record_is_caught_by_its_counts(logged):
    # the last record has no successor whose prev would break: its n and next_id are
    # checked against the replayed operations instead
    _, log, state, _ = logged
    lines = _lines(log)
    for field in ("n", "next_id"):
        rec = json.loads(lines[-1])
        rec[field] += 1
        rec["sha256"] = _self_hash(rec)
        _write(log, lines[:-1] + [canonical(rec)])
        rep = verify_log(log, state)
        assert not rep.ok and rep.broken_record == len(lines) - 1 and field in rep.error
    _write(log, lines)
    assert verify_log(log, state).ok


def test_an_edited_and_rehashed_last_remove_record_is_caught_by_its_counts(tmp_path):
    log = tmp_path / "a.jsonl"
    mem = SVDDMemory(0.1, audit_log=log)
    mem.extend(np.random.default_rng(5).normal(size=(30, 2)))
    mem.remove(mem.partition()["margin"][0])  # the log ends with this remove record
    lines = _lines(log)
    assert json.loads(lines[-1])["op"] == "remove"
    for field in ("n", "next_id"):
        rec = json.loads(lines[-1])
        rec[field] += 7
        rec["sha256"] = _self_hash(rec)
        _write(log, lines[:-1] + [canonical(rec)])
        rep = verify_log(log)
        assert not rep.ok and field in rep.error, rep.error


def _rehashed_log(src: Path, dst: Path, edit) -> None:
    """``src``'s records with ``edit(records)`` applied, the chain re-hashed from the
    first edited record on (an unkeyed chain: anyone can)."""
    import hashlib

    from svattn.exact.records.audit import canonical, record_hash

    recs = [json.loads(line) for line in src.read_text().splitlines()]
    first = edit(recs)
    prev = hashlib.sha256(canonical(recs[first - 1]).encode()).hexdigest()
    for rec in recs[first:]:
        rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        prev = hashlib.sha256(canonical(rec).encode()).hexdigest()
    dst.write_text("".join(canonical(r) + "\n" for r in recs))
    from svattn.exact.records.openings import openings_path

    if openings_path(src).exists():  # the openings, beside it (by record index)
        openings_path(dst).write_bytes(openings_path(src).read_bytes())


# an audit log whose erase (or remove) record lacks its digest, the chain
# re-hashed: verify_chain accepts it, and verify_erasure / verify_deletion --log raised
# KeyError (a traceback); now the missing digest is a mismatch
def test_a_rehashed_log_record_without_its_digest_fails(tmp_path):
    from svattn.exact.auditor.verify import verify_deletion, verify_erasure
    from svattn.exact.records.audit import verify_chain
    from svattn.exact.records.signing import generate_key

    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=generate_key())
    mem.extend(np.random.default_rng(0).normal(size=(20, 2)), tags=["a"] * 3 + ["b"] * 17)
    receipt = mem.erase("a")

    def drop(op):
        def edit(recs):
            k = max(i for i, r in enumerate(recs) if r["op"] == op)
            recs[k].pop("digest")
            return k
        return edit

    _rehashed_log(log, tmp_path / "e.jsonl", drop("erase"))
    assert verify_chain(tmp_path / "e.jsonl").ok
    v = verify_erasure(mem, receipt, log=tmp_path / "e.jsonl", retrain=False)
    assert v.status == "FAILED" and any("state_digest" in r for r in v.reasons)

    mem.extend(np.random.default_rng(1).normal(size=(3, 2)))  # moved on: checked later
    cert = receipt.deletion_certificates()[-1]
    _rehashed_log(log, tmp_path / "r.jsonl", drop("remove"))
    if verify_chain(tmp_path / "r.jsonl").ok:  # (the chain may itself refuse it)
        v = verify_deletion(mem, cert, retrain=False, log=tmp_path / "r.jsonl")
        assert v.status == "FAILED"
