"""Erasure by data subject: tags kept as keyed hashes, one exact erase, one receipt."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from svattn.exact import SVDDMemory, UnknownTokenError
from svattn.exact.auditor.verify import verify_erasure, verify_log
from svattn.exact.records.certificate import ErasureReceipt
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import generate_key


def _stays(seed: int = 0):
    """Three patients' hourly vectors (one repeats another's reading) and a bystander."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(loc=c, size=(25, 3)) for c in (0.0, 0.5, -0.5)])
    tags = ["patient-a"] * 25 + ["patient-b"] * 25 + ["patient-c"] * 25
    return X, tags


def test_erase_removes_every_token_of_the_subject_exactly_and_nothing_else(tmp_path):
    key = generate_key()
    log = tmp_path / "audit.jsonl"
    X, tags = _stays()
    X[60] = X[3]  # patient c has the same reading as one of patient a's hours
    mem = SVDDMemory(0.05, signing_key=key, audit_log=log)
    ids = mem.extend(X, tags=tags)
    receipt = mem.erase("patient-a")
    assert receipt.erased_ids == ids[:25] and len(mem) == 50
    assert receipt.copies_kept == {"3": [60]}  # patient c's data: it stays, and is named
    v = verify_erasure(mem, receipt, public_key=key.public_key())
    assert v.ok and v.signed, v.reasons
    # equal to a memory that never saw patient a
    fresh = SVDDMemory(0.05)
    fresh.extend(X[25:])
    probes = X[::4]
    np.testing.assert_allclose(mem.decision_function(probes), fresh.decision_function(probes),
                               rtol=0, atol=1e-10)
    # the log holds the request (the receipt's SHA-256); its subject, forgotten, not even
    # as the keyed tag hash (pruned), the other subjects' tags only as keyed hashes
    text = log.read_text() + openings_path(log).read_text()
    assert "patient-a" not in text and receipt.tag_hash not in text
    rep = verify_log(log)
    assert rep.ok and rep.records[-1]["op"] == "erase"
    assert rep.records[-1]["erasure"]["receipt_sha256"] == receipt.sha256()
    with pytest.raises(UnknownTokenError, match="no live token carries this tag"):
        mem.erase("patient-a")  # nothing left to erase, nothing changes
    assert len(mem) == 50


def test_a_receipt_that_overstates_fails_verification():
    key = generate_key()
    X, tags = _stays(1)
    mem = SVDDMemory(0.05, signing_key=key)
    mem.extend(X, tags=tags)
    receipt = mem.erase("patient-b")
    for field, value in [("erased_ids", receipt.erased_ids[:-1]), ("n_after", 1),
                         ("state_digest", "e" * 64), ("tag_hash", "a" * 64)]:
        forged = dataclasses.replace(receipt, **{field: value})
        # which subject an erasure was for is not in the state once its tokens are
        # gone: an edited tag_hash needs the signature to be caught
        assert verify_erasure(mem, forged, retrain=False).ok == (field == "tag_hash"), field
        assert not verify_erasure(mem, forged, retrain=False, public_key=key.public_key()).ok
    text = receipt.to_json()
    assert ErasureReceipt.from_json(text) == receipt
    mem.add(X[30], tag="patient-b")  # the subject's data comes back under the same tag
    v = verify_erasure(mem, receipt, retrain=False)
    assert not v.ok and any("still carry the subject's tag" in r for r in v.reasons)


def test_tags_need_a_key_are_checked_first_and_survive_save_and_load(tmp_path):
    X, tags = _stays(2)
    plain = SVDDMemory(0.05)
    with pytest.raises(ValueError, match="keyed hashes"):
        plain.extend(X, tags=tags)
    assert len(plain) == 0  # nothing stored
    mem = SVDDMemory(0.05, tag_key=b"k" * 32)
    with pytest.raises(ValueError, match="one per row"):
        mem.extend(X, tags=tags[:-1])
    with pytest.raises(TypeError, match="non-empty str"):
        mem.extend(X, tags=[7] * len(X))
    assert len(mem) == 0
    mem.extend(X, tags=tags)
    path = tmp_path / "m.safetensors"
    mem.save(path)
    assert b"patient" not in path.read_bytes()
    again = SVDDMemory.load(path, tag_key=b"k" * 32)
    receipt = again.erase("patient-c")
    assert receipt.erased_ids == list(range(50, 75))
    # another controller's key: refused at load (#35), never "no such subject" at erase
    with pytest.raises(ValueError, match="another key"):
        SVDDMemory.load(path, tag_key=b"x" * 32)
    assert json.loads(receipt.to_json())["tag_hash"] == receipt.tag_hash
