"""Edges of ``svattn.SVDD`` found by an adversary (#35, items 10, 13 and 14)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.svm import OneClassSVM

from svattn import SVDD
from svattn.exact.operations.scoring import mu_interval


def _blobs(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(3, d))
    return centers[rng.integers(0, 3, n)] + rng.normal(size=(n, d))


# ------------------------------------------------------------- 10: a box that never binds
def test_a_huge_C_predicts_as_C_one():
    X = _blobs(80, 2, 0)
    probes = np.concatenate([X, _blobs(40, 2, 1) * 2.0])
    one = SVDD(C=1.0, gamma=0.5).fit(X)
    for C in (3.0, 1e12, 1e13):
        big = SVDD(C=C, gamma=0.5).fit(X)
        assert big.C_ == C  # the box given: the attributes keep libsvm's scale 1 / (2C)
        assert (big.predict(X) == 1).any()  # C = 1e13 used to predict -1 everywhere
        clear = np.abs(one.decision_function(probes)) > 1e-9  # margin samples: ties
        assert clear.sum() > 60
        assert np.array_equal(big.predict(probes)[clear], one.predict(probes)[clear])
        assert big.memory_.C == 1.0 and big.memory_.kkt_residual() <= big.tol
        np.testing.assert_allclose(big.decision_function(probes) * (2 * C),
                                   one.decision_function(probes) * 2.0, rtol=0, atol=1e-9)


# ------------------------------------------------------------- 13: the sign of a zero
def test_forget_by_rows_treats_minus_zero_as_zero():
    X = _blobs(40, 2, 2)
    X[7] = [-0.0, 1.0]
    X[9] = [0.0, 1.0]  # a copy of sample 7 (the commitments treat them as one record)
    model = SVDD(nu=0.3).fit(X)
    receipt = model.forget(np.array([[0.0, 1.0]]))
    assert sorted(receipt.ids) == [7, 9]
    model = SVDD(nu=0.3).fit(X)
    receipt = model.forget(np.array([[0.0, -0.0], [-0.0, 1.0]])[1:])
    assert sorted(receipt.ids) == [7, 9]
    held = SVDD(nu=0.3).fit(X[:8])  # only [-0.0, 1.0]
    assert held.forget(np.array([[0.0, 1.0]])).ids == (7,)
    assert held.n_samples_ == 7


# ------------------------------------------------------------- 14: an empty margin set
def _empty_margin_problem():
    # nu·n an integer and every support vector at the bound (seed found by search:
    # rare; margin set empty in both solvers)
    X = np.random.default_rng(7).normal(size=(20, 2))
    return X, 0.5


def test_offset_matches_one_class_svm_when_every_support_vector_is_at_the_bound():
    X, nu = _empty_margin_problem()
    ours = SVDD(nu=nu, gamma=0.5).fit(X)
    assert ours.memory_.partition()["margin"] == []  # the case itself
    libsvm = OneClassSVM(nu=nu, gamma=0.5, tol=1e-12, shrinking=False).fit(X)
    assert (libsvm.dual_coef_ >= 1 - 1e-7).all()  # libsvm: every coefficient at the bound
    probes = np.concatenate([X, _blobs(30, 2, 3)])
    # the accuracy libsvm's float32 kernel cache allows (test_estimators.py)
    assert ours.offset_ == pytest.approx(float(libsvm.offset_[0]), abs=1e-6)
    np.testing.assert_allclose(ours.decision_function(probes), libsvm.decision_function(probes),
                               rtol=0, atol=1e-6)
    assert np.array_equal(ours.predict(probes), libsvm.predict(probes))
    # the core keeps its convention (the largest optimal mu: certificates and digests);
    # the estimator reports the middle of the interval of optimal offsets, as libsvm
    lo, hi = mu_interval(ours.memory_.solver_state)
    assert lo < hi == ours.memory_.mu
    assert ours.offset_ == pytest.approx((1.0 - 0.5 * (lo + hi)) / (2.0 * ours.C_), rel=1e-15)


def test_the_offset_is_a_function_of_the_rows_held_after_forget():
    X, nu = _empty_margin_problem()
    extra = _blobs(6, 2, 4) * 0.1
    model = SVDD(nu=nu, gamma=0.5).fit(X)
    model.partial_fit(extra)
    model.forget(indices=list(range(20, 26)))
    fresh = SVDD(C=model.C_, gamma=0.5).fit(X)
    assert model.memory_.partition()["margin"] == fresh.memory_.partition()["margin"] == []
    assert model.offset_ == pytest.approx(fresh.offset_, abs=1e-12)
    probes = _blobs(30, 2, 5)
    np.testing.assert_allclose(model.decision_function(probes), fresh.decision_function(probes),
                               rtol=0, atol=1e-9)


def test_every_sample_at_the_bound_keeps_the_cores_offset():
    # nu = 1: every alpha = C, no reserve sample, and the optimal offsets are unbounded
    # on one side (libsvm's rho is then infinite, and OneClassSVM refuses the fit); the
    # estimator keeps the core's mu, the largest optimal value
    X = np.random.default_rng(8).normal(size=(12, 2))
    model = SVDD(nu=1.0, gamma=0.5).fit(X)
    lo, hi = mu_interval(model.memory_.solver_state)
    assert lo == -np.inf and hi == model.memory_.mu
    assert model.offset_ == (1.0 - model.memory_.mu) / (2.0 * model.C_)
    assert np.isfinite(model.decision_function(X)).all()
    with pytest.raises(ValueError, match="not finite"):
        OneClassSVM(nu=1.0, gamma=0.5).fit(X)
