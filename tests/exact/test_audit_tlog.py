"""The audit log as a transparency log: signed checkpoints beside the log, entries read back
as the exact bytes hashed, .tlog-proof files for receipts, consistency between
checkpoints, erases bound to what was ingested, and the forgeries of the old hash chain
(an appended fabricated erase, a log edited and re-hashed) refused or named unchecked,
never exit 0. Go's golang.org/x/mod/sumdb verifier checks what it applies to."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from audit_forger import append_record, read_records, write_records
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.auditor.logcheck import check_authenticity
from svattn.exact.records.audit import (
    AuditFacts,
    AuditLog,
    AuditLogError,
    canonical,
    record_hash,
    verify_chain,
)
from svattn.exact.records.certificate import ErasureReceipt
from svattn.exact.records.merkle import MerkleTree, leaf_hash
from svattn.exact.records.note import NoteVerifier
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import load_private_key, write_keypair
from svattn.exact.records.tlog import checkpoint_path, read_checkpoint_unverified

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A signed memory's folder: keys (keygen), log, checkpoint, state, receipts."""
    d = tmp_path_factory.mktemp("signed_log")
    key_path, pub_path = write_keypair(d / "ctl")
    log, state = d / "audit.jsonl", d / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=key_path)
    rng = np.random.default_rng(1)
    ids = mem.extend(rng.normal(size=(30, 3)), tags=["alice"] * 5 + ["bob"] * 20 + [None] * 5)
    shutil.copy(checkpoint_path(log), d / "old.checkpoint")  # an auditor keeps this one
    receipt = mem.erase("alice")
    cert = mem.remove(ids[27])
    mem.save(state)
    mem.close_audit_log()
    (d / "erasure.json").write_text(receipt.to_json())
    (d / "cert.json").write_text(cert.to_json())
    return {"dir": d, "log": log, "state": state, "pub": pub_path,
            "vkey": Path(f"{d / 'ctl'}.vkey"), "key": key_path, "ids": ids}


def _copy(signed, tmp_path) -> dict:
    out = dict(signed)
    for name in ("log", "state"):
        dst = tmp_path / signed[name].name
        shutil.copy(signed[name], dst)
        out[name] = dst
    for path in (checkpoint_path, openings_path):
        shutil.copy(path(signed["log"]), path(out["log"]))
    return out


def _rewrite(log: Path, index: int, edit) -> list[str]:
    """Edit record ``index`` (its openings in place) and re-hash the log, its subject
    fields sealed again (as whoever holds the files can); return the new lines."""
    records = read_records(log)
    edit(records[index])
    write_records(log, records)
    return log.read_text().splitlines()


# ------------------------------------------------------------------ keys and checkpoints
def test_keygen_writes_a_note_verifier_key_of_the_signing_key(signed):
    vkey = NoteVerifier.from_string(signed["vkey"].read_text().strip())
    pub = load_private_key(signed["key"]).public_key()
    assert vkey.public_key == pub.public_bytes_raw()
    assert vkey.name.startswith("svattn.controller/")


def test_the_checkpoint_covers_every_entry_and_the_state_records_its_own(signed):
    rep = verify_chain(signed["log"])
    cp = read_checkpoint_unverified(checkpoint_path(signed["log"]).read_text())
    assert cp.size == len(rep.entries) and cp.root == MerkleTree(rep.leaves).root()
    keys = [NoteVerifier.from_string(signed["vkey"].read_text().strip())]
    auth = check_authenticity(signed["log"], rep, keys, signed["state"])
    assert auth.exit_status == 0 and not auth.unchecked, auth.lines()
    assert any("signed by svattn.controller/" in c for c in auth.checked)


def test_go_opens_the_logs_checkpoint_under_the_keygen_vkey(go_tlog, signed):
    ok, out = go_tlog.run("note", signed["vkey"].read_text(),
                          checkpoint_path(signed["log"]).read_bytes())
    assert ok, out


@pytest.mark.parametrize("keys", [["--vkey", "vkey"], ["--public-key", "pub"]],
                         ids=["vkey", "public-key"])
def test_cli_verify_with_the_key_exits_0_and_without_it_3(signed, keys, capsys):
    flag, name = keys
    assert main(["audit", "verify", str(signed["log"]), str(signed["state"]), flag,
                 str(signed[name])]) == 0
    assert "verdict: VERIFIED" in capsys.readouterr().out
    assert main(["audit", "verify", str(signed["log"]), str(signed["state"])]) == 3
    assert "UNCHECKED: the signature of audit.jsonl.checkpoint" in capsys.readouterr().out


# ------------------------------------------------------------------ entries and proofs
def test_entry_prints_the_exact_bytes_hashed(signed, capsysbinary):
    rep = verify_chain(signed["log"])
    for i in (0, 3, len(rep.entries) - 1):
        assert main(["audit", "entry", str(signed["log"]), str(i)]) == 0
        raw = capsysbinary.readouterr().out
        assert raw == signed["log"].read_bytes().split(b"\n")[i]
        assert leaf_hash(raw) == rep.leaves[i]
    assert main(["audit", "entry", str(signed["log"]), str(len(rep.entries))]) == 2


@pytest.mark.parametrize("receipt", ["cert.json", "erasure.json"])
def test_a_receipts_tlog_proof_verifies_here_and_in_go(go_tlog, signed, receipt, tmp_path,
                                                       capsys):
    proof = tmp_path / "r.tlog-proof"
    assert main(["audit", "prove", str(signed["log"]), "--receipt",
                 str(signed["dir"] / receipt), "-o", str(proof)]) == 0
    index = int(proof.read_text().split("index ", 1)[1].split("\n", 1)[0])
    entry = tmp_path / "entry"
    entry.write_bytes(verify_chain(signed["log"]).entries[index])
    op = json.loads(entry.read_bytes())["op"]
    assert op == ("remove" if receipt == "cert.json" else "erase")
    capsys.readouterr()
    assert main(["audit", "check-proof", str(proof), str(entry), "--vkey",
                 str(signed["vkey"])]) == 0
    ok, out = go_tlog.run("proof", signed["vkey"].read_text(), proof.read_bytes(),
                          entry.read_bytes())
    assert ok, out
    entry.write_bytes(verify_chain(signed["log"]).entries[index - 1])  # another entry
    assert main(["audit", "check-proof", str(proof), str(entry), "--vkey",
                 str(signed["vkey"])]) == 1
    assert "REFUSED (inclusion failed)" in capsys.readouterr().out
    assert not go_tlog.run("proof", signed["vkey"].read_text(), proof.read_bytes(),
                           entry.read_bytes())[0]


def test_consistency_from_a_kept_checkpoint(go_tlog, signed, tmp_path, capsys):
    old, new = signed["dir"] / "old.checkpoint", checkpoint_path(signed["log"])
    proof = tmp_path / "consistency"
    assert main(["audit", "consistency", str(old), str(new), "--log", str(signed["log"]),
                 "--vkey", str(signed["vkey"]), "--proof-out", str(proof)]) == 0
    ok, out = go_tlog.run("consistency", signed["vkey"].read_text(), old.read_bytes(),
                          new.read_bytes(), proof.read_bytes())
    assert ok, out
    assert main(["audit", "consistency", str(old), str(new), "--log",
                 str(signed["log"])]) == 3  # no key: consistent, signatures unchecked


def test_rewritten_history_breaks_consistency_with_a_kept_checkpoint(signed, tmp_path, capsys):
    """The controller rewrites an early record and re-signs the checkpoint (it holds the
    key): an auditor who kept an older checkpoint sees the rewrite."""
    from svattn.exact.records.tlog import CheckpointWriter, controller_signer

    f = _copy(signed, tmp_path)
    lines = _rewrite(f["log"], 1, lambda rec: rec["tokens"][5].update(commitment="0" * 64))
    writer = CheckpointWriter(f["log"], controller_signer(load_private_key(signed["key"])))
    for line in lines:
        writer.add(line.encode())
    writer.write()
    assert main(["audit", "consistency", str(signed["dir"] / "old.checkpoint"),
                 str(checkpoint_path(f["log"])), "--log", str(f["log"]), "--vkey",
                 str(signed["vkey"])]) == 1
    assert "consistency failed" in capsys.readouterr().out


# ------------------------------------------------------------------ forgeries
def test_an_appended_fabricated_erase_is_refused(signed, tmp_path, capsys):
    """The old hash chain's forgery: one erase record appended (no key, chain re-hashed)
    for a subject that never held the ids. Refused (exit 1), with or without a key."""
    f = _copy(signed, tmp_path)
    removed = [int(signed["ids"][27])]  # removed, untagged: never this subject's
    rep = verify_chain(f["log"])
    remove = next(r["seq"] for r in rep.records if r["op"] == "remove"
                  and r["certificate"]["removed_id"] == removed[0])
    append_record(f["log"], {"op": "erase", "erasure": {
        "tag_hash": "ab" * 32, "erased_ids": removed, "ingested_at": [[1, removed[0]]],
        "removed_at": [remove], "signer": None, "signature": None,
        "receipt_sha256": "0" * 64}})
    for keys in ([], ["--vkey", str(signed["vkey"])]):
        assert main(["audit", "verify", str(f["log"]), *keys]) == 1
        assert "never ingested under subject" in capsys.readouterr().out
    assert not verify_chain(f["log"]).ok and rep.ok


def test_a_well_bound_fabricated_erase_is_never_exit_0(signed, tmp_path, capsys):
    """An appended erase that repeats a real one (its ids, ingest slots and removals, its
    subject's opening left out as if pruned): the chain and the bookkeeping hold, and no
    signed checkpoint covers it — named unchecked (exit 3) with or without the key,
    never exit 0."""
    f = _copy(signed, tmp_path)
    alice = [r for r in read_records(f["log"]) if r["op"] == "erase"][0]["erasure"]
    append_record(f["log"], {"op": "erase", "erasure": dict(alice)}, openings=False)
    assert verify_chain(f["log"]).ok
    for keys in ([], ["--vkey", str(signed["vkey"])]):
        status = main(["audit", "verify", str(f["log"]), *keys])
        out = capsys.readouterr().out
        assert status == 3 and "are after the checkpoint" in out, out


def test_a_log_edited_and_rehashed_fails_against_its_signed_checkpoint(signed, tmp_path,
                                                                       capsys):
    f = _copy(signed, tmp_path)
    out_lines = _rewrite(f["log"], 1, lambda rec: rec["tokens"][5].update(commitment="1" * 64))
    assert verify_chain(f["log"]).ok  # the chain alone cannot tell
    for keys in ([], ["--vkey", str(signed["vkey"])]):
        assert main(["audit", "verify", str(f["log"]), *keys]) == 1
        assert "has another root than the log's first" in capsys.readouterr().out
    # and an unsigned checkpoint written over it, with the key given: refused too
    from svattn.exact.records.tlog import CheckpointWriter

    writer = CheckpointWriter(f["log"], None)
    for line in out_lines:
        writer.add(line.encode())
    writer.write()
    assert main(["audit", "verify", str(f["log"]), "--vkey", str(signed["vkey"])]) == 1
    assert main(["audit", "verify", str(f["log"])]) == 3  # no key: unsigned, unchecked


def test_a_removed_checkpoint_fails_with_the_key_and_is_unchecked_without(signed, tmp_path):
    f = _copy(signed, tmp_path)
    checkpoint_path(f["log"]).unlink()
    assert main(["audit", "verify", str(f["log"]), "--vkey", str(signed["vkey"])]) == 1
    assert main(["audit", "verify", str(f["log"])]) == 3


def test_the_state_checkpoint_binds_the_log_prefix(signed, tmp_path, capsys):
    """A log truncated before the state's save point, checkpoint rewritten unsigned: the
    state's signed checkpoint refuses it."""
    f = _copy(signed, tmp_path)
    lines = f["log"].read_text().splitlines()
    f["log"].write_text("\n".join(lines[:3]) + "\n")
    checkpoint_path(f["log"]).unlink()
    assert main(["audit", "verify", str(f["log"]), str(f["state"]), "--vkey",
                 str(signed["vkey"])]) == 1


# ------------------------------------------------------------------ writer and reader
def _facts(n=0, next_id=0):
    return AuditFacts(digest="d" * 64, n=n, next_id=next_id, n_refactorizations=0,
                      n_resolves=0, n_drift_refactorizations=0, kkt_residual=0.0)


def test_the_writer_refuses_an_erase_of_ids_never_ingested_under_the_subject(tmp_path):
    log = AuditLog.create(tmp_path / "a.jsonl", {"C": 0.5}, _facts())
    log.record(_facts(2, 2), "extend", ids=[0, 1], commitments=["c" * 64] * 2,
               tags=[bytes(32), bytes.fromhex("aa" * 32)])
    receipt = ErasureReceipt(tag_hash="bb" * 32, erased_ids=[1], certificates=[],
                             copies_kept={}, state_digest="d" * 64, n_after=1)
    with pytest.raises(AuditLogError, match="never ingested under subject"):
        log.record(_facts(1, 2), "erase", receipt=receipt)
    log.close()


def test_a_failed_operation_leaves_the_checkpoint_at_the_log(tmp_path):
    log_path = tmp_path / "a.jsonl"
    log = AuditLog.create(log_path, {"C": 0.5}, _facts())
    mark = log.mark()
    log.record(_facts(1, 1), "add", ids=[0], commitments=["c" * 64], tags=None)
    assert read_checkpoint_unverified(checkpoint_path(log_path).read_text()).size == 2
    log.rollback(mark)
    rep = verify_chain(log_path)
    cp = read_checkpoint_unverified(checkpoint_path(log_path).read_text())
    assert (cp.size, cp.root) == (1, MerkleTree(rep.leaves).root())
    log.close()


def test_load_refuses_a_state_whose_checkpoint_is_not_of_its_log(signed, tmp_path):
    f = _copy(signed, tmp_path)
    other = tmp_path / "other.jsonl"
    mem = SVDDMemory(0.2, audit_log=other)
    mem.extend(np.eye(3))
    mem.close_audit_log()
    with pytest.raises(AuditLogError):
        SVDDMemory.load(f["state"], audit_log=other, signing_key=signed["key"])
    again = SVDDMemory.load(f["state"], audit_log=f["log"], signing_key=signed["key"])
    again.close_audit_log()
    cp = read_checkpoint_unverified(checkpoint_path(f["log"]).read_text())
    assert cp.size == len(verify_chain(f["log"]).entries)  # the load record covered


def test_a_version_1_log_still_verifies_and_names_its_authenticity_unchecked(tmp_path,
                                                                             capsys):
    src = DATA / "audit_v1"
    rep = verify_chain(src / "audit.jsonl")
    assert rep.ok and rep.version == 1
    assert main(["audit", "verify", str(src / "audit.jsonl"), str(src / "state.safetensors")]) \
        == 3
    out = capsys.readouterr().out
    assert "OK:" in out and "as in every version-1 log" in out
    # its erase is still checked against what it ingested
    log = tmp_path / "a.jsonl"
    lines = (src / "audit.jsonl").read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"op":"erase"' in line)
    rec = json.loads(lines[k])
    rec["erasure"]["tag_hash"] = "cd" * 32
    rec["sha256"] = record_hash(rec)
    lines[k] = canonical(rec)
    log.write_text("\n".join(lines[:k + 1]) + "\n")
    assert "never ingested under subject" in verify_chain(log).error


def test_an_erasure_receipt_round_trips_from_a_recovered_chain(signed, tmp_path):
    """A chain that continues a state carries its subjects, so an erase after recovery is
    bound to them too."""
    f = _copy(signed, tmp_path)
    mem = SVDDMemory.load(f["state"], signing_key=signed["key"])
    mem.attach_audit_log(tmp_path / "new.jsonl")
    receipt = mem.erase("bob")
    mem.close_audit_log()
    rep = verify_chain(tmp_path / "new.jsonl")
    assert rep.ok, rep.error
    erase = [r for r in rep.records if r["op"] == "erase"][0]["erasure"]
    assert [a[0] for a in erase["ingested_at"]] == [0] * len(receipt.erased_ids)
    assert erase["pruned"] and replace(receipt).sha256() == erase["receipt_sha256"]


def test_a_receipt_and_its_log_edited_together_are_never_verified(signed, tmp_path, capsys):
    """The receipt and the log's record of it edited alike, the chain re-hashed: the log's
    signed checkpoint (and the state's) no longer match it — refused with the key, named
    unchecked without it."""
    f = _copy(signed, tmp_path)
    cert = json.loads((signed["dir"] / "cert.json").read_text())
    cert["n_events"] = cert["n_events"] + 1
    edited = tmp_path / "cert.json"
    edited.write_text(json.dumps(cert))
    seq = next(r["seq"] for r in verify_chain(f["log"]).records if r["op"] == "remove"
               and r["certificate"]["removed_id"] == cert["removed_id"])
    _rewrite(f["log"], seq, lambda rec: rec["certificate"].update(n_events=cert["n_events"]))
    base = ["verify-deletion", str(f["state"]), str(edited), "--log", str(f["log"])]
    assert main([*base, "--public-key", str(signed["pub"])]) == 1
    out = capsys.readouterr().out
    assert "audit log FAILED" in out and "VERIFIED" not in out
    # without any key (the receipt's signature unchecked): the checkpoints' roots refuse it
    assert main(base) == 1
    out = capsys.readouterr().out
    assert "has another root than the log's first" in out and "VERIFIED" not in out


def test_migrate_gives_a_version_1_log_a_signed_checkpoint(signed, tmp_path, capsys):
    for name in ("audit.jsonl", "state.safetensors"):
        shutil.copy(DATA / "audit_v1" / name, tmp_path / name)
    log, state = tmp_path / "audit.jsonl", tmp_path / "state.safetensors"
    assert main(["audit", "migrate", str(log), "--signing-key", str(signed["key"])]) == 0
    capsys.readouterr()
    assert main(["audit", "verify", str(log), "--public-key", str(signed["pub"])]) == 3
    out = capsys.readouterr().out  # signed now; without STATE its end is unchecked
    assert "audit.jsonl.checkpoint is signed by svattn.controller/" in out
    assert "UNCHECKED: the log's end" in out and "FAILED" not in out
    assert main(["audit", "migrate", str(log), "--signing-key", str(signed["key"])]) == 2
    # the state was saved before checkpoints: named, never a bare VERIFIED
    capsys.readouterr()
    assert main(["audit", "verify", str(log), str(state), "--public-key",
                 str(signed["pub"])]) == 3
    assert "records no checkpoint" in capsys.readouterr().out


# ------------------------------------------------------------------ the Python API
def _verify_cert(f, **kw):
    from svattn.exact.auditor.verify import verify_deletion
    from svattn.exact.records.certificate import DeletionCertificate

    mem = SVDDMemory.load(f["state"])
    cert = DeletionCertificate.from_json((f["dir"] / "cert.json").read_text())
    return verify_deletion(mem, cert, log=f["log"], **kw)


def test_verify_deletion_checks_the_logs_signed_checkpoint(signed, tmp_path):
    """verify_deletion(..., log=) reads the log's checkpoint as the command line does:
    VERIFIED only with the controller's key; without it the checkpoint's signature is
    named unchecked (it said VERIFIED)."""
    f = _copy(signed, tmp_path)
    v = _verify_cert(f, public_key=signed["pub"])
    assert v.status == "VERIFIED", v.summary()
    v = _verify_cert(f)
    assert v.ok and v.status == "UNCHECKED" and not v.verdict.unchecked, v.summary()
    assert "the signature of audit.jsonl.checkpoint" in v.verdict.authenticity_line()
    assert "authenticity UNCHECKED" in v.summary()


def test_verify_deletion_over_an_unsigned_log_is_never_verified(tmp_path):
    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.2, audit_log=log)
    ids = mem.extend(np.random.default_rng(2).normal(size=(20, 3)))
    cert = mem.remove(ids[3])
    from svattn.exact.auditor.verify import verify_deletion

    v = verify_deletion(mem, cert, log=log)
    assert v.ok and v.status == "UNCHECKED", v.summary()
    assert "is unsigned" in v.verdict.authenticity_line()
    assert v.exit_status == 3


def test_verify_deletion_refuses_a_log_co_edited_with_its_receipt(signed, tmp_path):
    """The receipt and its log record edited alike, the chain re-hashed: the Python API
    said VERIFIED without a key (the chain alone cannot tell); the checkpoint's root
    refuses it now, with or without the key."""
    f = _copy(signed, tmp_path)
    cert = json.loads((signed["dir"] / "cert.json").read_text())
    cert["n_events"] += 1
    (tmp_path / "cert.json").write_text(json.dumps(cert))
    seq = next(r["seq"] for r in verify_chain(f["log"]).records if r["op"] == "remove"
               and r["certificate"]["removed_id"] == cert["removed_id"])
    _rewrite(f["log"], seq, lambda rec: rec["certificate"].update(n_events=cert["n_events"]))
    f["dir"] = tmp_path
    for kw in ({}, {"public_key": signed["pub"]}):
        v = _verify_cert(f, **kw)
        assert not v.ok and v.status == "FAILED", v.summary()
        assert "the log's authenticity" in v.verdict.failed
        assert any("has another root" in r for r in v.reasons)


# ------------------------------------------------------------------ the log's key name
def test_a_checkpoint_is_signed_under_the_logs_origin_and_the_controllers_name(
        go_tlog, signed, capsys):
    """C2SP: the log's key name SHOULD be its origin. Each checkpoint carries the
    controller's signature under the origin (first) and under the controller's name, so
    keygen's one .vkey and the log's own (svattn audit vkey) both open it, in Go too."""
    from svattn.exact.records.note import parse_note

    note = checkpoint_path(signed["log"]).read_text()
    cp = read_checkpoint_unverified(note)
    names = [sig.name for sig in parse_note(note).signatures]
    assert names[0] == cp.origin and names[1].startswith("svattn.controller/")
    assert main(["audit", "vkey", str(signed["log"]), "--public-key", str(signed["pub"])]) == 0
    vkey = capsys.readouterr().out.strip()
    assert vkey.startswith(cp.origin + "+")
    for key in (vkey, signed["vkey"].read_text()):
        ok, out = go_tlog.run("note", key, note.encode())
        assert ok, out
    assert main(["audit", "verify", str(signed["log"]), str(signed["state"]), "--vkey",
                 str(signed["vkey"])]) == 0


def test_a_checkpoint_signed_under_the_controllers_name_alone_still_verifies(signed,
                                                                           tmp_path):
    """Logs written before the origin-named signature: their checkpoints (and the ones
    their states record) carry the controller's name only, and verify as before."""
    from svattn.exact.records.note import sign_note
    from svattn.exact.records.tlog import controller_signer

    f = _copy(signed, tmp_path)
    file = checkpoint_path(f["log"])
    body = read_checkpoint_unverified(file.read_text()).body()
    file.write_text(sign_note(body, [controller_signer(load_private_key(signed["key"]))]))
    rep = verify_chain(f["log"])
    keys = [NoteVerifier.from_string(signed["vkey"].read_text().strip())]
    auth = check_authenticity(f["log"], rep, keys)
    assert auth.exit_status == 0, auth.lines()
