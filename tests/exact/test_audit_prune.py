"""Payload pruning of the audit log: a forgotten subject's entries keep salted commitments
only — no byte of its tokens' ids, commitments, tag hash, certificates or the salts stays
in any log file — while the entries, the checkpoints, the inclusion and consistency proofs
and the verifiers keep working; an edited pruned entry, a forged or deleted opening and a
prune of a subject never forgotten are refused; a prune cut by a crash is finished."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from audit_forger import read_records, write_records
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.records.audit import AuditLog, AuditLogError, prune_log, verify_chain
from svattn.exact.records.merkle import MerkleTree
from svattn.exact.records.note import NoteVerifier
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import write_keypair
from svattn.exact.records.tlog import (
    checkpoint_path,
    consistency_proof_text,
    proof_text,
    verify_consistency_between,
    verify_proof,
)

DATA = Path(__file__).parent / "data"


def _subject_bytes(log: Path, tag_hash: str) -> list[bytes]:
    """Every byte string of the subject's data the log holds before its erase: per token
    its id field, commitment and tag hash, the salts of its openings, its certificates'
    commitments (read from the unpruned log and its openings)."""
    rep = verify_chain(log)
    out = {tag_hash.encode()}
    ids = []
    for r in rep.records:
        for tok in r.get("tokens", []) if r["op"] in ("add", "extend") else []:
            if tok.get("tag") == tag_hash:
                ids.append(tok["id"])
                out.add(tok["commitment"].encode())
    slots = {(r["seq"], k) for r in rep.records if r["op"] in ("add", "extend")
             for k, tok in enumerate(r["tokens"]) if tok.get("tag") == tag_hash}
    for line in openings_path(log).read_text().splitlines():
        o = json.loads(line)
        if tuple(o["at"]) in slots:
            out.add(o["salt"].encode())
            out.add(line.encode())
    return sorted(out), ids


def _log_files(folder: Path, log: Path) -> list[Path]:
    """Every file the log left in its folder (the log, its openings, its checkpoint,
    temporary and rotated files: anything named after it)."""
    return [p for p in folder.iterdir() if p.is_file() and log.name in p.name]


@pytest.fixture
def forgotten(tmp_path):
    """A signed memory: alice's rows in an extend shared with bob and in an add of her
    own, one of them removed alone; a checkpoint kept before the erase; alice erased;
    state saved."""
    key, pub = write_keypair(tmp_path / "ctl")
    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=key)
    rng = np.random.default_rng(3)
    keys = rng.normal(size=(31, 3))
    mem.extend(keys[:30], tags=["bob"] * 10 + ["alice"] * 6 + [None] * 14)
    mem.add(keys[30], tag="alice")
    mem.remove(10)  # one of hers removed on its own before: forgotten with the rest
    tag_hash = next(tok["tag"] for tok in verify_chain(log).records[2]["tokens"])
    before, alice_ids = _subject_bytes(log, tag_hash)
    kept = tmp_path / "kept.checkpoint"
    shutil.copy(checkpoint_path(log), kept)
    receipt = mem.erase("alice")
    mem.save(state)
    mem.close_audit_log()
    (tmp_path / "erasure.json").write_text(receipt.to_json())
    return {"dir": tmp_path, "log": log, "state": state, "pub": pub, "key": key,
            "vkey": Path(f"{tmp_path / 'ctl'}.vkey"), "receipt": receipt, "kept": kept,
            "alice": before, "alice_ids": alice_ids, "alice_keys": keys[10:16].tolist()
            + [keys[30].tolist()], "tag_hash": tag_hash}


def test_forgetting_a_subject_leaves_no_byte_of_its_data_in_any_log_file(forgotten):
    f = forgotten
    assert len(f["alice"]) > 7 * 3  # ids' commitments, the tag, the salts, the lines
    files = _log_files(f["dir"], f["log"])
    assert {p.name for p in files} >= {"audit.jsonl", "audit.jsonl.openings",
                                       "audit.jsonl.checkpoint"}
    receipt = f["receipt"]
    secrets = list(f["alice"]) + [receipt.signature.encode(), receipt.tag_hash.encode()]
    secrets += [c["commitment"].encode() for c in receipt.certificates]
    secrets += [c["signature"].encode() for c in receipt.certificates]
    raw_keys = [np.asarray(k, dtype=np.float64).tobytes() for k in f["alice_keys"]]
    for p in files:
        data = p.read_bytes()
        for s in secrets + raw_keys:
            assert s not in data, (p.name, s[:40])
        for t in f["alice_ids"]:  # no token entry names an erased id
            assert not re.search(rb'"(id|removed_id)":%d\b' % t, data), (p.name, t)
        assert b'"erased_ids"' not in data
    # bob's openings are all still there: his data is not the forgotten subject's
    rep = verify_chain(f["log"])
    assert rep.ok, rep.error
    bob = [t for r in rep.records if r["op"] == "extend" for t in r["tokens"]
           if t.get("tag") and not t.get("pruned")]
    assert len(bob) == 10
    assert rep.n_pruned == 7 + 7 + 1  # 7 tokens, 7 removals, the erase's own subject


def test_a_pruned_log_verifies_with_every_tool(forgotten, capsys):
    f = forgotten
    log, state, vkey = str(f["log"]), str(f["state"]), str(f["vkey"])
    assert main(["audit", "verify", log, state, "--vkey", vkey]) == 0
    out = capsys.readouterr().out
    assert "15 commitments of forgotten subjects pruned" in out and "VERIFIED" in out
    assert main(["verify-erasure", state, str(f["dir"] / "erasure.json"), "--log", log,
                 "--public-key", str(f["pub"])]) == 0, capsys.readouterr().out
    capsys.readouterr()
    # every entry's inclusion proof, and the kept checkpoint's consistency with the new
    rep = verify_chain(f["log"])
    keys = [NoteVerifier.from_string(f["vkey"].read_text().strip())]
    note = checkpoint_path(f["log"]).read_text()
    tree = MerkleTree(rep.leaves)
    for i, entry in enumerate(rep.entries):
        assert verify_proof(proof_text(i, tree.inclusion_path(i), note), entry, keys).size \
            == len(rep.entries)
    old = f["kept"].read_text()
    m = int(old.splitlines()[1])
    verify_consistency_between(old, note, tree.consistency_proof(m), keys)
    assert main(["audit", "consistency", str(f["kept"]), str(checkpoint_path(f["log"])),
                 "--log", log, "--vkey", vkey]) == 0
    erase = next(r["seq"] for r in rep.records if r["op"] == "erase")
    add = next(r["seq"] for r in rep.records if r["op"] == "add")  # alice's, pruned
    proof = f["dir"] / "add.tlog-proof"
    assert main(["audit", "prove", log, str(add), "-o", str(proof)]) == 0
    capsys.readouterr()
    assert main(["audit", "entry", log, str(add)]) == 0
    entry = f["dir"] / "add.entry"
    entry.write_bytes(capsys.readouterr().out.encode())
    assert entry.read_bytes() == rep.entries[add]  # the exact bytes hashed, as written
    assert main(["audit", "check-proof", str(proof), str(entry), "--vkey", vkey]) == 0
    assert main(["audit", "prove", log, "--receipt", str(f["dir"] / "erasure.json")]) == 0
    assert f"index {erase}" in capsys.readouterr().out


def test_go_verifies_the_proofs_of_a_pruned_log(forgotten, go_tlog):
    f = forgotten
    rep = verify_chain(f["log"])
    vkey = f["vkey"].read_text()
    note = checkpoint_path(f["log"]).read_text()
    tree = MerkleTree(rep.leaves)
    pruned = [r["seq"] for r in rep.records if r["op"] in ("extend", "add", "remove", "erase")]
    for i in pruned:
        ok, out = go_tlog.run("proof", vkey, proof_text(i, tree.inclusion_path(i), note),
                              rep.entries[i])
        assert ok, (i, out)
    old = f["kept"].read_text()
    proof = consistency_proof_text(tree.consistency_proof(int(old.splitlines()[1])))
    ok, out = go_tlog.run("consistency", vkey, old, note, proof)
    assert ok, out


def test_an_edited_pruned_entry_is_refused(forgotten, tmp_path, capsys):
    f = forgotten
    lines = f["log"].read_text().splitlines()
    add = next(i for i, line in enumerate(lines) if '"op":"add"' in line)
    # the pruned add's commitment changed and the chain re-hashed: the signed checkpoint
    # no longer matches the tree
    records = [json.loads(line) for line in lines]
    records[add]["tokens"][0] = "0" * 64
    forged = _rechain_entries(records)
    f["log"].write_text(forged)
    assert main(["audit", "verify", str(f["log"]), str(f["state"]), "--vkey",
                 str(f["vkey"])]) == 1
    assert "VERIFIED" not in capsys.readouterr().out
    f["log"].write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", str(f["log"]), str(f["state"]), "--vkey",
                 str(f["vkey"])]) == 0
    capsys.readouterr()


def test_an_erase_that_names_another_subjects_slots_is_refused(forgotten):
    f = forgotten
    lines = f["log"].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    e = next(i for i, r in enumerate(records) if r["op"] == "erase")
    records[e]["erasure"]["ingested_at"][0] = [1, 0]  # bob's first token instead
    f["log"].write_text(_rechain_entries(records))
    rep = verify_chain(f["log"])
    assert not rep.ok and ("did not add" in rep.error or "no erase names it" in rep.error), \
        rep.error


def test_an_opening_forged_or_deleted_is_refused(forgotten):
    f = forgotten
    path = openings_path(f["log"])
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["value"]["tag"] = "ab" * 32  # bob's first token under another subject
    path.write_text("\n".join([json.dumps(first, separators=(",", ":"))] + lines[1:]) + "\n")
    rep = verify_chain(f["log"])
    assert not rep.ok and "does not match its commitment" in rep.error, rep.error
    path.write_text("\n".join(lines[1:]) + "\n")  # bob's opening deleted by hand
    rep = verify_chain(f["log"])
    assert not rep.ok and "no erase names it" in rep.error, rep.error
    path.write_text("\n".join(lines) + "\n")
    assert verify_chain(f["log"]).ok


def test_pruning_a_subject_not_forgotten_is_refused(forgotten, capsys):
    f = forgotten
    rep = verify_chain(f["log"])
    bob = next(t["tag"] for t in rep.records[1]["tokens"] if t.get("tag"))
    before = openings_path(f["log"]).read_bytes()
    with pytest.raises(AuditLogError, match="was not forgotten"):
        prune_log(f["log"], bob)
    assert main(["audit", "prune", str(f["log"]), "--tag-hash", bob]) == 1
    assert "REFUSED" in capsys.readouterr().out
    assert openings_path(f["log"]).read_bytes() == before
    assert main(["audit", "prune", str(f["log"]), "--tag-hash", f["tag_hash"]]) == 0
    assert "nothing to prune" in capsys.readouterr().out
    assert main(["audit", "prune", str(f["log"]), "--tag-hash", "xyz"]) == 2


def test_a_prune_cut_by_a_crash_is_finished(tmp_path, monkeypatch, capsys):
    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, tag_key=b"k" * 32)
    mem.extend(np.random.default_rng(4).normal(size=(20, 2)), tags=["a"] * 4 + ["b"] * 16)
    real = AuditLog.prune_pending
    monkeypatch.setattr(AuditLog, "prune_pending", lambda self, below=None: 0)  # the crash
    mem.erase("a")
    mem.save(state)
    mem.close_audit_log()
    monkeypatch.setattr(AuditLog, "prune_pending", real)
    rep = verify_chain(log)
    assert not rep.ok and "data is not gone" in rep.error and "audit prune" in rep.error
    assert main(["audit", "verify", str(log), str(state)]) == 1
    capsys.readouterr()
    again = tmp_path / "again.jsonl"
    shutil.copy(log, again)
    shutil.copy(openings_path(log), openings_path(again))
    # the command line finishes it ...
    assert main(["audit", "prune", str(log)]) == 0
    assert "pruned 9 opening(s)" in capsys.readouterr().out
    assert verify_chain(log).ok and verify_chain(log).n_pruned == 9
    # ... and so does resuming the log with the memory
    shutil.copy(checkpoint_path(log), checkpoint_path(again))
    n_open = len(openings_path(again).read_text().splitlines())
    mem2 = SVDDMemory.load(state, audit_log=again)
    mem2.close_audit_log()
    assert len(openings_path(again).read_text().splitlines()) == n_open - 9
    assert verify_chain(again).ok


def test_a_version_2_log_still_verifies_and_continues_unpruned(tmp_path, capsys):
    src = DATA / "audit_v2"
    for name in ("audit.jsonl", "audit.jsonl.checkpoint", "state.safetensors"):
        shutil.copy(src / name, tmp_path / name)
    log, state = tmp_path / "audit.jsonl", tmp_path / "state.safetensors"
    rep = verify_chain(log)
    assert rep.ok and rep.version == 2, rep.error
    assert main(["audit", "verify", str(log), str(state)]) == 3  # unsigned: named
    assert main(["verify-erasure", str(state), str(src / "erasure.json"), "--log",
                 str(log)]) == 3
    assert main(["audit", "prune", str(log)]) == 2
    assert "format version 2" in capsys.readouterr().err
    mem = SVDDMemory.load(state, audit_log=log, tag_key=b"fixture tag key 0123")
    mem.erase("bob")  # a version-2 log goes on in its own format: nothing to prune
    mem.close_audit_log()
    rep = verify_chain(log)
    assert rep.ok and rep.version == 2 and rep.records[-1]["op"] == "erase"
    assert not openings_path(log).exists()


def test_the_forgers_tool_round_trips(tmp_path):
    # (the tests that edit logs rely on it: an untouched rewrite verifies)
    clean = tmp_path / "clean.jsonl"
    mem = SVDDMemory(0.3, audit_log=clean, tag_key=b"k" * 32)
    mem.extend(np.eye(4), tags=["x", "y", "x", None])
    mem.remove(3)
    mem.close_audit_log()
    assert verify_chain(write_records(tmp_path / "re.jsonl", read_records(clean))).ok


def _rechain_entries(records: list[dict]) -> str:
    """The entries re-hashed and re-linked as they are (the openings untouched)."""
    import hashlib

    from svattn.exact.records.logverify import canonical, record_hash

    lines, prev = [], "0" * 64
    for rec in records:
        rec = {k: v for k, v in rec.items() if k != "sha256"}
        rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        text = canonical(rec)
        lines.append(text + "\n")
        prev = hashlib.sha256(text.encode()).hexdigest()
    return "".join(lines)


def test_a_certificate_of_a_forgotten_subject_checked_alone_names_its_fields_unchecked(
        forgotten):
    from svattn.exact.auditor.verify import verify_deletion
    from svattn.exact.records.signing import load_public_key

    f = forgotten
    mem = SVDDMemory.load(f["state"])
    cert = f["receipt"].deletion_certificates()[0]
    alone = verify_deletion(mem, cert, retrain=False, log=f["log"])
    assert alone.ok and alone.status == "UNCHECKED", alone.summary()
    assert "commitment" in dict(alone.verdict.unchecked)  # the log no longer holds it
    signed = verify_deletion(mem, cert, log=f["log"],
                             public_key=load_public_key(f["pub"]))
    assert signed.status == "VERIFIED", signed.summary()
    moved = dict(json.loads(cert.to_json()), state_digest="0" * 64)
    from svattn.exact.records.certificate import DeletionCertificate

    wrong = verify_deletion(mem, DeletionCertificate(**moved), retrain=False, log=f["log"])
    assert wrong.status == "FAILED"  # the pruned record's digest still binds its place


def test_migrate_moves_a_version_2_memory_to_a_prunable_log(tmp_path, capsys):
    for name in ("audit.jsonl", "audit.jsonl.checkpoint", "state.safetensors"):
        shutil.copy(DATA / "audit_v2" / name, tmp_path / name)
    log, state = tmp_path / "audit.jsonl", tmp_path / "state.safetensors"
    key, _ = write_keypair(tmp_path / "ctl")
    tag_key = b"fixture tag key 0123"
    (tmp_path / "tag.hex").write_text(tag_key.hex())
    new, out = tmp_path / "new.jsonl", tmp_path / "new.safetensors"
    base = ["audit", "migrate", str(log), "--signing-key", str(key)]
    assert main([*base, "--new-log", str(new)]) == 2  # the three go together
    full = [*base, "--state", str(state), "--new-log", str(new), "--out", str(out)]
    assert main(full) == 2  # the state's tags are under the fixture's tag key
    assert "use the key the state was saved with" in capsys.readouterr().err
    assert not new.exists() and not out.exists()
    assert main([*full, "--tag-key", str(tmp_path / "tag.hex")]) == 0
    assert "format version 3" in capsys.readouterr().out
    rep = verify_chain(new)
    assert rep.ok and rep.version == 3 and verify_chain(log).ok
    mem = SVDDMemory.load(out, audit_log=new, signing_key=key, tag_key=tag_key)
    receipt = mem.erase("bob")  # carried by the new chain's open record, sealed there
    mem.close_audit_log()
    rep = verify_chain(new)
    assert rep.ok and rep.n_pruned == 2 * len(receipt.erased_ids) + 1, rep.error
    for p in _log_files(tmp_path, new):
        assert receipt.tag_hash.encode() not in p.read_bytes(), p.name


def test_an_openings_line_cut_by_a_crash_is_dropped_when_the_log_resumes(tmp_path):
    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.3, audit_log=log, tag_key=b"k" * 32)
    mem.extend(np.eye(3), tags=["a", "b", "a"])
    mem.save(state)
    mem.close_audit_log()
    with open(openings_path(log), "ab") as fh:  # an add's openings, cut before its entry
        fh.write(b'{"at":[3,0],"salt":"00')
    rep = verify_chain(log)
    assert not rep.ok and "incomplete" in rep.error
    mem = SVDDMemory.load(state, audit_log=log, tag_key=b"k" * 32)
    mem.add(np.ones(3), tag="a")
    mem.erase("a")
    mem.close_audit_log()
    rep = verify_chain(log)
    assert rep.ok and rep.n_pruned == 3 * 2 + 1, rep.error
    assert b'"salt":"00' not in openings_path(log).read_bytes()


@pytest.mark.parametrize("pruned", [True, False], ids=["pruned", "prune-cut"])
def test_recovery_after_an_erase_prunes_the_subject_in_both_logs(tmp_path, monkeypatch,
                                                                 pruned):
    from svattn.exact.auditor.recovery import recover

    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, tag_key=b"k" * 32)
    mem.extend(np.random.default_rng(6).normal(size=(24, 2)), tags=["a"] * 5 + ["b"] * 19)
    mem.save(state)
    mem.remove(7)  # b's, on its own
    if not pruned:  # the crash falls between the erase's entry and its prune
        monkeypatch.setattr(AuditLog, "prune_pending", lambda self, below=None: 0)
    receipt = mem.erase("a")
    mem.close_audit_log()  # the process dies before the next save
    monkeypatch.undo()
    new = tmp_path / "new.jsonl"
    again, report = recover(state, log, new, tag_key=b"k" * 32)
    again.close_audit_log()
    assert report.replayed == (7, *receipt.erased_ids)
    assert set(again.ids) == set(mem.ids)
    for path in (log, new):
        rep = verify_chain(path)
        assert rep.ok and rep.n_pruned == 2 * 5 + 1, (path.name, rep.error)
    for p in _log_files(tmp_path, log) + _log_files(tmp_path, new):
        assert receipt.tag_hash.encode() not in p.read_bytes(), p.name


def test_an_erase_by_tag_hash_is_the_erase_by_tag(tmp_path):
    mem = SVDDMemory(0.3, tag_key=b"k" * 32)
    mem.extend(np.random.default_rng(8).normal(size=(12, 2)), tags=["a"] * 3 + ["b"] * 9)
    twin = mem.copy()  # (no keys: a hash needs none)
    by_tag = mem.erase("a")
    with pytest.raises(ValueError, match="one of them"):
        mem.erase("b", tag_hash=by_tag.tag_hash)
    with pytest.raises(ValueError, match="64 hex digits"):
        mem.erase(tag_hash="zz")
    by_hash = twin.erase(tag_hash=by_tag.tag_hash)
    assert by_hash.erased_ids == by_tag.erased_ids
    assert twin.state_digest() == mem.state_digest()


def test_a_log_copied_without_its_openings_says_so(forgotten, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(forgotten["log"], bare / "audit.jsonl")
    assert main(["audit", "verify", str(bare / "audit.jsonl")]) == 1
    assert "audit.jsonl.openings, which holds the openings beside the log, is missing" \
        in capsys.readouterr().out


def test_a_subjects_compacted_tokens_are_pruned_with_it(tmp_path):
    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.05, audit_log=log, tag_key=b"k" * 32)
    x = np.random.default_rng(9).normal(size=(60, 2))
    mem.extend(x, tags=["a", "b"] * 30)
    dropped = mem.compact()  # reserve tokens: some of a's among them
    rep = verify_chain(log)
    a_tag = rep.records[1]["tokens"][0]["tag"]
    gone = [t["id"] for t in rep.records[1]["tokens"] if t["tag"] == a_tag
            and t["id"] not in mem.ids]
    assert gone, dropped  # the case: a token of the subject left by compaction
    mem.erase("a")
    mem.close_audit_log()
    rep = verify_chain(log)
    assert rep.ok and rep.n_pruned == 30 + (30 - len(gone)) + 1, rep.error
    for p in _log_files(tmp_path, log):
        assert a_tag.encode() not in p.read_bytes(), p.name
