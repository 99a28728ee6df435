"""Deletion certificates: contents, JSON round trip, verification against retraining."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from svattn.exact import DeletionCertificate, SVDDMemory, verify_deletion
from svattn.exact.records.certificate import commitment_key

TAG_KEY = b"certificate-tests-tag-key-0123456"


@pytest.fixture
def memory_and_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 5))
    V = rng.normal(size=(150, 2))
    mem = SVDDMemory(0.03, tag_key=TAG_KEY)
    mem.extend(X, V)
    return mem, X, V


def test_certificate_contents(memory_and_data):
    mem, X, V = memory_and_data
    victim = mem.partition()["margin"][0]
    before = {k: len(v) for k, v in mem.partition().items()}
    cert = mem.remove(victim)
    assert cert.removed_id == victim
    assert cert.partition_before == before
    assert sum(cert.partition_after.values()) == sum(before.values()) - 1
    assert cert.kkt_residual_after <= 1e-10
    assert cert.n_events >= 1 and cert.unique_optimum
    assert cert.state_digest == mem.state_digest()
    assert cert.matches_token(X[victim], V[victim], commit_key=commitment_key(TAG_KEY))
    assert not cert.matches_token(X[victim + 1], V[victim + 1],
                                  commit_key=commitment_key(TAG_KEY))
    assert cert.consistency_errors() == []
    # the certificate never carries the data itself
    text = cert.to_json()
    for number in np.r_[X[victim], V[victim]]:
        assert repr(float(number)) not in text


def test_json_round_trip(memory_and_data):
    mem, _, _ = memory_and_data
    cert = mem.remove(3)
    again = DeletionCertificate.from_json(cert.to_json())
    assert again == cert


def test_a_removal_issues_an_ordinary_frozen_certificate(memory_and_data):
    # removals build certificates without the dataclass __init__ (a hot path)
    mem, X, V = memory_and_data
    cert = mem.remove(5)
    fields = dataclasses.asdict(cert)
    assert cert == DeletionCertificate(**fields)
    assert set(vars(cert)) == {f.name for f in dataclasses.fields(DeletionCertificate)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cert.n_events = 0
    assert cert.version == DeletionCertificate.version
    assert cert.issued_at.endswith("+00:00") and len(cert.issued_at) == 25
    assert cert.matches_token(X[5], V[5], commit_key=commitment_key(TAG_KEY))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.pop("commitment"), "missing fields"),
        (lambda d: d.update(extra=1), "unknown fields"),
        (lambda d: d.update(version=99), "version 99 is not supported"),
    ],
)
def test_from_json_rejects_bad_input(memory_and_data, edit, match):
    mem, _, _ = memory_and_data
    data = json.loads(mem.remove(4).to_json())
    edit(data)
    with pytest.raises(ValueError, match=match):
        DeletionCertificate.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="not valid JSON"):
        DeletionCertificate.from_json("{")


@pytest.mark.parametrize("which", ["margin", "error", "reserve"])
def test_verify_deletion_against_retrain(memory_and_data, which):
    mem, _, _ = memory_and_data
    victim = mem.partition()[which][0]
    cert = mem.remove(victim)
    report = verify_deletion(mem, cert, oracle=True)
    assert report.ok, report.summary()
    assert report.partition_equal
    assert report.max_alpha_dev <= 1e-9
    assert report.decision_dev <= 1e-9 and report.readout_dev <= 1e-9
    # the state alone binds neither the commitment nor the id: never a bare VERIFIED
    assert report.status == "UNCHECKED" and report.exit_status == 3
    assert report.summary().startswith("UNCHECKED") and "commitment" in report.summary()


def test_verification_catches_a_stale_or_forged_certificate(memory_and_data):
    mem, _, _ = memory_and_data
    cert = mem.remove(mem.partition()["margin"][0])
    mem.add(np.zeros(5), np.zeros(2))  # the memory moved on: the digest no longer matches
    report = verify_deletion(mem, cert, retrain=False)
    assert not report.ok and not report.digest_matches
    forged = dataclasses.replace(cert, removed_id=mem.ids[0], state_digest=mem.state_digest())
    report = verify_deletion(mem, forged, retrain=False)
    assert not report.ok and not report.removed_absent


def test_verification_detects_a_memory_that_is_not_the_optimum(memory_and_data):
    mem, _, _ = memory_and_data
    cert = mem.remove(mem.partition()["margin"][0])
    # corrupt the solution behind the memory's back (what a buggy solver would do)
    slot = mem.solver_state.id_to_slot[mem.partition()["margin"][0]]
    mem.solver_state.alpha[slot] += 1e-4
    mem.solver_state.g_valid = False
    report = verify_deletion(mem, cert)  # the proof from the keys sees it
    assert not report.ok
    assert any(r.startswith("KKT residual") for r in report.reasons), report.reasons
    assert report.optimality is not None and report.optimality.kkt_residual >= 1e-5
    report = verify_deletion(mem, cert, oracle=True)  # and so does the dense re-solve
    assert not report.ok
    assert report.max_alpha_dev >= 1e-5


def test_non_unique_optimum_is_reported():
    X = np.random.default_rng(2).normal(size=(60, 3))
    mem = SVDDMemory(0.05)
    mem.extend(X)
    mem.extend(mem.keys[[mem.ids.index(t) for t in mem.support_ids()[:3]]])  # duplicates
    cert = mem.remove(10)
    assert not cert.unique_optimum
    report = verify_deletion(mem, cert, oracle=True)
    assert report.ok, report.reasons  # an optimum, proven, though not the only one
    assert not report.unique_optimum and not report.optimality.unique
    assert "equal keys" in report.optimality.uniqueness
    assert "NOT unique" in report.summary()
    assert report.decision_dev <= 1e-9  # the decision function is unique regardless


# ---------------------------------------------------------------- tampering
def _removed_memory(tmp_path=None):
    rng = np.random.default_rng(11)
    log = None if tmp_path is None else tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.05, audit_log=log)
    ids = mem.extend(rng.normal(size=(90, 3)))
    cert = mem.remove(mem.partition()["margin"][0])
    return mem, cert, ids, log


# every field of a real certificate, edited to a well-formed but false value; the
# words the verifier's reason must contain (it names the field)
_EDITS = [
    ("removed_id", 10_000, "never added"), ("removed_id", "live", "still in the memory"),
    ("C", 0.06, "C:"), ("kernel", "exp", "kernel:"), ("gamma", 0.123, "gamma:"),
    ("kkt_residual_after", 0.02, "kkt_residual_after:"),
    ("partition_after", {"margin": 1, "error": 1, "reserve": 87}, "partition_after:"),
    ("partition_before", {"margin": 1, "error": 1, "reserve": 87}, "sizes do not drop"),
    ("unique_optimum", "flip", "unique_optimum:"), ("state_digest", "0" * 64, "state_digest"),
    ("compacted", 5, "compacted:"),
]


@pytest.mark.parametrize("field, value, words", _EDITS, ids=[f"{e[0]}={e[1]}" for e in _EDITS])
def test_an_edited_certificate_fails_and_names_the_field(field, value, words):
    mem, cert, ids, _ = _removed_memory()
    assert verify_deletion(mem, cert).ok
    if value == "live":
        value = ids[1]
    if value == "flip":
        value = not cert.unique_optimum
    forged = dataclasses.replace(cert, **{field: value})
    v = verify_deletion(mem, forged)
    assert not v.ok and any(words in r for r in v.reasons), v.reasons


@pytest.mark.parametrize("field, value", [
    ("commitment", "ab" * 32), ("commitment_scheme", "hmac-sha256"), ("n_events", 99),
    ("issued_at", "2020-01-01T00:00:00")])
def test_edits_of_what_the_state_cannot_confirm_are_caught_by_the_log(tmp_path, field, value):
    # a commitment describes data the verifier does not hold: the state alone
    # cannot tell an edited one from the real one, the hash-chained log can
    mem, cert, _, log = _removed_memory(tmp_path)
    forged = dataclasses.replace(cert, **{field: value})
    assert verify_deletion(mem, forged).ok  # (documented: the state cannot confirm it)
    assert verify_deletion(mem, cert, log=log).ok
    v = verify_deletion(mem, forged, log=log)
    assert not v.ok and v.logged is False and any(field in r for r in v.reasons), v.reasons


@pytest.mark.parametrize("field, value, words", [
    ("commitment_scheme", "md5", "commitment_scheme must be"),
    ("live_copies", "none", "live_copies must be"), ("commitment", "12", "commitment must be"),
    ("removed_id", "7", "removed_id must be"), ("C", "0.05", "C must be"),
    ("kkt_residual_after", None, "kkt_residual_after must be"),
    ("unique_optimum", "yes", "unique_optimum must be"), ("kernel", 3, "kernel must be"),
    ("partition_after", [1, 2, 3], "partition_after must"),
])
def test_a_malformed_certificate_is_refused_with_the_field_named(field, value, words):
    mem, cert, _, _ = _removed_memory()
    data = json.loads(cert.to_json())
    data[field] = value
    with pytest.raises(ValueError, match=words):
        DeletionCertificate.from_json(json.dumps(data))
    v = verify_deletion(mem, dataclasses.replace(cert, **{field: value}))  # built by hand
    assert not v.ok and any(words in r for r in v.reasons)


def test_a_record_ingested_twice_is_not_erased_by_removing_one_copy():
    rng = np.random.default_rng(12)
    mem = SVDDMemory(0.05)
    X, V = rng.normal(size=(80, 3)), rng.normal(size=(80, 2))
    mem.extend(X, V)
    twin = mem.add(X[5], V[5])  # the same record again, under id 80
    cert = mem.remove(5)
    v = verify_deletion(mem, cert)
    assert not v.ok and v.copies == (twin,)
    assert any(f"live tokens [{twin}]" in r for r in v.reasons)
    mem.remove(twin)  # now both are gone: the first certificate's data is erased too
    assert verify_deletion(mem, mem.remove(mem.ids[0]), retrain=False).copies == ()


def test_the_cli_refuses_malformed_certificates_with_exit_2(tmp_path, capsys):
    from svattn.cli import main

    mem, cert, _, log = _removed_memory(tmp_path)
    state = tmp_path / "m.safetensors"
    mem.save(state)
    good = tmp_path / "cert.json"
    good.write_text(cert.to_json())
    # (an unsigned log: its authenticity is named unchecked)
    assert main(["verify-deletion", str(state), str(good), "--log", str(log)]) == 3
    assert "in the audit log:    True" in capsys.readouterr().out
    cases = [("commitment_scheme", "zz"), ("C", "x"), ("removed_id", None), ("partition_after", 3)]
    for field, value in cases:
        data = json.loads(cert.to_json())
        data[field] = value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        assert main(["verify-deletion", str(state), str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"{field} must" in err and "Traceback" not in err
    for path, words in [(tmp_path, "is a directory"), (tmp_path / "none.json", "no such file")]:
        assert main(["verify-deletion", str(state), str(path)]) == 2
        assert words in capsys.readouterr().err
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert main(["verify-deletion", str(state), str(binary)]) == 2
    forged = dataclasses.replace(cert, C=0.5)
    good.write_text(forged.to_json())
    assert main(["verify-deletion", str(state), str(good)]) == 1
    assert "C: the certificate says 0.5" in capsys.readouterr().out


def test_forgets_beside_near_copies_end_exact_and_their_certificates_verify():
    # keys 2.5e-7 apart (rbf, gamma = 1): kernel distances of ~1e-13, merged as copies,
    # yet their g differ by ~3e-8. The re-solve used to split each group in id order and
    # left the residual above tol (up to 1.8e-8, the verifier recomputing it from the
    # keys); each group is now split by its members' own g: every forget ends exact, and
    # the verifier agrees with every claim, uniqueness included
    for seed in range(12):
        rng = np.random.default_rng(seed)
        base = rng.normal(size=(30, 3))
        X = np.concatenate([base, base[:10] + 2.5e-7 * rng.normal(size=(10, 3))])
        mem = SVDDMemory(0.1, gamma=1.0)
        ids = mem.extend(X[rng.permutation(len(X))])
        for t in ids[:4]:
            cert = mem.remove(t)
            assert cert.kkt_residual_after <= mem.tol
            v = verify_deletion(mem, cert)
            assert v.unique_optimum == cert.unique_optimum
            assert v.reasons == (), v.reasons


# ---------------------------------------------------------------- signatures
def test_signed_receipts_fail_on_any_edited_byte(tmp_path):
    from svattn.exact.records.signing import generate_key

    key = generate_key()
    rng = np.random.default_rng(13)
    mem = SVDDMemory(0.1, signing_key=key)
    mem.extend(rng.normal(size=(40, 2)))
    cert = mem.remove(mem.partition()["margin"][0])
    public = key.public_key()  # all a third party needs
    assert cert.signature is not None and verify_deletion(mem, cert, public_key=public).ok
    text = cert.to_json()
    caught = 0
    for i in range(len(text)):
        for c in ("0", "9", "x"):
            if text[i] == c:
                continue
            edited = text[:i] + c + text[i + 1:]
            try:
                forged = DeletionCertificate.from_json(edited)
            except ValueError:
                caught += 1  # malformed: refused before any check
                continue
            v = verify_deletion(mem, forged, retrain=False, public_key=public)
            assert not v.ok, (i, c, edited[max(0, i - 20): i + 20])
            caught += 1
    assert caught >= 2 * len(text)
    other = generate_key().public_key()
    v = verify_deletion(mem, cert, retrain=False, public_key=other)
    assert not v.ok and any("signed by another key" in r for r in v.reasons)
    unsigned = SVDDMemory(0.1)
    unsigned.extend(rng.normal(size=(40, 2)))
    v = verify_deletion(unsigned, unsigned.remove(3), retrain=False, public_key=public)
    assert not v.ok and any("not signed" in r for r in v.reasons)


def test_the_signing_key_never_travels_with_the_memory(tmp_path):
    import pickle

    from svattn.exact.records.signing import write_keypair

    key_path, pub_path = write_keypair(tmp_path / "controller")
    assert oct(key_path.stat().st_mode & 0o777) == "0o600"
    mem = SVDDMemory(0.1, signing_key=key_path)
    mem.extend(np.random.default_rng(14).normal(size=(30, 2)))
    state = tmp_path / "m.safetensors"
    mem.save(state)
    secret = key_path.read_bytes()
    assert b"PRIVATE" in secret
    for blob in (state.read_bytes(), pickle.dumps(mem), repr(mem).encode()):
        assert b"PRIVATE" not in blob and secret[-60:-30] not in blob
    assert pickle.loads(pickle.dumps(mem)).remove(0).signature is None  # a copy cannot sign
    loaded = SVDDMemory.load(state, signing_key=key_path)
    assert verify_deletion(loaded, loaded.remove(1), retrain=False, public_key=pub_path).ok
    with pytest.raises(FileExistsError):
        write_keypair(tmp_path / "controller")
    with pytest.raises(ValueError, match="not an Ed25519 private key|not an unencrypted PEM"):
        SVDDMemory(0.1, signing_key=pub_path)


def test_cli_keygen_and_verify_with_the_public_key(tmp_path, capsys):
    from svattn.cli import main

    assert main(["keygen", str(tmp_path / "ctl")]) == 0
    assert "fingerprint:" in capsys.readouterr().out
    assert main(["keygen", str(tmp_path / "ctl")]) == 2  # never overwrites
    assert "never overwritten" in capsys.readouterr().err
    mem = SVDDMemory(0.1, signing_key=tmp_path / "ctl.key")
    mem.extend(np.random.default_rng(15).normal(size=(30, 2)))
    cert = mem.remove(mem.partition()["margin"][0])
    state, receipt = tmp_path / "m.safetensors", tmp_path / "r.json"
    mem.save(state)
    receipt.write_text(cert.to_json())
    args = ["verify-deletion", str(state), str(receipt), "--public-key", str(tmp_path / "ctl.pub")]
    assert main(args) == 0 and "signature valid:     True" in capsys.readouterr().out
    receipt.write_text(dataclasses.replace(cert, n_events=cert.n_events + 1).to_json())
    assert main(args) == 1 and "signature INVALID" in capsys.readouterr().out
    receipt.write_text(cert.to_json())
    assert main(args[:-1] + [str(tmp_path / "ctl.key")]) == 2  # a private key is not a public key
    assert "not a PEM public key" in capsys.readouterr().err


def test_a_certificate_says_how_many_tokens_compaction_dropped(tmp_path):
    rng = np.random.default_rng(16)
    mem = SVDDMemory(0.1)
    mem.extend(rng.normal(size=(60, 2)))
    first = mem.remove(mem.partition()["margin"][0])
    assert first.compacted == 0
    dropped = mem.compact()
    mem.add(rng.normal(size=2))
    cert = mem.remove(mem.partition()["margin"][0])
    assert cert.compacted == len(dropped) > 0
    v = verify_deletion(mem, cert)
    assert v.ok and v.compacted == len(dropped)
    assert f"exact relative to the kept tokens ({len(dropped)} dropped" in v.summary()
    path = tmp_path / "m.safetensors"
    mem.save(path)
    assert SVDDMemory.load(path).solver_state.n_compacted == len(dropped)


def test_the_verifiers_probes_stay_within_the_exp_kernels_range():
    # probes scattered around keys of large norm used to overflow exp(gamma p·x)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(17, 3))
    X *= np.sqrt(100 * np.sqrt(3) / (X**2).sum(1).mean())
    mem = SVDDMemory(C=0.1, kernel="exp")
    mem.extend(X)
    v = verify_deletion(mem, mem.remove(mem.support_ids()[0]), oracle=True)
    assert v.ok and v.n_probes > len(mem), v.reasons
