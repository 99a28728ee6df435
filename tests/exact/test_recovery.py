"""Recovery after a crash between logged operations and the next save."""

from __future__ import annotations

import json

import numpy as np
import pytest

from svattn.exact import SVDDMemory, verify_deletion
from svattn.exact.auditor.recovery import recover
from svattn.exact.auditor.verify import verify_log
from svattn.exact.records.audit import AuditLogError


@pytest.fixture
def crashed(tmp_path):
    """A memory saved, then removals, adds, a compaction and more removals logged, then
    the process dies before the next save."""
    rng = np.random.default_rng(21)
    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.05, audit_log=log)
    ids = mem.extend(rng.normal(size=(80, 3)))
    mem.remove(ids[0])
    mem.save(state)
    first = mem.partition()["margin"][0]
    erased = [first] + [t for t in ids[5:12] if t != first][:2]
    for t in erased:
        mem.remove(t)
    added = mem.extend(rng.normal(size=(3, 3)))
    mem.remove(added[1])  # an id the saved state never held
    mem.close_audit_log()  # what the dying process's kernel does with its lock
    return state, log, tmp_path, erased, added, mem


def test_the_old_chain_cannot_continue_and_recovery_replays_the_erasures(crashed):
    state, log, tmp, erased, added, lost_mem = crashed
    with pytest.raises(AuditLogError, match="resurrect"):
        SVDDMemory.load(state, audit_log=log)
    mem, report = recover(state, log, tmp / "new.jsonl")
    assert report.replayed == tuple(erased) and not set(erased) & set(mem.ids)
    assert report.lost_adds == tuple(added) and report.moot == (added[1],)
    assert len(report.certificates) == 3 and not report.torn_tail
    assert verify_deletion(mem, report.certificates[-1]).ok
    # the recovered memory equals the lost one minus what was added after the save
    twin = lost_mem.copy()  # (the dead process's memory, without its closed log)
    for t in added:
        if t in twin.ids:
            twin.remove(t)
    assert mem.ids == twin.ids
    np.testing.assert_allclose(mem.alpha, twin.alpha, rtol=0, atol=1e-12)
    # the new chain cites the state and the old log, and continues
    mem.add(np.zeros(3))
    new_state = tmp / "m2.safetensors"
    mem.save(new_state)
    rep = verify_log(tmp / "new.jsonl", new_state)
    assert rep.ok, rep.error
    cites = rep.records[0]["continues"]
    old = verify_log(log)
    assert cites["log_last_record"] == {"seq": old.n_records - 1, "sha256": old.hashes[-1]}
    assert cites["state_record"] == report.state_record
    assert [r["op"] for r in rep.records[1:4]] == ["remove"] * 3
    assert "3 removals replayed, 3 tokens added after the save lost" in report.summary()
    # the old state still holds the replayed removals' tokens: recovery says so
    assert f"old state file still holds the 3 tokens removed again (ids " \
        f"{list(report.replayed)}): delete it" in report.summary()


def test_a_line_cut_by_the_crash_is_read_past(crashed):
    state, log, tmp, erased, _, _ = crashed
    with open(log, "ab") as f:
        f.write(b'{"op":"remove","seq":')  # the write the crash cut
    assert not verify_log(log).ok
    mem, report = recover(state, log, tmp / "new.jsonl")
    assert report.torn_tail and report.replayed == tuple(erased)


def test_recovery_refuses_a_state_of_another_log_or_a_broken_log(crashed, tmp_path):
    state, log, tmp, _, _, _ = crashed
    other_log = tmp / "other.jsonl"
    other = SVDDMemory(0.5, audit_log=other_log)
    other.extend(np.eye(3))
    other.close_audit_log()
    with pytest.raises(AuditLogError, match="was not saved with the log"):
        recover(state, other_log, tmp / "new.jsonl")
    lines = log.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["n"] = 999
    log.write_text("".join(x + "\n" for x in lines[:2] + [json.dumps(rec)] + lines[3:]))
    with pytest.raises(AuditLogError, match="does not verify"):
        recover(state, log, tmp / "new2.jsonl")
    assert not (tmp / "new2.jsonl").exists()
    bare = tmp / "bare.safetensors"
    SVDDMemory(0.5).save(bare)
    with pytest.raises(AuditLogError, match="without an audit log"):
        recover(bare, other_log, tmp / "new3.jsonl")


def test_cli_recover(crashed, capsys):
    from svattn.cli import main

    state, log, tmp, erased, _, _ = crashed
    new_log, out = tmp / "new.jsonl", tmp / "recovered.safetensors"
    args = ["recover", str(state), str(log), "--new-log", str(new_log), "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "3 removals replayed" in text and "lost (added after the save" in text
    assert verify_log(new_log, out).ok
    assert not set(erased) & set(SVDDMemory.load(out).ids)
    assert main(args) == 2  # never overwrites
    assert "recovery writes new files only" in capsys.readouterr().err
    other = tmp / "other.jsonl"
    other.write_text("not a log\n")
    assert main(["recover", str(state), str(other), "--new-log", str(tmp / "n2.jsonl"),
                 "--out", str(tmp / "o2.safetensors")]) == 2
    assert "does not verify" in capsys.readouterr().err


def test_recovery_refuses_an_older_state_relabelled_with_a_later_head(tmp_path):
    # an attacker edits an older state's audit head to point after a removal: the
    # removal would then not be replayed and the token would come back
    from safetensors.numpy import load as st_load

    from svattn.exact.records.fileformat import parse_header, read_metadata, serialize

    log, old, new = tmp_path / "a.jsonl", tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    mem = SVDDMemory(0.1, audit_log=log)
    mem.extend(np.random.default_rng(6).normal(size=(30, 2)))
    mem.save(old)
    mem.remove(3)
    mem.save(new)
    mem.close_audit_log()
    head_new = read_metadata(parse_header(new.read_bytes(), "n")[0], "n")["audit_head"]
    data = old.read_bytes()
    meta = read_metadata(parse_header(data, "o")[0], "o")
    meta["audit_head"] = head_new
    forged = tmp_path / "forged.safetensors"
    forged.write_bytes(serialize(st_load(data), meta))  # checksums recomputed
    with pytest.raises(AuditLogError, match="not the state saved there"):
        recover(forged, log, tmp_path / "n.jsonl")


def test_recovery_waits_for_no_writer(crashed, tmp_path):
    state, log, tmp, _, _, _ = crashed
    from svattn.exact.records.audit import lock_log

    fd = lock_log(log)  # another memory still writes the log
    try:
        with pytest.raises(AuditLogError, match="being written by another memory"):
            recover(state, log, tmp / "new.jsonl")
    finally:
        import os

        os.close(fd)
