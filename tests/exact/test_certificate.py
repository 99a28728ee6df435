"""Deletion certificates: contents, JSON round trip, verification against retraining."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from svattn.exact import DeletionCertificate, SVDDMemory, verify_deletion


@pytest.fixture
def memory_and_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 5))
    V = rng.normal(size=(150, 2))
    mem = SVDDMemory(0.03)
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
    assert cert.matches_token(X[victim], V[victim])
    assert not cert.matches_token(X[victim + 1], V[victim + 1])
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
    assert cert.matches_token(X[5], V[5])


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
    report = verify_deletion(mem, cert)
    assert report.ok, report.summary()
    assert report.partition_equal
    assert report.max_alpha_dev <= 1e-9
    assert report.decision_dev <= 1e-9 and report.readout_dev <= 1e-9
    assert "VERIFIED" in report.summary()


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
    report = verify_deletion(mem, cert)
    assert not report.ok
    assert report.max_alpha_dev >= 1e-5


def test_non_unique_optimum_is_reported():
    X = np.random.default_rng(2).normal(size=(60, 3))
    mem = SVDDMemory(0.05)
    mem.extend(X)
    mem.extend(mem.keys[[mem.ids.index(t) for t in mem.support_ids()[:3]]])  # duplicates
    cert = mem.remove(10)
    assert not cert.unique_optimum
    report = verify_deletion(mem, cert)
    assert not report.unique_optimum
    assert "NOT unique" in report.summary()
    assert report.decision_dev <= 1e-9  # the decision function is unique regardless
