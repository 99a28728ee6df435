"""``svattn.SVDD`` against scikit-learn's contract, OneClassSVM and the oracle."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from svattn import SVDD
from svattn.estimators import ForgetReceipt
from svattn.exact import verify_deletion
from svattn.exact.core.kernels import gram_matrix
from svattn.exact.oracle import solve_svdd
from svattn.exact.records.signing import write_keypair


# With sample_weight in fit's signature the checks include scikit-learn's sample-weight
# checks (a zero weight equals removing the row, an integer weight k equals k copies;
# all-zero, wrong-shape weights refused). C = 0.05, not 0.2: on check_outliers_train's 300
# blobs C = 0.2 (and 0.1) leaves no row at the box, so every training row is inside or on
# the boundary; the check's "some rows predicted -1" then held only through the rounding
# of margin rows, which score_samples now puts on the boundary exactly.
@parametrize_with_checks([SVDD(), SVDD(C=0.05, gamma="auto"), SVDD(nu=0.1, standby=0)])
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


def test_scikit_learn_estimator_checks_with_the_controllers_key(tmp_path):
    key, _ = write_keypair(tmp_path / "controller")  # (a path: tmp ids would differ per run)
    check_estimator(SVDD(nu=0.2, signing_key=str(key)))


def _blobs(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(3, d))
    return centers[rng.integers(0, 3, n)] + rng.normal(size=(n, d))


@pytest.mark.parametrize("n, d, nu, seed", [(150, 2, 0.1, 0), (300, 5, 0.3, 1), (400, 3, 0.05, 2)])
def test_same_numbers_as_one_class_svm_with_rbf(n, d, nu, seed):
    X = _blobs(n, d, seed)
    probes = np.concatenate([X[::3], _blobs(60, d, seed + 10) * 1.5])
    ours = SVDD(nu=nu, gamma="scale").fit(X)
    libsvm = OneClassSVM(nu=nu, gamma="scale", tol=1e-12, shrinking=False).fit(X)
    assert ours.gamma_ == pytest.approx(libsvm._gamma, rel=1e-15)
    assert ours.C_ == pytest.approx(1.0 / (nu * n))
    # libsvm keeps its kernel cache in float32: measured max deviations on these
    # problems 4e-8 .. 1.3e-7 in the decision function (values up to 16), 3e-9 .. 2e-8
    # in offset_
    scale = max(1.0, float(np.abs(libsvm.decision_function(probes)).max()))
    np.testing.assert_allclose(ours.decision_function(probes), libsvm.decision_function(probes),
                               rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(ours.score_samples(probes), libsvm.score_samples(probes),
                               rtol=0, atol=1e-6 * scale)
    assert ours.offset_ == pytest.approx(float(libsvm.offset_[0]), abs=1e-6 * scale)
    beta = np.zeros(n)
    beta[libsvm.support_] = libsvm.dual_coef_.ravel()
    mine = np.zeros(n)
    mine[ours.support_] = ours.dual_coef_.ravel()
    # measured max |Δβ| 3e-7 .. 1.6e-6 on these problems (2.7e-6 at n = 2000): libsvm's
    # float32 kernel cache; against the float64 oracle our coefficients agree to 1e-9
    assert np.abs(mine - beta).max() <= 5e-6
    alpha = solve_svdd(gram_matrix(X, "rbf", ours.gamma_), ours.C_)
    assert np.abs(mine * ours.C_ - alpha).max() <= 1e-9
    assert mine.sum() == pytest.approx(nu * n, rel=1e-12)  # libsvm's Σβ = νn
    assert np.array_equal(ours.predict(probes), libsvm.predict(probes)) or \
        np.abs(libsvm.decision_function(probes)[ours.predict(probes) != libsvm.predict(probes)]
               ).max() <= 1e-6 * scale  # only rounding-level ties may differ


def test_exp_kernel_matches_the_independent_oracle():
    X = _blobs(120, 3, 5) * 0.3
    model = SVDD(C=0.05, kernel="exp", gamma=0.5).fit(X)
    K = gram_matrix(X, "exp", 0.5)
    alpha, mu = solve_svdd(K, 0.05, return_mu=True)
    mine = np.zeros(len(X))
    mine[model.support_] = model.dual_coef_.ravel() * model.C_
    assert np.abs(mine - alpha).max() <= 1e-9
    probes = np.concatenate([X[::5], X[:10] + 0.5])
    Kp = gram_matrix(np.concatenate([probes, X]), "exp", 0.5)[: len(probes), len(probes):]
    kxx = np.exp(0.5 * np.einsum("ij,ij->i", probes, probes))
    svdd = 2 * Kp @ alpha - kxx + mu  # R² − ‖φ(x) − a‖²
    np.testing.assert_allclose(model.decision_function(probes), svdd / (2 * model.C_),
                               rtol=1e-9, atol=1e-9)
    # the formulas that define the attributes for a non-constant diagonal
    np.testing.assert_allclose(model.score_samples(probes) - model.offset_,
                               model.decision_function(probes), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kernel, gamma", [("rbf", "scale"), ("exp", 0.3)])
def test_forget_equals_a_fresh_fit_without_the_rows(kernel, gamma):
    X = _blobs(250, 4, 3) * (0.4 if kernel == "exp" else 1.0)
    model = SVDD(nu=0.2, kernel=kernel, gamma=gamma).fit(X)
    C, g = model.C_, model.gamma_
    support = list(model.support_[:3])
    gone = support + [int(i) for i in np.setdiff1d(np.arange(250), model.support_)[:4]]
    receipt = model.forget(indices=gone)
    assert isinstance(receipt, ForgetReceipt) and receipt.ids == receipt.positions == tuple(gone)
    assert len(receipt.certificates) == len(gone) and receipt.n_samples == 243
    assert verify_deletion(model.memory_, receipt.certificates[-1]).ok
    keep = np.setdiff1d(np.arange(250), gone)
    fresh = SVDD(C=C, kernel=kernel, gamma=g).fit(X[keep])
    probes = np.concatenate([X[::4], X[:20] + 0.3])
    np.testing.assert_allclose(model.decision_function(probes), fresh.decision_function(probes),
                               rtol=0, atol=1e-9 * max(1.0, model.offset_))
    assert model.C_ == C and model.gamma_ == g  # fixed while forgetting
    assert model.nu_ == pytest.approx(1.0 / (C * 243))
    assert set(model.support_) == {int(keep[i]) for i in fresh.support_}  # original indices
    assert receipt.summary().startswith("forgot 7 samples exactly (ids")
    assert receipt.state_digest == model.memory_.state_digest()
    one = model.forget(indices=[int(model.support_[0])])  # one sample: one checkpoint
    assert one.state_digest == model.memory_.state_digest() == one.certificates[0].state_digest


def test_forget_by_rows_removes_every_copy_and_unfit_is_the_same_method():
    X = _blobs(120, 3, 4)
    X[50] = X[10]  # a copy of sample 10
    model = SVDD(nu=0.3).fit(X)
    receipt = model.unfit(X[[10, 20, 10]])  # a repeated row asks once
    assert sorted(receipt.ids) == [10, 20, 50] and model.n_samples_ == 117
    assert SVDD.unfit is SVDD.forget


def test_bad_forget_requests_change_nothing():
    X = _blobs(100, 2, 6)
    model = SVDD(nu=0.2).fit(X)
    digest = model.memory_.state_digest()
    for kwargs, words in [
        ({}, "exactly one"),
        ({"X": X[:2], "indices": [0]}, "exactly one"),
        ({"ids": [0], "indices": [0]}, "exactly one"),
        ({"X": X[:1] + 1e-9}, "matches no sample"),
        ({"indices": [3, 3]}, "twice"),
        ({"indices": [5, 100]}, "not held"),
        ({"indices": []}, "non-empty"),
        ({"indices": [1.5]}, "ints"),
    ]:
        with pytest.raises(ValueError, match=words):
            model.forget(**kwargs)
        assert model.memory_.state_digest() == digest and model.n_samples_ == 100
    model.forget(indices=[5])
    with pytest.raises(ValueError, match="not held"):
        model.forget(indices=[5])
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match="not fitted yet"):
        SVDD(nu=0.2).forget(indices=[0])


def test_partial_fit_equals_fit_on_every_row_with_the_same_problem():
    X = _blobs(300, 3, 7)
    stream = SVDD(nu=0.25).partial_fit(X[:100])
    C, g = stream.C_, stream.gamma_
    for lo in range(100, 300, 50):
        stream.partial_fit(X[lo : lo + 50])
    assert stream.C_ == C and stream.n_samples_ == 300
    whole = SVDD(C=C, gamma=g).fit(X)
    probes = X[::5] + 0.1
    np.testing.assert_allclose(stream.decision_function(probes), whole.decision_function(probes),
                               rtol=0, atol=1e-9)
    assert list(stream.support_) == list(whole.support_)


def test_parameters_are_checked_at_fit():
    X = _blobs(20, 2, 0)
    for est, words in [(SVDD(nu=0.5, C=0.1), "not both"), (SVDD(nu=0.0), "nu must be"),
                       (SVDD(nu=1.5), "nu must be"), (SVDD(C=-1.0), "C must be"),
                       (SVDD(gamma="wide"), "gamma must be"), (SVDD(gamma=0.0), "gamma must be"),
                       (SVDD(kernel="poly"), "kernel must be")]:
        with pytest.raises(ValueError, match=words):
            est.fit(X)


def test_not_fitted_pickle_clone_pipeline_gridsearch_and_dataframes():
    X = _blobs(200, 3, 8) * [1.0, 50.0, 0.01]  # badly scaled: the pipeline fixes it
    model = SVDD(nu=0.1)
    for method in (model.predict, model.decision_function, model.score_samples):
        with pytest.raises(NotFittedError):
            method(X)
    with pytest.raises(NotFittedError):
        model.forget(indices=[0])
    model.fit(X)
    again = pickle.loads(pickle.dumps(model))
    assert np.array_equal(again.decision_function(X), model.decision_function(X))
    again.forget(indices=[int(model.support_[0])])  # the copy forgets on its own
    assert model.n_samples_ == 200 and again.n_samples_ == 199
    blank = clone(model)
    assert blank.get_params() == model.get_params() and not hasattr(blank, "memory_")

    pipe = make_pipeline(StandardScaler(), SVDD(nu=0.1)).fit(X)
    assert set(np.unique(pipe.predict(X))) <= {-1, 1}
    search = GridSearchCV(SVDD(), {"nu": [0.05, 0.2], "gamma": ["scale", 0.5]}, cv=3,
                          scoring=lambda est, X_, y=None: float(est.score_samples(X_).mean()))
    search.fit(X)
    assert search.best_params_["nu"] in (0.05, 0.2)

    frame = pd.DataFrame(X, columns=["heart_rate", "spo2", "temp"])
    named = SVDD(nu=0.1).fit(frame)
    assert list(named.feature_names_in_) == ["heart_rate", "spo2", "temp"]
    np.testing.assert_array_equal(named.decision_function(frame), model.decision_function(X))
    receipt = named.forget(frame.iloc[[3, 4]])
    assert receipt.ids == (3, 4)
    with pytest.warns(UserWarning, match="feature names"):
        named.predict(X)  # fitted with names, called without
