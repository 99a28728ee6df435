"""The estimator's ForgetReceipt is a trust object: JSON, signed, logged, verified."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest
from sklearn.base import clone

from estimator_helpers import features, max_gap, shuffled_wine
from svattn import SVDD
from svattn.estimators import ForgetReceipt, verify_forget_receipt
from svattn.exact.auditor.verify import verify_log
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import generate_key, write_keypair


@pytest.fixture(scope="module")
def signed_model(tmp_path_factory):
    """A shuffled wine model with the controller's key and an audit log, two forgets."""
    where = tmp_path_factory.mktemp("receipt")
    key_path, pub_path = write_keypair(where / "controller")
    frame = shuffled_wine(1)
    X = features(frame)
    subjects = [f"patient-{label % 30}" for label in X.index]
    model = SVDD(nu=0.2, signing_key=str(key_path), audit_log=where / "audit.jsonl")
    model.fit(X, subjects=subjects)
    by_ids = model.forget(ids=X.index[frame.target == 2][:6])
    by_subject = model.forget(subject="patient-11")
    return model, X, by_ids, by_subject, where / "audit.jsonl", pub_path


def test_a_receipt_survives_json_and_says_what_went(signed_model):
    _, _, by_ids, by_subject, _, _ = signed_model
    for receipt in (by_ids, by_subject):
        text = receipt.to_json()
        assert json.loads(text)["ids"] == list(receipt.ids)  # plain JSON
        again = ForgetReceipt.from_json(text)
        assert again == receipt and again.to_json() == text
    assert by_subject.subject == "patient-11" and by_ids.subject is None
    assert json.loads(by_subject.to_json())["erasure"]["tag_hash"] == by_subject.erasure.tag_hash


def test_a_receipt_is_signed_and_verifies_with_the_log_and_key(signed_model):
    model, _, _, by_subject, log, pub = signed_model
    assert by_subject.signature is not None and by_subject.erasure.signature is not None
    full = verify_forget_receipt(model, by_subject, log=log, public_key=pub)
    assert full.status == "VERIFIED" and full.exit_status == 0, full.summary()
    alone = verify_forget_receipt(model, by_subject)  # the ids are the controller's word
    assert alone.ok and alone.status == "UNCHECKED"
    assert {"ids", "subject"} <= dict(alone.verdict.unchecked).keys()


def test_the_log_is_the_memorys_and_never_holds_the_subject_or_the_labels(signed_model):
    model, X, by_ids, by_subject, log, _ = signed_model
    report = verify_log(log)
    assert report.ok
    text = log.read_text()
    # forgotten, the subject leaves not even its keyed tag hash in the log or its openings
    text += openings_path(log).read_text()
    assert "patient-11" not in text and by_subject.erasure.tag_hash not in text
    records = report.records
    assert {r["op"] for r in records} >= {"open", "extend", "remove", "erase"}
    removed = [r["certificate"]["removed_id"] for r in records if r["op"] == "remove"]
    assert removed[:6] == list(by_ids.positions)  # positions, never the labels


def test_the_log_never_holds_the_ids_a_user_gave(tmp_path):
    X = np.random.default_rng(7).normal(size=(30, 2))
    log = tmp_path / "audit.jsonl"
    model = SVDD(nu=0.3, audit_log=log, signing_key=generate_key())
    model.fit(X, ids=[f"mrn-{i:04d}" for i in range(30)], subjects=["ana"] * 3 + [None] * 27)
    model.forget(ids=["mrn-0011"])
    model.forget(subject="ana")
    text = log.read_text()
    assert verify_log(log).ok and "mrn-" not in text and "ana" not in text


def test_the_recipe_is_what_an_auditor_refits_with(signed_model):
    model, X, by_ids, by_subject, _, _ = signed_model
    remaining = X.loc[list(model.ids_)]
    fresh = SVDD(**by_subject.refit_with).fit(remaining)
    assert max_gap(model.decision_function(X), fresh.decision_function(X)) <= 1e-9
    naive = SVDD(nu=0.2).fit(remaining)  # nu sets C_ = 1/(nu n) with the new n
    assert naive.C_ != model.C_
    assert max_gap(model.decision_function(X), naive.decision_function(X)) > 1e-3


@pytest.mark.parametrize("text, words", [
    ("not json", "not valid JSON"),
    ("[]", "must be an object"),
    ('{"ids": [1], "ids": [2]}', "more than once"),
    ("{}", "missing fields"),
])
def test_a_malformed_receipt_is_named(text, words):
    with pytest.raises(ValueError, match=words):
        ForgetReceipt.from_json(text)


def test_a_malformed_field_is_named(signed_model):
    _, _, by_ids, by_subject, _, _ = signed_model
    data = json.loads(by_ids.to_json())
    for edit, words in [({"ids": [1.5]}, "ids must be"), ({"extra": 1}, "unknown fields"),
                        ({"positions": [1]}, "one position per id"),
                        ({"certificates": [{"removed_id": 1}]}, r"certificates\[0\]"),
                        ({"refit_with": {"C": 1.0}}, "refit_with"),
                        ({"version": 1}, "version must be 2"),
                        ({"subject": "someone"}, "erasure receipt, and only it"),
                        ({"signature": None}, "signer and signature come together")]:
        with pytest.raises(ValueError, match=words):
            ForgetReceipt.from_json(json.dumps({**data, **edit}))
    erasure = json.loads(by_subject.to_json())
    erasure["erasure"]["erased_ids"] = "x"
    with pytest.raises(ValueError, match="erasure: .*erased_ids"):
        ForgetReceipt.from_json(json.dumps(erasure))


def test_an_edited_receipt_fails(signed_model):
    model, _, _, by_subject, log, pub = signed_model
    for edit in ({"ids": (by_subject.ids[0] + 1000, *by_subject.ids[1:])},
                 {"subject": "patient-12"}, {"n_samples": by_subject.n_samples + 1},
                 {"refit_with": {**by_subject.refit_with, "C": 0.5}}):
        forged = dataclasses.replace(by_subject, **edit)
        v = verify_forget_receipt(model, forged, retrain=False, log=log, public_key=pub)
        assert v.status == "FAILED", (edit, v.summary())


def test_clone_and_refit_never_write_into_the_same_log(tmp_path):
    X = np.random.default_rng(3).normal(size=(50, 2))
    log = tmp_path / "audit.jsonl"
    model = SVDD(nu=0.3, audit_log=log).fit(X)
    twin = clone(model)
    assert twin.audit_log == log
    for est in (twin, model):  # a clone, and a refit: each would start a second chain
        with pytest.raises(ValueError, match="already has records"):
            est.fit(X)
    assert verify_log(log).ok and model.n_samples_ == 50
    fresh = tmp_path / "fresh.jsonl"
    with pytest.raises(TypeError, match="astype"):  # a fit that fails leaves no log
        SVDD(nu=0.3, audit_log=fresh, signing_key=generate_key()).fit(X, subjects=[1] * 50)
    assert not fresh.exists()
    huge = X * 100  # the exp kernel overflows inside the core's extend, after the log opened
    with pytest.raises(ValueError, match="overflows"):
        SVDD(kernel="exp", gamma=1.0, audit_log=fresh).fit(huge)
    assert not fresh.exists()
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with pytest.raises(ValueError, match="overflows"):  # an empty file given: empty again
        SVDD(kernel="exp", gamma=1.0, audit_log=empty).fit(huge)
    assert empty.stat().st_size == 0


def test_a_pickle_never_holds_the_private_key(tmp_path):
    X = np.random.default_rng(4).normal(size=(40, 2))
    key = generate_key()
    model = SVDD(nu=0.3, signing_key=key).fit(X)
    assert model.forget(ids=[3]).signature is not None
    data = pickle.dumps(model)
    assert model.signing_key is key and model.forget(ids=[5]).signature is not None  # kept
    from cryptography.hazmat.primitives import serialization

    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    assert raw not in data
    again = pickle.loads(data)
    assert again.signing_key is None
    with pytest.warns(UserWarning, match="holds no signing key: this receipt is unsigned"):
        assert again.forget(ids=[4]).signature is None  # said, never silent
    key_path, _ = write_keypair(tmp_path / "ctl")
    by_path = SVDD(nu=0.3, signing_key=str(key_path)).fit(X)
    assert pickle.loads(pickle.dumps(by_path)).signing_key == str(key_path)  # a path stays
