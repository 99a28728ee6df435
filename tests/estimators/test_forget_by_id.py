"""``SVDD`` forgets the rows the user names: by id, by index label, by data subject."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from estimator_helpers import features, max_gap, shuffled_wine
from svattn import SVDD
from svattn.exact.records.signing import generate_key


@pytest.fixture(scope="module")
def wine():
    frame = shuffled_wine()
    return frame, features(frame)


def test_forget_by_index_labels_of_a_shuffled_frame_equals_a_fresh_fit(wine):
    frame, X = wine
    model = SVDD(nu=0.2).fit(X)
    assert list(model.ids_) == list(X.index)  # the labels, in the order given
    labels = frame.index[frame.target == 0]  # class 0, 59 wines, scattered over positions
    receipt = model.forget(ids=labels)
    assert sorted(receipt.ids) == sorted(labels) and len(receipt.ids) == 59
    # positions are where those labels sat in X: exactly the class-0 rows
    assert (frame.iloc[list(receipt.positions)].target == 0).all()
    remaining = X.drop(index=labels)
    assert list(model.ids_) == list(remaining.index) and model.n_samples_ == 119
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(remaining)
    assert receipt.refit_with == {"C": model.C_, "gamma": model.gamma_, "kernel": "rbf"}
    assert max_gap(model.decision_function(X), fresh.decision_function(X)) <= 1e-9
    assert sorted(model.support_ids_) == sorted(fresh.support_ids_)


def test_positions_are_refused_on_a_label_fitted_model(wine):
    _, X = wine
    model = SVDD(nu=0.2).fit(X)
    digest = model.memory_.state_digest()
    with pytest.raises(ValueError, match=r"indices=.*ids="):
        model.forget(indices=[0, 1])
    assert model.memory_.state_digest() == digest and model.n_samples_ == len(X)


def test_a_default_index_is_positions_and_takes_either():
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(60, 3)), columns=list("abc"))
    by_index, by_id = SVDD(nu=0.3).fit(X), SVDD(nu=0.3).fit(X)
    a, b = by_index.forget(indices=[4, 9]), by_id.forget(ids=[4, 9])
    assert a.ids == b.ids == a.positions == (4, 9)
    assert a.state_digest == b.state_digest


def test_forget_by_subject_removes_all_their_rows_with_one_receipt(wine):
    frame, X = wine
    subjects = [f"patient-{label % 40}" for label in X.index]  # ~4-5 rows each, scattered
    key = generate_key()
    model = SVDD(nu=0.2, signing_key=key).fit(X, subjects=subjects)
    theirs = [label for label, s in zip(X.index, subjects, strict=True) if s == "patient-7"]
    receipt = model.forget(subject="patient-7")
    assert receipt.subject == "patient-7" and sorted(receipt.ids) == sorted(theirs)
    assert receipt.erasure is not None and receipt.erasure.erased_ids == list(receipt.positions)
    assert receipt.certificates == () and len(receipt.deletion_certificates()) == len(theirs)
    fresh = SVDD(**receipt.refit_with).fit(X.drop(index=theirs))
    assert max_gap(model.decision_function(X), fresh.decision_function(X)) <= 1e-9
    digest = model.memory_.state_digest()
    with pytest.raises(ValueError, match="no row of this subject"):
        model.forget(subject="patient-7")
    with pytest.raises(ValueError, match="no row of this subject"):
        model.forget(subject="never-seen")
    assert model.memory_.state_digest() == digest


def test_subjects_need_the_controllers_key_and_one_str_per_row():
    X = np.random.default_rng(1).normal(size=(30, 2))
    with pytest.raises(ValueError, match="signing_key"):
        SVDD(nu=0.3).fit(X, subjects=["a"] * 30)
    keyed = SVDD(nu=0.3, signing_key=generate_key())
    with pytest.raises(ValueError, match="one subject per row of X: 30 rows, 29"):
        keyed.fit(X, subjects=["a"] * 29)
    with pytest.raises(TypeError, match="astype"):
        keyed.fit(X, subjects=list(range(30)))
    assert not hasattr(keyed, "memory_")
    plain = SVDD(nu=0.3).fit(X)
    with pytest.raises(ValueError, match="holds no key"):
        plain.forget(subject="a")


def test_bad_ids_change_nothing(wine):
    frame, X = wine
    model = SVDD(nu=0.2).fit(X)
    first = X.index[0]
    model.forget(ids=[first])
    digest, ids = model.memory_.state_digest(), list(model.ids_)
    for kwargs, error, words in [
        ({"ids": [9999]}, ValueError, r"\[9999\] are not held"),
        ({"ids": [first]}, ValueError, "forgotten already"),  # forgotten: no trace kept
        ({"ids": [X.index[1], X.index[1]]}, ValueError, "more than once"),
        ({"ids": []}, ValueError, "at least one row"),
        ({"ids": [1.0]}, TypeError, "ints or strs"),
        ({"ids": [True]}, TypeError, "bool"),
        ({"ids": "abc"}, ValueError, "1-D sequence"),
        ({"ids": [X.index[1]], "subject": "x"}, ValueError, "exactly one"),
    ]:
        with pytest.raises(error, match=words):
            model.forget(**kwargs)
        assert model.memory_.state_digest() == digest and list(model.ids_) == ids


def test_ids_at_fit_are_checked_before_anything_changes(wine):
    _, X = wine
    for kwargs, words in [({"ids": list(range(10))}, "one id per row of X: 178 rows, 10 ids"),
                          ({"ids": [0] * 178}, "more than once")]:
        model = SVDD(nu=0.2)
        with pytest.raises(ValueError, match=words):
            model.fit(X, **kwargs)
        assert not hasattr(model, "memory_")
    doubled = X.iloc[:20].copy()
    doubled.index = [1, 2] * 10  # a label names two rows: a forget by it would be ambiguous
    with pytest.raises(ValueError, match="labels .* more than once"):
        SVDD(nu=0.2).fit(doubled)
    named = SVDD(nu=0.2).fit(X.iloc[:40], ids=[f"w{i}" for i in range(40)])
    assert named.ids_.dtype == object and named.ids_[3] == "w3"
    named.forget(ids=["w3", "w7"])
    assert "w3" not in set(named.ids_) and named.n_samples_ == 38


def test_partial_fit_continues_positions_then_takes_ids():
    X = np.random.default_rng(2).normal(size=(90, 3))
    model = SVDD(nu=0.3).fit(X[:40])
    model.partial_fit(X[40:60])  # positions 40..59
    assert list(model.ids_) == list(range(60))
    model.forget(indices=[45])
    model.partial_fit(X[60:70], ids=[f"late-{i}" for i in range(10)])
    digest = model.memory_.state_digest()
    with pytest.raises(ValueError, match="addressed by id"):
        model.forget(indices=[3])
    with pytest.raises(ValueError, match="give ids="):
        model.partial_fit(X[70:75])  # no ids for rows of a model addressed by id
    with pytest.raises(ValueError, match="already held"):
        model.partial_fit(X[70:72], ids=["late-1", "new"])
    with pytest.raises(ValueError, match="one id per row"):
        model.partial_fit(X[70:72], ids=["a"])
    assert model.memory_.state_digest() == digest and model.n_samples_ == 69
    receipt = model.forget(ids=[3, "late-4"])
    assert receipt.ids == (3, "late-4") and receipt.positions == (3, 64)
    keep = [i for i in range(70) if i not in (3, 45, 64)]
    fresh = SVDD(**receipt.refit_with).fit(X[keep])
    assert max_gap(model.decision_function(X), fresh.decision_function(X)) <= 1e-9


def test_partial_fit_with_a_frame_uses_its_labels(wine):
    frame, X = wine
    model = SVDD(nu=0.2).partial_fit(X.iloc[:100])
    with pytest.raises(ValueError, match="already held"):
        model.partial_fit(X.iloc[50:120])  # overlapping labels: the same rows again?
    model.partial_fit(X.iloc[100:])
    assert list(model.ids_) == list(X.index)
    model.forget(ids=X.index[[5, 150]])
    assert model.n_samples_ == 176


def test_an_index_of_timestamps_is_refused_with_what_to_do():
    X = pd.DataFrame(np.random.default_rng(3).normal(size=(20, 2)),
                     index=pd.date_range("2024-01-01", periods=20, freq="h"))
    model = SVDD(nu=0.3)
    with pytest.raises(TypeError, match=r"ints or strs.*ids=X.index.astype\(str\)"):
        model.fit(X)
    assert not hasattr(model, "memory_")
    model.fit(X, ids=X.index.astype(str))
    assert model.forget(ids=[str(X.index[4])]).ids == (str(X.index[4]),)


def test_an_int_id_beyond_int64_is_kept_reported_and_forgotten(tmp_path):
    from svattn.estimators import verify_forget_receipt

    X = np.random.default_rng(4).normal(size=(20, 2))
    big = 2**70  # an account number, a UUID as int: any Python int is an id
    model = SVDD(nu=0.3, gamma=0.5).fit(X, ids=[big, *range(1, 20)])
    assert model.ids_[0] == big and list(model.ids_[1:]) == list(range(1, 20))
    model.save(tmp_path / "before")
    assert SVDD.load(tmp_path / "before").ids_[0] == big
    receipt = model.forget(ids=[big])
    assert receipt.ids == (big,) and big not in model.ids_.tolist()
    assert verify_forget_receipt(model, receipt).ok


@pytest.mark.parametrize("how", ["ids", "subject"])
def test_a_pickle_or_copy_right_after_a_forget_holds_no_byte_of_the_row(how):
    import copy
    import pickle

    X = np.random.default_rng(6).normal(size=(120, 3))
    row = np.array([1.2345678901234567, -7.654321098765432, 3.3333333333333335])
    X[60] = row  # a support vector (far out), whose values only row 60 holds
    model = SVDD(nu=0.1, gamma=0.5, signing_key=generate_key()).fit(
        X, subjects=["gone" if i == 60 else None for i in range(120)])
    assert 60 in model.support_.tolist()  # the support's attributes, read before
    if how == "ids":
        model.forget(ids=[60])
    else:
        model.forget(subject="gone")
    for blob in (pickle.dumps(model), pickle.dumps(copy.deepcopy(model))):
        assert row[:1].tobytes() not in blob
    assert 60 not in pickle.loads(pickle.dumps(model)).support_.tolist()
