"""Commitments that do not leak (#18 item 4): neither the log nor a receipt holds what
it takes to test a guess of a deleted record; with the controller's key equal data
gives equal commitments (copies and re-entries show), without one they are opaque."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from svattn.exact import SVDDMemory, verify_deletion
from svattn.exact.records.audit import verify_chain
from svattn.exact.records.certificate import KEYED, OPAQUE, commit_token, commitment_key

TAG_KEY = b"controller-tag-key-0123456789abcdef"


def vital_signs(n: int, rng) -> np.ndarray:
    """Quantised readings (heart rate, SpO2): a few hundred possible values each."""
    return np.stack([rng.integers(60, 100, n), rng.integers(90, 100, n)], axis=1).astype(float)


def brute_force(commitment: str, grid, commit_key: bytes | None) -> list:
    return [g for g in grid
            if commit_token(np.array(g, float), None, commit_key)[0] == commitment]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "opaque"])
def test_a_deleted_reading_cannot_be_guessed_from_the_log_or_the_receipt(tmp_path, keyed):
    rng = np.random.default_rng(0)
    x = vital_signs(60, rng)
    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(C=0.1, audit_log=log, tag_key=TAG_KEY if keyed else None)
    ids = mem.extend(x)
    cert = mem.remove(ids[7])
    assert cert.commitment_scheme == (KEYED if keyed else OPAQUE)
    text = log.read_text() + cert.to_json()
    assert "salt" not in text
    grid = list(itertools.product(range(60, 100), range(90, 100)))  # 400 guesses
    # everything an attacker holding the log and the receipt can try finds nothing
    assert brute_force(cert.commitment, grid, None) == []
    assert brute_force(cert.commitment, grid, commitment_key(b"a guessed key" * 3)) == []
    if keyed:  # the controller (or an auditor given the key) can open it
        assert brute_force(cert.commitment, grid, commitment_key(TAG_KEY)) == [tuple(x[7])]
        assert cert.matches_token(x[7], commit_key=commitment_key(TAG_KEY))


def test_the_certificate_repeats_the_add_records_commitment(tmp_path):
    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(C=0.1, audit_log=log)
    ids = mem.extend(np.random.default_rng(1).normal(size=(30, 3)))
    cert = mem.remove(ids[4])
    added = {t["id"]: t["commitment"] for t in verify_chain(log).records[1]["tokens"]}
    assert added[ids[4]] == cert.commitment
    assert verify_deletion(mem, cert, log=log).ok


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "opaque"])
def test_a_copy_under_another_id_fails_verification(keyed):
    x = np.random.default_rng(2).normal(size=(40, 3))
    mem = SVDDMemory(C=0.1, tag_key=TAG_KEY if keyed else None)
    mem.extend(x)
    twin_id = mem.add(x[5])  # the same record ingested again
    cert = mem.remove(5)
    assert cert.live_copies == [twin_id]
    res = verify_deletion(mem, cert, retrain=False)
    assert not res.ok and twin_id in res.copies
    assert any(f"live tokens [{twin_id}]" in r for r in res.reasons)


def test_a_forged_state_commitment_is_caught_with_the_commit_key():
    x = np.random.default_rng(3).normal(size=(40, 3))
    mem = SVDDMemory(C=0.1, tag_key=TAG_KEY)
    mem.extend(x)
    twin_id = mem.add(x[5])
    cert = mem.remove(5)
    # a dishonest controller edits what the memory claims and stores
    cert = dataclasses.replace(cert, live_copies=[])
    mem.solver_state.commitments[mem.solver_state.id_to_slot[twin_id]] = 0
    assert verify_deletion(mem, cert, retrain=False).ok  # nothing left to see without it
    res = verify_deletion(mem, cert, retrain=False, commit_key=commitment_key(TAG_KEY))
    assert not res.ok and res.copies == (twin_id,)


def test_minus_zero_is_the_same_data():
    mem = SVDDMemory(C=0.2, tag_key=TAG_KEY)
    mem.extend(np.random.default_rng(4).normal(size=(20, 2)))
    a = mem.add(np.array([0.0, 1.0]))
    b = mem.add(np.array([-0.0, 1.0]))
    cert = mem.remove(a)
    assert cert.live_copies == [b]
    assert not verify_deletion(mem, cert, retrain=False).ok


def test_reentry_after_erasure_shows_in_the_log(tmp_path):
    log = tmp_path / "audit.jsonl"
    x = np.random.default_rng(5).normal(size=(30, 3))
    mem = SVDDMemory(C=0.1, audit_log=log, tag_key=TAG_KEY)
    mem.extend(x)
    cert = mem.remove(3)
    assert verify_deletion(mem, cert, log=log, retrain=False).ok
    mem.add(x[3])  # the erased record comes back
    res = verify_deletion(mem, cert, log=log, retrain=False)
    assert not res.ok
    assert any("re-entered after its removal" in r for r in res.reasons)


def test_a_certificate_is_checkable_later_from_the_chain(tmp_path):
    log = tmp_path / "audit.jsonl"
    rng = np.random.default_rng(6)
    mem = SVDDMemory(C=0.1, audit_log=log, tag_key=TAG_KEY)
    ids = mem.extend(rng.normal(size=(40, 3)))
    cert = mem.remove(ids[2])
    mem.extend(rng.normal(size=(10, 3)))  # the memory moves on
    mem.remove(ids[9])
    assert not verify_deletion(mem, cert).ok  # the state alone: the digest moved on
    res = verify_deletion(mem, cert, log=log)
    assert res.ok, res.reasons
    assert res.issued_at_record == 2 and res.optimality.ok and "later" in res.summary()
    # a memory that is not the log's end (another history) is refused
    other = SVDDMemory(C=0.1, tag_key=TAG_KEY)
    other.extend(mem.keys)
    res = verify_deletion(other, cert, log=log)
    assert not res.ok and any("not the audit log's end" in r for r in res.reasons)


def test_a_state_older_than_the_log_is_refused_even_where_its_digest_is_the_certificates(
        tmp_path, capsys):
    """The state right after a removal, saved, then the log goes on (a later erase): that
    state is no longer the memory's, and the certificate checked on it with the log fails
    as ``audit verify LOG STATE`` and ``verify_erasure`` do, not VERIFIED."""
    from svattn.cli import main
    from svattn.exact import SVDDMemory as Memory

    log, old = tmp_path / "audit.jsonl", tmp_path / "old.safetensors"
    rng = np.random.default_rng(8)
    mem = SVDDMemory(C=0.1, audit_log=log, tag_key=TAG_KEY)
    ids = mem.extend(rng.normal(size=(40, 3)))
    cert = mem.remove(ids[2])
    mem.save(old)
    mem.remove(ids[5])  # the log goes on past the saved state
    mem.close_audit_log()
    stale = Memory.load(old)
    res = verify_deletion(stale, cert, log=log)
    assert not res.ok and any("not the audit log's end" in r for r in res.reasons)
    cert_path = tmp_path / "cert.json"
    cert_path.write_text(cert.to_json())
    assert main(["verify-deletion", str(old), str(cert_path), "--log", str(log)]) == 1
    assert main(["audit", "verify", str(log), str(old)]) == 1
    capsys.readouterr()


def test_the_cli_checks_copies_with_the_commit_key(tmp_path, capsys):
    from svattn.cli import main
    from svattn.exact.records.signing import write_keypair

    key_path, _ = write_keypair(tmp_path / "controller")
    x = np.random.default_rng(7).normal(size=(40, 3))
    mem = SVDDMemory(C=0.1, signing_key=key_path)
    mem.extend(x)
    twin = mem.add(x[5])
    cert = mem.remove(5)
    mem.solver_state.commitments[mem.solver_state.id_to_slot[twin]] = 0  # a forged state
    cert_path, state = tmp_path / "cert.json", tmp_path / "m.safetensors"
    cert_path.write_text(dataclasses.replace(cert, live_copies=[]).to_json())
    mem.save(state)
    # nothing the state holds shows the copy (exit 3: the unsigned fields unchecked)
    assert main(["verify-deletion", str(state), str(cert_path)]) == 3
    hex_key = tmp_path / "commit.hex"
    hex_key.write_text(commitment_key(mem_tag_key(key_path)).hex())
    for given in (key_path, hex_key):
        assert main(["verify-deletion", str(state), str(cert_path),
                     "--commit-key", str(given)]) == 1
        assert f"live copies:         [{twin}]" in capsys.readouterr().out


def mem_tag_key(key_path) -> bytes:
    from svattn.exact.records.signing import derive_tag_key, load_private_key

    return derive_tag_key(load_private_key(key_path))
