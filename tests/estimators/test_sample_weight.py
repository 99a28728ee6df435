"""``SVDD(...).fit(X, sample_weight=w)``: a weight is a per-sample box ``C_i = w_i · C_``.

Every test here fails on the code before ``sample_weight`` (``fit`` took no such
argument)."""

from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.svm import OneClassSVM

from svattn import SVDD
from svattn.cli import main as cli_main
from svattn.estimators import ForgetReceipt, verify_forget_receipt
from svattn.estimators.weighted import WeightedMemory, weight_digest
from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import gram_matrix
from svattn.exact.oracle import kkt_residual, solve_svdd
from svattn.exact.records.signing import write_keypair


def _data(n: int = 80, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(3, d))
    X = centers[rng.integers(0, 3, n)] + rng.normal(size=(n, d))
    w = rng.integers(0, 4, n).astype(float)
    w[:3] = (1.0, 2.0, 3.0)  # (never all zero)
    probes = np.concatenate([X[::2], rng.normal(scale=3.0, size=(40, d))])
    return X, w, probes


def _gap(a: SVDD, b: SVDD, probes) -> float:
    return float(np.abs(a.decision_function(probes) - b.decision_function(probes)).max())


PARAMS = [dict(nu=0.2), dict(nu=0.5, gamma=0.3), dict(C=0.04, gamma=0.5),
          dict(C=0.05, kernel="exp", gamma=0.1)]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_integer_weight_equals_copies_and_zero_equals_removal(params):
    X, w, probes = _data()
    weighted = SVDD(**params).fit(X, sample_weight=w)
    copies = SVDD(**params).fit(np.repeat(X, w.astype(int), axis=0))
    assert isinstance(weighted.memory_, WeightedMemory)
    assert weighted.gamma_ == pytest.approx(copies.gamma_, rel=1e-13)  # weighted variance
    assert _gap(weighted, copies, probes) <= 1e-9
    np.testing.assert_array_equal(weighted.predict(probes), copies.predict(probes))
    assert weighted.offset_ == pytest.approx(copies.offset_, abs=1e-9)
    # zero weights: the rows are held, never support vectors, and change nothing
    zero = np.flatnonzero(w == 0)
    assert weighted.n_samples_ == len(X) and not set(weighted.support_) & set(zero)
    np.testing.assert_array_equal(weighted.weights_, w)
    ones = np.where(w > 0, 1.0, 0.0)
    dropped = SVDD(**params).fit(X, sample_weight=ones)
    kept = SVDD(**{**params, "gamma": dropped.gamma_}).fit(X[w > 0])
    if "nu" in params:  # (nu: C_ = 1 / (nu Σw), the same for both)
        assert dropped.C_ == pytest.approx(kept.C_, rel=1e-15)
    assert _gap(dropped, kept, probes) <= 1e-9


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_weighted_fit_is_the_reference_solvers_per_sample_box_optimum(params):
    X, w, _ = _data(seed=1)
    model = SVDD(**params).fit(X, sample_weight=w)
    on = w > 0
    K = gram_matrix(X[on], model.memory_.kernel, model.gamma_)
    box = w[on] * model.C_
    reference = solve_svdd(K, box)
    alpha = np.zeros(len(X))
    alpha[model.support_] = model.dual_coef_.ravel() * model.C_
    assert np.abs(alpha[on] - reference).max() <= 1e-9
    assert np.all(alpha[~on] == 0.0)
    assert model.memory_.kkt_residual() <= 1e-9
    if "nu" in params:  # C_ = 1 / (nu Σw): Σ dual_coef_ = nu Σw, libsvm's
        assert model.dual_coef_.sum() == pytest.approx(params["nu"] * w.sum(), rel=1e-12)


def test_per_token_boxes_in_the_oracle():
    X, w, _ = _data(n=40, seed=2)
    K = gram_matrix(X, "rbf", 0.4)
    a, mu = solve_svdd(K, 0.05, return_mu=True)
    b, nu = solve_svdd(K, np.full(40, 0.05), return_mu=True)  # equal boxes: the scalar's
    assert np.abs(a - b).max() <= 1e-12 and mu == pytest.approx(nu, abs=1e-12)
    box = 0.02 * (1.0 + w)
    c, m = solve_svdd(K, box, return_mu=True)
    assert np.all(c <= box) and kkt_residual(K, c, m, box) <= 1e-12
    assert np.array_equal(solve_svdd(K, np.full(40, 0.01)), np.full(40, 0.01) / 0.4)  # infeasible
    for bad in (np.zeros(40), np.full(39, 0.1), np.r_[np.full(39, 0.1), np.nan]):
        with pytest.raises(ValueError, match="per-token boxes"):
            solve_svdd(K, bad)


def test_weighted_fit_matches_one_class_svm_with_sample_weight():
    X, w, probes = _data(n=150, seed=3)
    w = np.where(w == 0, 0.5, w) * 0.7  # (libsvm drops zero-weight rows from support_)
    ours = SVDD(nu=0.2, gamma=0.3).fit(X, sample_weight=w)
    libsvm = OneClassSVM(nu=0.2, gamma=0.3, tol=1e-12, shrinking=False).fit(X, sample_weight=w)
    scale = max(1.0, float(np.abs(libsvm.decision_function(probes)).max()))
    # libsvm's float32 kernel cache: measured 5.8e-8 on a smaller set; 1e-6 · scale as in
    # tests/test_estimators.py
    np.testing.assert_allclose(ours.decision_function(probes),
                               libsvm.decision_function(probes), rtol=0, atol=1e-6 * scale)
    assert ours.offset_ == pytest.approx(float(libsvm.offset_[0]), abs=1e-6 * scale)
    beta = np.zeros(len(X))
    beta[libsvm.support_] = libsvm.dual_coef_.ravel()
    mine = np.zeros(len(X))
    mine[ours.support_] = ours.dual_coef_.ravel()
    assert np.abs(mine - beta).max() <= 5e-6


def test_equal_weights_keep_the_incremental_core_with_box_w_times_C():
    X, _, probes = _data(seed=4)
    model = SVDD(C=0.04, gamma=0.5).fit(X, sample_weight=np.full(len(X), 2.5))
    assert isinstance(model.memory_, SVDDMemory) and model.memory_.C == pytest.approx(0.1)
    assert model.C_ == 0.04 and np.all(model.weights_ == 2.5)
    plain = SVDD(C=0.1, gamma=0.5).fit(X)
    assert _gap(model, SVDD(**{"C": 0.04, "gamma": 0.5}).fit(X, sample_weight=2.5), probes) == 0
    # the same alpha; the attributes' scale is C_ (libsvm's dual_coef_ = alpha / C_)
    assert np.abs(model.decision_function(probes) * 0.04 - plain.decision_function(probes) * 0.1
                  ).max() <= 1e-12
    nu = SVDD(nu=0.2).fit(X, sample_weight=np.full(len(X), 3.0))
    same = SVDD(nu=0.2).fit(X)
    assert nu.memory_.C == pytest.approx(same.memory_.C, rel=1e-14)  # 1 / (nu n) both
    assert nu.C_ == pytest.approx(same.C_ / 3.0) and nu.nu_ == pytest.approx(0.2)
    # rows of the same weight: incremental; another weight: the weighted solver
    model.partial_fit(X[:4] + 0.1, sample_weight=[2.5] * 4)
    assert isinstance(model.memory_, SVDDMemory)
    model.partial_fit(X[:2] + 0.2, sample_weight=[1.0, 0.0])
    assert isinstance(model.memory_, WeightedMemory)
    rows = np.concatenate([X, X[:4] + 0.1, X[:2] + 0.2])
    weights = np.r_[np.full(len(X) + 4, 2.5), 1.0, 0.0]
    fresh = SVDD(**model.refit_recipe()).fit(rows, sample_weight=weights)
    assert _gap(model, fresh, probes) <= 1e-9
    np.testing.assert_array_equal(model.weights_, weights)


@pytest.mark.parametrize("params", [dict(nu=0.3), dict(C=0.05, gamma=0.4)], ids=str)
def test_partial_fit_and_forget_under_weights_equal_a_fresh_weighted_fit(params, tmp_path):
    X, w, probes = _data(n=90, seed=5)
    key, pub = write_keypair(tmp_path / "controller")
    model = SVDD(**params, signing_key=str(key)).fit(X[:60], sample_weight=w[:60])
    model.partial_fit(X[60:], sample_weight=w[60:])
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(X, sample_weight=w)
    assert _gap(model, fresh, probes) <= 1e-9
    gone = [0, 5, 7, 61] + [int(i) for i in np.flatnonzero(w == 0)[:2]]  # zero rows too
    receipt = model.forget(ids=gone)
    keep = np.setdiff1d(np.arange(len(X)), gone)
    refit = SVDD(**receipt.refit_with).fit(X[keep], sample_weight=w[keep])
    assert _gap(model, refit, probes) <= 1e-9
    assert receipt.weights["removed"] == [float(w[i]) for i in gone]
    assert receipt.weights["sha256"] == weight_digest(w[keep])
    assert receipt.weights["sum"] == pytest.approx(w[keep].sum())
    assert receipt.n_samples == len(keep) and receipt.signature is not None
    assert "a weighted re-solve" in receipt.summary()
    check = verify_forget_receipt(model, receipt, public_key=pub)
    assert check.ok, check.reasons
    back = ForgetReceipt.from_json(receipt.to_json())
    assert back == receipt and verify_forget_receipt(model, back, public_key=pub).ok
    forged = json.loads(receipt.to_json())
    forged["weights"]["removed"][0] = 9.0  # the signature binds the weights declared
    assert not verify_forget_receipt(model, ForgetReceipt.from_json(json.dumps(forged)),
                                     public_key=pub).ok
    other = ForgetReceipt.from_json(receipt.to_json().replace(receipt.weights["sha256"],
                                                              "0" * 64))
    assert any(r.startswith("weights") for r in verify_forget_receipt(model, other).reasons)
    with pytest.raises(ValueError, match="not held"):
        model.forget(ids=[gone[-1]])
    # saved right after the forget: the command line verifies the receipt (exit 0)
    model.save(tmp_path / "model")
    (tmp_path / "receipt.json").write_text(receipt.to_json())
    assert cli_main(["verify-forget-receipt", str(tmp_path / "model"),
                     str(tmp_path / "receipt.json"), "--public-key", str(pub)]) == 0


def test_uniform_weight_receipts_declare_the_weight():
    X, _, probes = _data(seed=6)
    model = SVDD(C=0.03, gamma=0.5).fit(X, sample_weight=2.0)
    receipt = model.forget(ids=[3, 4])
    assert receipt.weights == {"uniform": 2.0} and receipt.certificates
    assert verify_forget_receipt(model, receipt).ok
    keep = np.setdiff1d(np.arange(len(X)), [3, 4])
    refit = SVDD(**receipt.refit_with).fit(X[keep], sample_weight=np.full(len(keep), 2.0))
    assert _gap(model, refit, probes) <= 1e-9
    plain = SVDD(C=0.03, gamma=0.5).fit(X).forget(ids=[3])
    assert plain.weights is None and "weights" not in plain.to_dict()  # as before weights


BAD = [(np.full(79, 1.0), "one weight per row"), (np.ones((80, 2)), "1-D"),
       (np.r_[-1.0, np.ones(79)], ">= 0"), (np.r_[np.nan, np.ones(79)], "finite"),
       (np.r_[np.inf, np.ones(79)], "finite"), (np.zeros(80), "zero"),
       ("heavy", "array of numbers")]


@pytest.mark.parametrize("bad, match", BAD, ids=[m for _, m in BAD])
def test_bad_weights_are_refused_and_the_model_is_unchanged(bad, match):
    X, w, probes = _data()
    model = SVDD(nu=0.3).fit(X, sample_weight=w)
    before = (model.memory_.state_digest(), model.decision_function(probes))
    with pytest.raises(ValueError, match="sample_weight") as err:
        model.fit(X, sample_weight=bad)
    assert match in str(err.value)
    if match != "zero":  # (a partial fit may add rows of weight 0)
        with pytest.raises(ValueError, match="sample_weight"):
            model.partial_fit(X[:80], sample_weight=bad)
    assert model.memory_.state_digest() == before[0]
    np.testing.assert_array_equal(model.decision_function(probes), before[1])


def test_unequal_weights_refuse_audit_logs_and_subjects(tmp_path):
    X, w, _ = _data()
    with pytest.raises(ValueError, match="sample_weight.*audit_log"):
        SVDD(nu=0.3, audit_log=tmp_path / "log").fit(X, sample_weight=w)
    assert not (tmp_path / "log").exists()
    model = SVDD(nu=0.3, audit_log=tmp_path / "log2").fit(X)
    digest = model.memory_.state_digest()
    with pytest.raises(ValueError, match="sample_weight.*audit_log"):
        model.partial_fit(X[:2], sample_weight=[1.0, 2.0])
    assert model.memory_.state_digest() == digest and isinstance(model.memory_, SVDDMemory)
    key, _ = write_keypair(tmp_path / "controller")
    subjects = ["p1"] * 5 + [None] * (len(X) - 5)
    with pytest.raises(ValueError, match="sample_weight.*subjects"):
        SVDD(nu=0.3, signing_key=str(key)).fit(X, sample_weight=w, subjects=subjects)
    model = SVDD(nu=0.3, signing_key=str(key)).fit(X, subjects=subjects)
    with pytest.raises(ValueError, match="sample_weight.*subjects"):
        model.partial_fit(X[:2] + 1.0, sample_weight=[1.0, 2.0])
    assert len(model.forget(subject="p1").ids) == 5  # still the core's, erasing a subject


def test_weights_survive_save_load_and_pickle(tmp_path):
    X, w, probes = _data(seed=7)
    for weights, name in ((w, "weighted"), (np.full(len(X), 1.5), "uniform")):
        model = SVDD(nu=0.25).fit(X, sample_weight=weights)
        model.save(tmp_path / name)
        loaded = SVDD.load(tmp_path / name)
        assert type(loaded.memory_) is type(model.memory_)
        np.testing.assert_array_equal(loaded.weights_, weights)
        np.testing.assert_array_equal(loaded.decision_function(probes),
                                      model.decision_function(probes))
        copy = pickle.loads(pickle.dumps(model))
        np.testing.assert_array_equal(copy.weights_, weights)
        np.testing.assert_array_equal(copy.decision_function(probes),
                                      model.decision_function(probes))
        receipt = loaded.forget(ids=[1])  # a loaded model goes on learning and forgetting
        keep = np.setdiff1d(np.arange(len(X)), [1])
        refit = SVDD(**receipt.refit_with).fit(X[keep], sample_weight=weights[keep])
        assert _gap(loaded, refit, probes) <= 1e-9
    memory = SVDD(nu=0.25).fit(X, sample_weight=w).memory_
    state = memory.__getstate__()
    state["weights"] = state["weights"] * 2.0  # the arrays no longer match their digest
    with pytest.raises(ValueError, match="digest"):
        WeightedMemory.__new__(WeightedMemory).__setstate__(state)
    state = tmp_path / "weighted" / "memory.safetensors"
    data = bytearray(state.read_bytes())
    data[-9] ^= 1  # one flipped bit in the arrays
    state.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        SVDD.load(tmp_path / "weighted")


def test_infeasible_weighted_boxes_warn_and_follow_the_copies():
    X, w, probes = _data(n=30, seed=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = SVDD(C=0.01, gamma=0.5).fit(X, sample_weight=w)
    assert any("sum to" in str(c.message) for c in caught)
    copies = SVDD(C=0.01, gamma=0.5).fit(np.repeat(X, w.astype(int), axis=0))
    assert _gap(model, copies, probes) <= 1e-9


def test_the_guides_figures_are_the_records():
    """docs/usage.md's sample-weight figures are results/bench_sample_weight.json's."""
    root = Path(__file__).resolve().parents[2]
    text = " ".join((root / "docs" / "usage.md").read_text().split())
    rows = json.loads((root / "results" / "bench_sample_weight.json").read_text())["rows"]
    tight, low, high, copies = (float(x) for x in re.search(
        r"within (\S+) of `OneClassSVM\(tol=1e-12, shrinking=False\)` fitted with the same "
        r"`sample_weight` \((\S+) … (\S+) with its defaults\), within (\S+) of the fit",
        text).groups())
    assert max(r["decision_dev_tight"] for r in rows) <= tight
    assert f"{min(r['decision_dev_default'] for r in rows):.1e}" == f"{low:.1e}"
    assert f"{max(r['decision_dev_default'] for r in rows):.1e}" == f"{high:.1e}"
    assert max(r["decision_dev_copies"] for r in rows) <= copies
    fit = re.search(r"weighted fit took (\S+)–(\S+)× `OneClassSVM.fit`", text).groups()
    assert fit == tuple(f"{f(r['ratio_fit'] for r in rows):.1f}" for f in (min, max))
    forget = re.search(r"a forget of one row (\S+)× a fresh weighted fit", text).group(1)
    assert all(f"{r['ratio_forget_vs_refit']:.2f}" == forget for r in rows)
    assert all(r["decision_dev_forget_vs_refit"] == 0.0 for r in rows)


def test_a_model_left_with_zero_weights_only_says_so():
    X, _, probes = _data(n=6, seed=9)
    model = SVDD(nu=0.5, gamma=0.5).fit(X, sample_weight=[1, 2, 0, 0, 0, 0])
    with pytest.warns(UserWarning, match="no row held carries a non-zero sample_weight"):
        model.forget(ids=[0, 1])
    assert model.n_samples_ == 4 and len(model.support_) == 0
    assert np.all(model.predict(probes) == -1)
