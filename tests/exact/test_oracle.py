"""Tests of the independent SVDD oracle (``svattn.exact.oracle``)."""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest

from svattn.exact import oracle
from svattn.exact.core.conventions import mu_for_empty_margin
from svattn.exact.core.kernels import default_gamma, kernel_matrix
from svattn.exact.oracle import kkt_residual, partition, solve_svdd, svdd_objective


def gram(x: np.ndarray, kernel: str, gamma: float | None = None) -> np.ndarray:
    g = default_gamma(kernel, x.shape[1]) if gamma is None else gamma
    return kernel_matrix(x, x, kernel, g)


# --------------------------------------------------------------------------- #
# brute-force reference                                                        #
# --------------------------------------------------------------------------- #


def brute_force(K: np.ndarray, C: float, feas_tol: float = 1e-10) -> list[np.ndarray]:
    """Every alpha that satisfies KKT on some partition (S, E, R), by enumeration.

    For each of the 3^n assignments: S empty needs C·|E| = 1 and a mu with
    g_E <= 0 <= g_R; otherwise solve the bordered system with numpy and keep
    it when 0 <= alpha_S <= C, g_E <= 0, g_R >= 0 (to ``feas_tol``).
    """
    n = K.shape[0]
    d = np.diag(K)
    found = []
    for assign in itertools.product((0, 1, 2), repeat=n):
        a = np.asarray(assign)
        S, E, R = np.flatnonzero(a == 1), np.flatnonzero(a == 2), np.flatnonzero(a == 0)
        alpha = np.zeros(n)
        alpha[E] = C
        if S.size == 0:
            if abs(C * E.size - 1.0) > 1e-12:
                continue
            grad = 2 * K @ alpha - d
            lo = np.max(-grad[R], initial=-np.inf)  # mu >= -grad_R
            hi = np.min(-grad[E])  # mu <= -grad_E
            if lo <= hi + feas_tol:
                found.append(alpha)
            continue
        m = S.size
        M = np.zeros((m + 1, m + 1))
        M[:m, :m] = 2 * K[np.ix_(S, S)]
        M[:m, m] = 1
        M[m, :m] = 1
        if np.linalg.cond(M) > 1e10:
            continue
        rhs = np.append(d[S] - 2 * C * K[np.ix_(S, E)].sum(axis=1), 1 - C * E.size)
        sol = np.linalg.solve(M, rhs)
        alpha[S] = sol[:m]
        g = 2 * K @ alpha - d + sol[m]
        if (
            np.all(alpha[S] >= -feas_tol)
            and np.all(alpha[S] <= C + feas_tol)
            and np.all(g[E] <= feas_tol)
            and np.all(g[R] >= -feas_tol)
        ):
            found.append(alpha)
    return found


def _tiny_cases():
    cases = []
    for kernel, d, n in [("rbf", 2, 5), ("rbf", 8, 6), ("exp", 2, 6), ("exp", 4, 7)]:
        for C in ("1.5/n", "3/n", 1.0, 2.5, "1/n"):
            cases.append((kernel, d, n, C))
    return cases


@pytest.mark.parametrize(("kernel", "d", "n", "C"), _tiny_cases())
def test_matches_brute_force(kernel, d, n, C):
    rng = np.random.default_rng(zlib.crc32(f"{kernel}-{d}-{n}-{C}".encode()))
    Cv = {"1.5/n": 1.5 / n, "3/n": 3.0 / n, "1/n": 1.0 / n}.get(C, C)
    worst = 0.0
    for _ in range(2):
        x = rng.standard_normal((n, d))
        K = gram(x, kernel)
        cands = brute_force(K, Cv)
        assert cands, "brute force found no KKT point"
        # K is positive definite here: the optimum (hence every KKT point) is unique.
        spread = max(np.max(np.abs(c - cands[0])) for c in cands)
        assert spread <= 1e-10
        alpha = solve_svdd(K, Cv)
        err = float(np.max(np.abs(alpha - cands[0])))
        worst = max(worst, err)
        # Observed: <= 2.2e-16 on all of these (brute-force K has cond <= 5e5).
        assert err <= 1e-12, (kernel, d, n, Cv, err)
        if Cv == 1.0 / n:
            assert np.all(alpha == Cv)


def test_brute_force_with_duplicate_keys():
    # Duplicates make alpha non-unique; the objective and K·alpha are unique.
    rng = np.random.default_rng(7)
    base = rng.standard_normal((4, 3))
    x = np.vstack([base, base[[0, 2]]])  # n = 6, keys 4, 5 copy keys 0, 2
    for kernel in ("rbf", "exp"):
        K = gram(x, kernel)
        for C in (1.5 / 6, 0.3, 1.0):
            cands = brute_force(K, C)
            assert cands
            alpha, mu = solve_svdd(K, C, return_mu=True)
            assert kkt_residual(K, alpha, mu, C) <= 1e-12
            ref = cands[0]
            assert abs(svdd_objective(K, alpha) - svdd_objective(K, ref)) <= 1e-12
            assert np.max(np.abs(K @ alpha - K @ ref)) <= 1e-12 * np.max(np.diag(K))


# --------------------------------------------------------------------------- #
# outside cross-checks                                                         #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("d", "n", "Cmul"), [(2, 60, 1.5), (8, 80, 4.0), (8, 120, 10.0)])
def test_matches_sklearn_one_class_svm(d, n, Cmul):
    svm = pytest.importorskip("sklearn.svm")
    rng = np.random.default_rng(100 + d + n)
    x = rng.standard_normal((n, d))
    gamma = default_gamma("rbf", d)
    C = Cmul / n
    ocs = svm.OneClassSVM(kernel="rbf", gamma=gamma, nu=1.0 / (C * n), tol=1e-12, shrinking=False)
    ocs.fit(x)
    ref = np.zeros(n)
    ref[ocs.support_] = ocs.dual_coef_.ravel() / ocs.dual_coef_.sum()
    alpha = solve_svdd(gram(x, "rbf", gamma), C)
    # libsvm caches the kernel in float32. Observed max |alpha - ref|:
    # 1.3e-9, 2.7e-9, 8.0e-9 on these three problems (~1e-8, what a float32 kernel cache allows).
    assert np.max(np.abs(alpha - ref)) <= 1e-7


def test_objective_matches_piqp():
    piqp = pytest.importorskip("piqp")
    rng = np.random.default_rng(3)
    for kernel in ("rbf", "exp"):
        n = 80
        x = rng.standard_normal((n, 4))
        K = gram(x, kernel)
        C = 3.0 / n
        s = float(np.max(np.diag(K)))
        solver = piqp.DenseSolver()
        solver.settings.eps_abs = 1e-10
        solver.settings.eps_rel = 1e-11
        solver.setup(
            np.asfortranarray(2 * K / s),
            -np.diag(K) / s,
            np.ones((1, n), order="F"),
            np.ones(1),
            None,
            None,
            None,
            np.zeros(n),
            np.full(n, C),
        )
        assert solver.solve() == piqp.PIQP_SOLVED
        ref = np.asarray(solver.result.x)
        alpha = solve_svdd(K, C)
        # The oracle's objective can't be beaten by an independent solver's.
        f, f_ref = svdd_objective(K, alpha), svdd_objective(K, ref)
        assert f <= f_ref + 1e-12 * s
        assert abs(f - f_ref) <= 1e-7 * s
        assert np.max(np.abs(alpha - ref)) <= 1e-5


# --------------------------------------------------------------------------- #
# KKT on random problems                                                       #
# --------------------------------------------------------------------------- #


def _kkt_cases():
    cases = []
    for kernel in ("rbf", "exp"):
        for d in (2, 8, 64):
            cases.append((kernel, d, 500, 1.5 / 500))
            for C in (1.5 / 120, 5.0 / 120, 0.2, 1.0):
                cases.append((kernel, d, 120, C))
    return cases


@pytest.mark.parametrize(("kernel", "d", "n", "C"), _kkt_cases())
def test_kkt_residual_random(kernel, d, n, C):
    rng = np.random.default_rng(int(1000 * C) + 17 * d + n + len(kernel))
    x = rng.standard_normal((n, d))
    K = gram(x, kernel)
    alpha, mu = solve_svdd(K, C, return_mu=True)
    res = kkt_residual(K, alpha, mu, C)
    # Observed <= 2.2e-16 (relative to max diag K) on all of these.
    assert res <= 1e-13
    parts = partition(alpha, C)
    assert np.all(alpha[parts["reserve"]] == 0.0)
    assert np.all(alpha[parts["error"]] == C)
    assert np.all((alpha >= 0) & (alpha <= C))
    # support covers at least ceil(1/C) tokens
    assert len(parts["margin"]) + len(parts["error"]) >= math.ceil(1.0 / C - 1e-12)
    # permuting the tokens permutes the answer (optimum unique: K is PD here
    # except for d = 2 with n = 500, where only K·alpha is compared)
    p = rng.permutation(n)
    alpha_p = solve_svdd(K[np.ix_(p, p)], C)
    scale = float(np.max(np.diag(K)))
    assert np.max(np.abs(K @ alpha - (K[:, p] @ alpha_p))) <= 1e-12 * scale
    if d > 2:
        assert np.max(np.abs(alpha_p - alpha[p])) <= 1e-10


def test_kkt_residual_detects_violations():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 4))
    K = gram(x, "rbf")
    C = 0.1
    alpha, mu = solve_svdd(K, C, return_mu=True)
    assert kkt_residual(K, alpha, mu, C) <= 1e-14
    # g_S off by 1e-6, measured against the size of g_i's terms (<= 4 for rbf)
    assert kkt_residual(K, alpha, mu + 1e-6, C) >= 1e-6 / 4
    bad = alpha.copy()
    bad[partition(alpha, C)["margin"][0]] += 1e-7  # sum off
    assert kkt_residual(K, bad, mu, C) >= 1e-7 * 0.999
    # moving weight between two margin tokens keeps the sum, breaks g
    S = partition(alpha, C)["margin"]
    bad = alpha.copy()
    bad[S[0]] += 1e-6
    bad[S[1]] -= 1e-6
    assert kkt_residual(K, bad, mu, C) > 1e-9


def test_polish_recovers_from_wrong_start(monkeypatch):
    rng = np.random.default_rng(11)
    n = 40
    for kernel in ("rbf", "exp"):
        x = rng.standard_normal((n, 4))
        K = gram(x, kernel)
        for C in (1.5 / n, 4.0 / n, 1.0):
            ref = solve_svdd(K, C)
            for start in (np.ones(n), np.zeros(n), rng.integers(0, 3, n)):
                monkeypatch.setattr(oracle, "_initial_state", lambda *a, s=start: s.astype(np.int8))
                alpha, mu = solve_svdd(K, C, return_mu=True)
                monkeypatch.undo()
                assert kkt_residual(K, alpha, mu, C) <= 1e-13
                assert np.max(np.abs(alpha - ref)) <= 1e-12


def test_polish_cap_raises(monkeypatch):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((40, 4))
    K = gram(x, "rbf")
    monkeypatch.setattr(oracle, "_initial_state", lambda *a: np.ones(40, dtype=np.int8))
    with pytest.raises(RuntimeError, match="max_polish=1"):
        solve_svdd(K, 1.5 / 40, max_polish=1)


# --------------------------------------------------------------------------- #
# degenerate problems and conventions                                          #
# --------------------------------------------------------------------------- #


def test_duplicate_keys():
    rng = np.random.default_rng(21)
    base = rng.standard_normal((30, 5))
    x = np.vstack([base, base[:10], base[:3]])  # 43 keys, 13 duplicates
    for kernel in ("rbf", "exp"):
        K = gram(x, kernel)
        scale = float(np.max(np.diag(K)))
        for C in (1.5 / 43, 0.1, 1.0):
            alpha, mu = solve_svdd(K, C, return_mu=True)
            assert kkt_residual(K, alpha, mu, C) <= 1e-12
            p = rng.permutation(43)
            alpha_p, mu_p = solve_svdd(K[np.ix_(p, p)], C, return_mu=True)
            assert abs(svdd_objective(K, alpha) - svdd_objective(K[np.ix_(p, p)], alpha_p)) <= (
                1e-12 * scale
            )
            assert np.max(np.abs(K @ alpha - K[:, p] @ alpha_p)) <= 1e-12 * scale
            assert abs(mu - mu_p) <= 1e-12 * scale


def test_single_token():
    K = np.array([[2.5]])
    for C in (1.0, 3.0):
        alpha, mu = solve_svdd(K, C, return_mu=True)
        assert alpha.tolist() == [1.0]
        assert mu == pytest.approx(-2.5, rel=1e-15)  # g = 2·2.5 − 2.5 + mu = 0
        assert kkt_residual(K, alpha, mu, C) <= 1e-15
    assert partition(solve_svdd(K, 1.0), 1.0)["error"] == [0]
    assert partition(solve_svdd(K, 3.0), 3.0)["margin"] == [0]
    alpha, mu = solve_svdd(K, 0.5, return_mu=True)  # warm-up
    assert alpha.tolist() == [1.0] and mu == 0.0


def test_box_inactive_for_C_at_least_one():
    rng = np.random.default_rng(31)
    x = rng.standard_normal((50, 3))
    for kernel in ("rbf", "exp"):
        K = gram(x, kernel)
        a1, mu1 = solve_svdd(K, 1.0, return_mu=True)
        a5, mu5 = solve_svdd(K, 5.0, return_mu=True)
        np.testing.assert_allclose(a1, a5, rtol=0, atol=1e-14)
        assert abs(mu1 - mu5) <= 1e-13 * np.max(np.diag(K))
        assert partition(a5, 5.0)["error"] == []


@pytest.mark.parametrize("n", [3, 4, 5, 10, 64])
def test_nC_exactly_one(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 3))
    C = 1.0 / n
    assert n * C == 1.0
    for kernel in ("rbf", "exp"):
        K = gram(x, kernel)
        alpha, mu = solve_svdd(K, C, return_mu=True)
        assert np.all(alpha == C)
        assert partition(alpha, C) == {"margin": [], "error": list(range(n)), "reserve": []}
        grad = 2 * K @ alpha - np.diag(K)
        assert mu == mu_for_empty_margin(grad)
        assert kkt_residual(K, alpha, mu, C) <= 1e-15


def test_empty_margin_with_reserve():
    # Three far-apart keys (triangle) and their centroid, C = 1/3: the optimum
    # puts C on the vertices and 0 on the centroid; the margin set is empty.
    s = 1.0
    h = math.sqrt(3.0)
    x = np.array([[0.0, 0.0], [s, 0.0], [s / 2, s * h / 2], [s / 2, s / (2 * h)]])
    gamma = 2.4 / s**2  # k(vertex, vertex) = e^-2.4, k(vertex, centroid) = e^-0.8
    K = kernel_matrix(x, x, "rbf", gamma)
    C = 1.0 / 3.0
    alpha, mu = solve_svdd(K, C, return_mu=True)
    assert alpha.tolist() == [C, C, C, 0.0]
    assert partition(alpha, C) == {"margin": [], "error": [0, 1, 2], "reserve": [3]}
    kvv = K[0, 1]
    assert mu == pytest.approx(1.0 / 3.0 - 4.0 / 3.0 * kvv, abs=1e-15)
    assert mu == mu_for_empty_margin((2 * K @ alpha - np.diag(K))[:3])
    g = 2 * K @ alpha - np.diag(K) + mu
    assert g[3] > 0.05  # the centroid is strictly inside
    assert kkt_residual(K, alpha, mu, C) <= 1e-15


@pytest.mark.parametrize(("n", "C"), [(3, 0.2), (1, 0.5), (7, 0.1), (9, 0.1)])
def test_warm_up_convention(n, C):
    rng = np.random.default_rng(n)
    K = gram(rng.standard_normal((n, 2)), "rbf")
    alpha, mu = solve_svdd(K, C, return_mu=True)
    assert alpha.tolist() == [1.0 / n] * n
    assert mu == 0.0


def test_feasibility_slack_counts_as_feasible():
    # 1/3 · 3 rounds to 1 in float64; 0.1 · 10 also; both are feasible and all-at-bound.
    for n, C in ((3, 1 / 3), (10, 0.1)):
        K = gram(np.random.default_rng(0).standard_normal((n, 2)), "rbf")
        alpha = solve_svdd(K, C)
        assert np.all(alpha == C)


def test_returns_fresh_float64_and_leaves_input_alone():
    rng = np.random.default_rng(2)
    K = gram(rng.standard_normal((20, 3)), "rbf")
    K0 = K.copy()
    alpha = solve_svdd(K.tolist(), 0.2)  # nested lists accepted
    assert alpha.dtype == np.float64 and alpha.shape == (20,)
    assert np.array_equal(K, K0)
    assert np.array_equal(alpha, solve_svdd(K, 0.2))  # deterministic


def test_partition_atol():
    a = np.array([1e-14, 0.3, 0.5 - 1e-14, 0.2 - 2e-14])
    assert partition(a, 0.5) == {"margin": [0, 1, 2, 3], "error": [], "reserve": []}
    assert partition(a, 0.5, atol=1e-12) == {"margin": [1, 3], "error": [2], "reserve": [0]}


# --------------------------------------------------------------------------- #
# bad input                                                                    #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("K", "match"),
    [
        (np.ones(3), "2-D square"),
        (np.ones((2, 3)), "2-D square"),
        (np.ones((2, 2, 2)), "2-D square"),
        (np.zeros((0, 0)), "n >= 1"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "finite"),
        (np.array([[np.inf, 0.0], [0.0, 1.0]]), "finite"),
        (np.array([[1.0, 0.5], [0.4, 1.0]]), "symmetric"),
        ("abc", "K must be a real"),
    ],
)
def test_bad_K(K, match):
    with pytest.raises(ValueError, match=match):
        solve_svdd(K, 0.5)


@pytest.mark.parametrize("C", [0, 0.0, -1.0, math.nan, math.inf, "0.5", None, True])
def test_bad_C(C):
    with pytest.raises(ValueError, match="C must be"):
        solve_svdd(np.eye(3), C)


def test_bad_other_arguments():
    K = np.eye(3)
    with pytest.raises(ValueError, match="tol must be"):
        solve_svdd(K, 0.5, tol=-1.0)
    with pytest.raises(ValueError, match="max_polish must be"):
        solve_svdd(K, 0.5, max_polish=0)
    with pytest.raises(ValueError, match="alpha must have length n = 3"):
        kkt_residual(K, np.ones(2) / 2, 0.0, 0.5)
    with pytest.raises(ValueError, match="mu must be"):
        kkt_residual(K, np.ones(3) / 3, math.nan, 0.5)
    with pytest.raises(ValueError, match="alpha must be a 1-D"):
        partition(np.ones((2, 2)), 0.5)
    with pytest.raises(ValueError, match="atol must be"):
        partition(np.ones(2), 0.5, atol=-1)


def test_tiny_asymmetry_is_accepted():
    rng = np.random.default_rng(4)
    K = gram(rng.standard_normal((30, 3)), "rbf")
    Kp = K.copy()
    Kp[0, 1] += 1e-14
    a = solve_svdd(K, 0.1)
    ap = solve_svdd(Kp, 0.1)
    assert np.max(np.abs(a - ap)) <= 1e-12


@pytest.mark.parametrize("eps", [1e-12, 1e-8, 1e-5])
def test_near_duplicate_keys(eps):
    # Keys a hair apart make K_SS numerically singular but the margin system
    # inconsistent (the objective is linear along the pair's difference); the
    # polish must walk to a bound rather than accept a least-squares solution.
    rng = np.random.default_rng(41)
    base = rng.standard_normal((40, 8))
    x = np.vstack([base, base[:12] + eps * rng.standard_normal((12, 8))])
    n = x.shape[0]
    for kernel in ("rbf", "exp"):
        K = gram(x, kernel)
        scale = float(np.max(np.diag(K)))
        for C in (1.5 / n, 0.1, 1.0):
            alpha, mu = solve_svdd(K, C, return_mu=True)
            assert kkt_residual(K, alpha, mu, C) <= 1e-12
            p = rng.permutation(n)
            alpha_p = solve_svdd(K[np.ix_(p, p)], C)
            f, f_p = svdd_objective(K, alpha), svdd_objective(K[np.ix_(p, p)], alpha_p)
            assert abs(f - f_p) <= 1e-12 * scale
