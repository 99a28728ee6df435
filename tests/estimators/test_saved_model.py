"""A saved model folder, and ``svattn verify-forget-receipt`` on it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from estimator_helpers import features, max_gap, shuffled_wine
from svattn import SVDD
from svattn.cli import main
from svattn.estimators import verify_forget_receipt
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import generate_key, write_keypair


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A model fitted with the controller's key and a log, a forget by labels, saved."""
    where = tmp_path_factory.mktemp("deployed")
    key_path, pub_path = write_keypair(where / "controller")
    frame = shuffled_wine(2)
    X = features(frame)
    log = where / "audit.jsonl"
    model = SVDD(nu=0.2, signing_key=str(key_path), audit_log=log).fit(
        X, subjects=[f"p{label % 25}" for label in X.index])
    receipt = model.forget(ids=X.index[frame.target == 1][:4])
    model.save(where / "model")
    (where / "receipt.json").write_text(receipt.to_json())
    return where, model, X, receipt, key_path, pub_path, log


def _cli(where, *extra, receipt="receipt.json"):
    return main(["verify-forget-receipt", str(where / "model"), str(where / receipt), *extra])


def test_the_command_verifies_every_field_with_the_log_and_key(deployed, capsys):
    where, *_, pub, log = deployed
    assert _cli(where, "--log", str(log), "--public-key", str(pub)) == 0
    out, err = capsys.readouterr()
    assert "verdict:             VERIFIED" in out
    # what it does: the proof from the keys (the dense re-solve is verify-deletion --oracle)
    assert "optimal from their keys" in err and "oracle" not in err


def test_without_the_key_the_command_names_what_it_could_not_check(deployed, capsys):
    where, *_ = deployed
    assert _cli(where) == 3
    out = capsys.readouterr().out
    assert "UNCHECKED" in out and "ids" in out and "--public-key" in out


def test_an_edited_receipt_fails_on_the_command_line(deployed, capsys):
    where, _, _, receipt, _, pub, log = deployed
    data = json.loads(receipt.to_json())
    data["ids"][0] = data["ids"][0] + 1000  # another row: a well-formed lie
    (where / "edited.json").write_text(json.dumps(data))
    assert _cli(where, "--log", str(log), "--public-key", str(pub), receipt="edited.json") == 1
    assert "FAILED" in capsys.readouterr().out


def test_malformed_input_is_exit_2_in_one_line(deployed, capsys):
    where, *_ = deployed
    (where / "broken.json").write_text('{"ids": [1]')
    assert _cli(where, receipt="broken.json") == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "Traceback" not in err and err.count("\n") <= 2
    assert main(["verify-forget-receipt", str(where / "nowhere"),
                 str(where / "receipt.json")]) == 2
    assert "no such model folder" in capsys.readouterr().err


def test_save_and_load_keep_the_model_and_continue_its_log(deployed, tmp_path):
    where, model, X, _, key_path, pub, log = deployed
    loaded = SVDD.load(where / "model")
    assert max_gap(loaded.decision_function(X), model.decision_function(X)) == 0.0
    assert list(loaded.ids_) == list(model.ids_)
    assert list(loaded.feature_names_in_) == list(X.columns)
    assert loaded.get_params()["nu"] == 0.2 and loaded.signing_key is None
    # the deployed model, continued: signed, logged, a subject forgotten, saved again
    copy = tmp_path / "model"
    copy.mkdir()
    for name in ("memory.safetensors", "estimator.json"):
        (copy / name).write_bytes((where / "model" / name).read_bytes())
    log_copy = tmp_path / "audit.jsonl"
    log_copy.write_bytes(log.read_bytes())
    openings_path(log_copy).write_bytes(openings_path(log).read_bytes())  # beside it
    live = SVDD.load(copy, signing_key=str(key_path), audit_log=log_copy)
    receipt = live.forget(subject="p3")
    live.save(copy)
    (tmp_path / "r.json").write_text(receipt.to_json())
    assert main(["verify-forget-receipt", str(copy), str(tmp_path / "r.json"), "--log",
                 str(log_copy), "--public-key", str(pub)]) == 0
    assert verify_forget_receipt(SVDD.load(copy), receipt, log=log_copy,
                                 public_key=pub).status == "VERIFIED"
    # the first receipt, checked later: against the chain, which ends at the model now
    first = ["verify-forget-receipt", str(copy), str(where / "receipt.json")]
    assert main([*first, "--log", str(log_copy), "--public-key", str(pub)]) == 0
    assert main(first) == 1  # without the log, a later model is not the receipt's state


def test_load_refuses_a_folder_that_does_not_hold_together(deployed, tmp_path):
    where, model, *_ = deployed
    meta = json.loads((where / "model" / "estimator.json").read_text())
    state = (where / "model" / "memory.safetensors").read_bytes()
    for edit, words in [({"rows": {**meta["rows"], "ids": meta["rows"]["ids"][::-1][:-1]}},
                         "one id per token"),
                        ({"state_sha256": "0" * 64}, "SHA-256 differs"),
                        ({"C_": -1}, "C_ must be"), ({"format": "x"}, "not an svattn SVDD"),
                        ({"gamma_": meta["gamma_"] * 2}, "gamma_ is not")]:
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "memory.safetensors").write_bytes(state)
        (folder / "estimator.json").write_text(json.dumps({**meta, **edit}))
        with pytest.raises(ValueError, match=words):
            SVDD.load(folder)
    with pytest.raises(FileNotFoundError, match="no estimator.json"):
        SVDD.load(tmp_path / "m0" / "..")


def test_string_ids_survive_save_and_load(tmp_path):
    X = np.random.default_rng(5).normal(size=(30, 2))
    model = SVDD(nu=0.3).fit(X, ids=[f"r{i}" for i in range(30)])
    model.save(tmp_path / "m")
    again = SVDD.load(tmp_path / "m")
    assert list(again.ids_) == [f"r{i}" for i in range(30)]
    again.forget(ids=["r4"])
    with pytest.raises(ValueError, match="addressed by id"):
        again.forget(indices=[5])


def test_a_model_pickled_before_rows_had_ids_reads_as_positions():
    X = np.random.default_rng(6).normal(size=(50, 2))
    model = SVDD(nu=0.3).fit(X)
    model.forget(indices=[3])
    state = model.__getstate__()
    for name in ("_ledger", "_support"):  # what such a pickle lacks, and what it held
        del state[name]
    state["support_"] = np.array([999])
    old = SVDD.__new__(SVDD)
    old.__setstate__(state)
    assert np.array_equal(old.support_, model.support_)
    assert list(old.ids_) == [i for i in range(50) if i != 3]
    assert old.forget(indices=[4]).ids == (4,)


def test_a_signed_model_loaded_without_its_key_warns_that_its_receipt_is_unsigned(tmp_path):
    X = np.random.default_rng(8).normal(size=(30, 2))
    key = generate_key()
    SVDD(nu=0.2, gamma=0.5, signing_key=key).fit(X).save(tmp_path / "m")
    keyless = SVDD.load(tmp_path / "m")
    with pytest.warns(UserWarning, match="held without it: this receipt is unsigned"):
        assert keyless.forget(ids=[3]).signature is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unkeyed model's receipt is unsigned by design
        SVDD(nu=0.2, gamma=0.5).fit(X).forget(ids=[3])
        assert SVDD.load(tmp_path / "m", signing_key=key).forget(ids=[4]).signature
