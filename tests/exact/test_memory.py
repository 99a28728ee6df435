"""SVDDMemory: exactness after every add and remove, against the independent oracle."""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import gram, partition_ids, retrain
from svattn.exact import SVDDMemory
from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.kernels import biased_softmax_readout, kernel_diag, kernel_matrix

STREAMS = [
    # (d, n, C, kernel)
    pytest.param(2, 300, 0.02, "rbf", id="d2-n300-C.02-rbf"),
    pytest.param(2, 200, 0.5, "rbf", id="d2-n200-C.5-rbf"),
    pytest.param(8, 400, 1.5 / 400, "rbf", id="d8-n400-C1.5/n-rbf"),
    pytest.param(8, 300, 0.05, "exp", id="d8-n300-C.05-exp"),
    pytest.param(64, 300, 0.01, "rbf", id="d64-n300-C.01-rbf"),
    pytest.param(64, 200, 0.02, "exp", id="d64-n200-C.02-exp"),
    pytest.param(8, 100, 1.0, "rbf", id="d8-n100-C1-rbf"),
]


def _keys(d: int, n: int, kernel: str, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, d))
    # keep exp-kernel diagonals moderate (exp(gamma |x|^2) with gamma = 1/sqrt(d))
    return X / np.sqrt(np.sqrt(d)) if kernel == "exp" else X


@pytest.mark.parametrize("d,n,C,kernel", STREAMS)
def test_every_add_and_remove_keeps_kkt_and_matches_retrain(d, n, C, kernel):
    X = _keys(d, n, kernel, seed=d * 1000 + n)
    mem = SVDDMemory(C, kernel)
    worst = 0.0
    for x in X:
        mem.add(x)
        worst = max(worst, mem.kkt_residual())
    assert worst <= 1e-10
    alpha_r, mu_r = retrain(mem)
    assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9
    scale = max(1.0, float(kernel_diag(X, kernel, mem.gamma_value).max()))
    assert abs(mem.mu - mu_r) <= 1e-9 * scale
    assert mem.unique_optimum()
    assert mem.partition() == partition_ids(mem, alpha_r)

    # remove a third of the tokens in random order, checking after each removal
    rng = np.random.default_rng(n)
    order = rng.permutation(mem.ids)[: n // 3]
    for tid in order:
        mem.remove(int(tid))
        worst = max(worst, mem.kkt_residual())
    assert worst <= 1e-10
    alpha_r, _ = retrain(mem)
    assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9
    assert mem.partition() == partition_ids(mem, alpha_r)


@pytest.mark.slow  # the soaks (-m slow) run longer streams
def test_long_stream_n2000():
    X = np.random.default_rng(7).normal(size=(2000, 8))
    mem = SVDDMemory(0.004)
    mem.extend(X)
    assert mem.kkt_residual() <= 1e-10
    alpha_r, _ = retrain(mem)
    assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9
    assert mem.partition() == partition_ids(mem, alpha_r)
    for tid in mem.support_ids()[:50]:  # the expensive removals: margin and error tokens
        mem.remove(tid)
        assert mem.kkt_residual() <= 1e-10
    alpha_r, _ = retrain(mem)
    assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_add_then_remove_restores_never_added(kernel):
    rng = np.random.default_rng(3)
    base = _keys(6, 120, kernel, seed=11)
    probes = np.concatenate([base[:5] + 0.01, 3.0 * rng.normal(size=(5, 6))])
    ref = SVDDMemory(0.05, kernel)
    ref.extend(base)
    for x in probes:  # inliers (reserve) and outliers (error/margin)
        mem = SVDDMemory(0.05, kernel)
        mem.extend(base)
        tid = mem.add(x)
        mem.remove(tid)
        assert mem.ids == ref.ids
        assert mem.partition() == ref.partition()
        assert np.max(np.abs(mem.alpha - ref.alpha)) <= 1e-10
        assert abs(mem.mu - ref.mu) <= 1e-10 * max(1.0, float(kernel_diag(base, kernel,
                                                                           ref.gamma_value).max()))


def test_state_depends_on_the_set_not_the_order():
    X = np.random.default_rng(5).normal(size=(150, 4))
    a = SVDDMemory(0.03)
    a.extend(X)
    perm = np.random.default_rng(6).permutation(150)
    b = SVDDMemory(0.03)
    b.extend(X[perm])
    alpha_b = np.empty(150)
    alpha_b[perm] = b.alpha  # b's token i holds key perm[i]
    assert np.max(np.abs(a.alpha - alpha_b)) <= 1e-10
    # also after removing the same keys from both
    gone = [0, 5, 17, 33, 90]
    for k in gone:
        a.remove(k)
        b.remove(int(np.flatnonzero(perm == k)[0]))
    keep = [i for i in range(150) if i not in gone]
    alpha_b2 = dict(zip([int(perm[t]) for t in b.ids], b.alpha, strict=True))
    assert np.max(np.abs(a.alpha - np.array([alpha_b2[i] for i in keep]))) <= 1e-10


def test_extend_equals_repeated_add():
    X = np.random.default_rng(8).normal(size=(300, 16))
    a = SVDDMemory(0.02)
    ids_a = a.extend(X)
    b = SVDDMemory(0.02)
    ids_b = [b.add(x) for x in X]
    assert ids_a == ids_b == list(range(300))
    assert a.partition() == b.partition()
    assert np.max(np.abs(a.alpha - b.alpha)) <= 1e-12


def test_sklearn_one_class_svm_agrees():
    # libsvm caches the kernel in float32 and stops at its own tolerance. Observed
    # max |Δalpha|: 2.3e-9 on this problem, 7.9e-10 at n=1000/d=8/C=0.01, and
    # 7.5e-7 at n=500/d=2/C=0.05, where K is ill-conditioned.
    from sklearn.svm import OneClassSVM

    X = np.random.default_rng(9).normal(size=(300, 5))
    C = 0.02
    mem = SVDDMemory(C)
    mem.extend(X)
    oc = OneClassSVM(kernel="rbf", gamma=1 / 5, nu=1 / (C * 300), tol=1e-12).fit(X)
    alpha_sk = np.zeros(300)
    alpha_sk[oc.support_] = oc.dual_coef_[0] / oc.dual_coef_[0].sum()
    assert np.max(np.abs(mem.alpha - alpha_sk)) <= 1e-6
    assert set(mem.support_ids()) == set(int(i) for i in oc.support_[alpha_sk[oc.support_] > 1e-7])


def test_readout_is_the_biased_softmax_and_stable():
    X = np.random.default_rng(10).normal(size=(80, 3))
    V = np.random.default_rng(11).normal(size=(80, 2))
    mem = SVDDMemory(0.1)
    mem.extend(X, V)
    q = np.random.default_rng(12).normal(size=(7, 3))
    K = kernel_matrix(q, mem.keys, "rbf", mem.gamma_value)
    w = K * mem.alpha
    ratio = (w @ mem.values) / w.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(mem.readout(q), ratio, rtol=1e-12, atol=1e-14)
    # far queries: the raw ratio underflows to 0/0, the biased softmax does not
    far = np.full((1, 3), 200.0)
    out = mem.readout(far)
    assert np.all(np.isfinite(out))
    assert mem.readout(q[0]).shape == (2,)


def test_decision_function_sign_and_formula():
    X = np.random.default_rng(13).normal(size=(200, 2))
    mem = SVDDMemory(0.02)
    mem.extend(X)
    assert mem.decision_function(np.zeros(2)) > 0  # the centre is inside
    assert mem.decision_function(np.array([8.0, 8.0])) < 0  # far away is outside
    # R^2 − ‖phi(x) − a‖^2 with R^2 read off a margin token
    a = mem.alpha
    Kxx = gram(mem)
    aKa = a @ Kxx @ a
    m = mem.ids.index(mem.partition()["margin"][0])
    R2 = Kxx[m, m] - 2 * Kxx[m] @ a + aKa
    x = np.array([[0.3, -0.2]])
    kx = kernel_matrix(x, mem.keys, "rbf", mem.gamma_value)[0]
    dist2 = 1.0 - 2 * kx @ a + aKa
    np.testing.assert_allclose(mem.decision_function(x), [R2 - dist2], atol=1e-12)


def test_compact_is_certified_selection():
    X = np.random.default_rng(14).normal(size=(300, 4))
    V = np.random.default_rng(15).normal(size=(300, 3))
    mem = SVDDMemory(0.02)
    mem.extend(X, V)
    q = np.random.default_rng(16).normal(size=(50, 4)) * 2
    before = mem.readout(q)
    before_dec = mem.decision_function(q)
    reserve = mem.partition()["reserve"]
    dropped = mem.compact()
    assert dropped == reserve and len(dropped) > 0
    assert mem.ids == mem.support_ids()
    assert np.max(np.abs(mem.readout(q) - before)) <= 1e-12
    assert np.max(np.abs(mem.decision_function(q) - before_dec)) <= 1e-12
    assert mem.kkt_residual() <= 1e-10


def test_margin_system_inverse():
    mem = SVDDMemory(0.05)
    mem.extend(np.random.default_rng(17).normal(size=(100, 3)))
    ms = mem.margin_system()
    idx = [mem.ids.index(t) for t in ms.margin]
    K = gram(mem)[np.ix_(idx, idx)]
    Q = np.block([[np.zeros((1, 1)), np.ones((1, len(idx)))], [np.ones((len(idx), 1)), 2 * K]])
    np.testing.assert_allclose(ms.Qinv @ Q, np.eye(len(idx) + 1), atol=1e-9)


def test_removal_never_leaves_residue_in_arrays():
    X = np.random.default_rng(18).normal(size=(60, 3)) + 10.0  # distinctive values
    V = np.random.default_rng(19).normal(size=(60, 2)) + 50.0
    mem = SVDDMemory(0.05)
    mem.extend(X, V)
    victim = mem.support_ids()[0]
    mem.remove(victim)
    for arr in (mem.solver_state.X, mem.solver_state.V, mem.solver_state.XC):
        assert not np.any(np.all(np.isclose(arr, X[victim]), axis=-1)) if arr.shape[-1] == 3 else \
            not np.any(np.all(np.isclose(arr, V[victim]), axis=-1))
    assert victim not in mem.solver_state.id_to_slot


class TestWarmupConvention:
    def test_uniform_until_threshold_then_exact(self):
        C = 0.1
        assert warmup_threshold(C) == 10
        X = np.random.default_rng(20).normal(size=(30, 3))
        mem = SVDDMemory(C)
        for i in range(9):
            mem.add(X[i])
            assert mem.warm
            np.testing.assert_array_equal(mem.alpha, np.full(i + 1, 1.0 / (i + 1)))
            assert mem.support_ids() == mem.ids
        mem.add(X[9])
        assert not mem.warm  # n·C = 1: all at the bound
        np.testing.assert_allclose(mem.alpha, np.full(10, C), atol=1e-15)
        assert mem.partition()["error"] == list(range(10)) and mem.kkt_residual() <= 1e-10
        mem.extend(X[10:])
        # removal through the threshold and back stays exact
        for tid in list(mem.ids)[:25]:
            mem.remove(tid)
            assert mem.kkt_residual() <= 1e-10
            if not mem.warm:
                alpha_r, _ = retrain(mem)
                assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9
        assert mem.warm and len(mem) == 5
        np.testing.assert_array_equal(mem.alpha, np.full(5, 0.2))

    def test_n_times_C_exactly_one(self):
        mem = SVDDMemory(1 / 3)
        mem.extend(np.random.default_rng(21).normal(size=(3, 2)))
        assert not mem.warm
        assert mem.partition() == {"margin": [], "error": [0, 1, 2], "reserve": []}
        mem.add(np.array([5.0, 5.0]))  # an outlier joins with an empty margin set
        assert mem.kkt_residual() <= 1e-10
        alpha_r, _ = retrain(mem)
        np.testing.assert_allclose(mem.alpha, alpha_r, atol=1e-12)


class TestDegenerate:
    def test_single_token(self):
        mem = SVDDMemory(1.0)
        tid = mem.add([1.0, 2.0])
        np.testing.assert_array_equal(mem.alpha, [1.0])
        assert mem.kkt_residual() == 0.0
        np.testing.assert_allclose(mem.readout(np.zeros(2)), [1.0, 2.0])
        mem.remove(tid)
        assert len(mem) == 0

    @pytest.mark.parametrize("C", [1.0, 2.5])
    def test_C_at_least_one(self, C):
        X = np.random.default_rng(22).normal(size=(50, 3))
        mem = SVDDMemory(C)
        mem.extend(X)
        assert mem.kkt_residual() <= 1e-10
        alpha_r, _ = retrain(mem)
        np.testing.assert_allclose(mem.alpha, alpha_r, atol=1e-9)

    def test_all_tokens_at_the_bound(self):
        X = np.random.default_rng(23).normal(size=(40, 3))
        mem = SVDDMemory(1 / 40)
        mem.extend(X)
        np.testing.assert_allclose(mem.alpha, np.full(40, 1 / 40), atol=1e-15)
        assert mem.partition()["margin"] == []
        mem.remove(7)
        assert mem.warm  # 39 tokens cannot carry weight 1 at C = 1/40

    def test_duplicate_keys_are_flagged_not_claimed_exact(self):
        rng = np.random.default_rng(24)
        X = rng.normal(size=(60, 3))
        mem = SVDDMemory(0.05)
        mem.extend(X)
        margin_key = mem.keys[mem.ids.index(mem.partition()["margin"][0])]
        mem.add(margin_key.copy())  # an exact copy of a margin token
        mem.add(X[0].copy())
        assert mem.kkt_residual() <= 1e-10
        assert not mem.unique_optimum()
        # the decision function is unique even when alpha is not
        alpha_r, mu_r = retrain(mem)
        q = rng.normal(size=(20, 3))
        Kq = kernel_matrix(q, mem.keys, "rbf", mem.gamma_value)
        np.testing.assert_allclose(mem.decision_function(q), 2 * Kq @ alpha_r - 1 + mu_r,
                                   atol=1e-9)
        ref = biased_softmax_readout(q, mem.keys, mem.values, alpha_r, "rbf", mem.gamma_value)
        assert np.all(np.isfinite(ref))

    def test_many_copies_of_one_key(self):
        x = np.array([0.5, -0.5])
        mem = SVDDMemory(0.1)
        for _ in range(30):
            mem.add(x)
        assert mem.kkt_residual() <= 1e-10
        np.testing.assert_allclose(mem.readout(np.zeros(2)), x)
        for tid in list(mem.ids)[:25]:
            mem.remove(tid)
            assert mem.kkt_residual() <= 1e-10


def test_a_huge_exp_kernel_diagonal_does_not_hide_an_outside_row():
    # found by tests/exact/test_persist_fuzz.py: the add path's tie was scaled by the
    # largest diagonal in the memory (1.6e18 here), so a new row at g = -1.08
    # was stored as a reserve token and the KKT residual jumped to 0.21
    rng = np.random.default_rng(18609)
    mem = SVDDMemory(0.5, "exp")
    mem.extend(rng.normal(size=(1, 4)) * 0.5)
    mem.add(rng.normal(size=4) * 3)
    assert mem.solver_state.diag[: mem.solver_state.hi].max() > 1e17
    tid = mem.add(rng.normal(size=4) * 1e-3)
    assert mem.kkt_residual() <= 1e-10
    assert tid in mem.support_ids()


def test_the_equal_rows_shortcut_agrees_with_the_gram_test():
    """``has_equal_rows`` is only a shortcut: on sets with and without bitwise copies,
    the Cholesky test of the Gram matrix gives the same answer (singular with copies)."""
    from svattn.exact.core.kernels import gram_matrix, has_equal_rows

    rng = np.random.default_rng(5)
    for copies in (0, 1, 3):
        X = rng.normal(size=(12, 4))
        if copies:
            X[-copies:] = X[:copies]
        K = gram_matrix(X, "rbf", 0.25)
        shifted = K - 1e-10 * np.trace(K) * np.eye(len(X))
        try:
            np.linalg.cholesky(shifted)
            definite = True
        except np.linalg.LinAlgError:
            definite = False
        assert has_equal_rows(X) == bool(copies)
        assert definite == (not copies)
    assert not has_equal_rows(np.array([[0.0, 1.0], [-0.0, 1.0]]))  # bitwise, not numeric
