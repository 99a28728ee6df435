"""The batch path of a large block (issue #36): libsvm's one-class SVM as a warm start,
then an exact float64 active-set finish (:func:`svattn.exact.operations.batch.libsvm_solve`,
:func:`svattn.exact.operations.ingest.add_block`).

It must reach the optimum the rows added one by one reach — the same partition, alpha
and mu within 1e-12 — and the independent oracle's; say which path ran; fall back to
the incremental path where it cannot certify (a cycle); merge copies; leave the
memory unchanged when it fails; and its fast kernels must equal their plain numpy
statements.
"""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import gram, retrain, snapshot
from svattn import SVDD
from svattn.exact import SVDDMemory
from svattn.exact.core import cache
from svattn.exact.core.errors import OperationError
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.operations import batch, ingest, solver
from svattn.exact.operations.batch import (
    KernelColumns,
    _margin_solver,
    _margin_system,
    bordered_inverse,
    column_finish,
    libsvm_warm_start,
)


def clustered(n: int, d: int = 4, *, seed: int = 0, outliers: float = 0.02) -> np.ndarray:
    """Gaussian clusters with uniform outliers (the issue's stream, small)."""
    rng = np.random.default_rng(seed)
    centers = 3.0 * rng.normal(size=(6, d))
    X = centers[rng.integers(0, 6, n)] + rng.normal(size=(n, d))
    out = rng.random(n) < outliers
    X[out] = rng.uniform(X.min(axis=0), X.max(axis=0), size=(int(out.sum()), d))
    return X


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 rows or more take the batch path (512 by default)."""
    monkeypatch.setattr(ingest, "BATCH_MIN_ROWS", 64)


def incremental(C, gamma, X, backend="compiled", kernel="rbf") -> SVDDMemory:
    """The rows added by the memory's own path (the batch path switched off)."""
    old = ingest.BATCH_MIN_ROWS, ingest.FIRST_BATCH_MIN_ROWS
    ingest.BATCH_MIN_ROWS = ingest.FIRST_BATCH_MIN_ROWS = 1 << 60
    try:
        mem = SVDDMemory(C, kernel, gamma, backend=backend)
        mem.extend(X)
    finally:
        ingest.BATCH_MIN_ROWS, ingest.FIRST_BATCH_MIN_ROWS = old
    assert mem.ingest_path == "incremental"
    return mem


def assert_same_optimum(a: SVDDMemory, b: SVDDMemory) -> None:
    assert a.ids == b.ids
    assert a.partition() == b.partition()
    assert np.abs(a.alpha - b.alpha).max() <= 1e-12
    assert abs(a.mu - b.mu) <= 1e-12
    assert a.kkt_residual() <= a.tol


CASES = [  # (n, C, gamma, seed): hundreds of margin tokens, tens with error tokens, a few
    (300, 1 / (0.05 * 300), 0.5, 0),
    (300, 1 / (0.1 * 300), 0.05, 1),
    (400, 1 / (0.3 * 400), 2.0, 2),
    (250, 1 / (0.05 * 250), 0.01, 3),
]


@pytest.mark.parametrize(("n", "C", "gamma", "seed"), CASES)
def test_batch_fit_equals_incremental_and_oracle(small_blocks, n, C, gamma, seed):
    X = clustered(n, seed=seed)
    fast = SVDDMemory(C, "rbf", gamma)
    fast.extend(X)
    assert fast.ingest_path == "libsvm+exact"
    slow = incremental(C, gamma, X)
    assert_same_optimum(fast, slow)
    alpha, mu = retrain(fast)
    assert np.abs(fast.alpha - alpha).max() <= 1e-12
    assert abs(fast.mu - mu) <= 1e-12
    assert fast.unique_optimum()
    # the kept inverse is the inverse of the margin system
    ms = fast.margin_system()
    K = gram(fast)
    pos = {t: i for i, t in enumerate(fast.ids)}
    S = [pos[t] for t in ms.margin]
    Q = np.zeros((len(S) + 1, len(S) + 1))
    Q[0, 1:] = Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K[np.ix_(S, S)]
    assert np.abs(ms.Qinv @ Q - np.eye(len(Q))).max() <= 1e-8


def test_reference_backend_takes_the_same_path(small_blocks):
    X = clustered(200, seed=4)
    C = 1 / (0.1 * 200)
    ref = SVDDMemory(C, "rbf", 0.3, backend="reference")
    ref.extend(X)
    assert ref.ingest_path == "libsvm+exact"
    assert_same_optimum(ref, incremental(C, 0.3, X, backend="reference"))


def test_large_block_onto_a_small_memory_and_the_operations_after(small_blocks):
    X = clustered(400, seed=5)
    C = 1 / (0.1 * 400)
    mem = SVDDMemory(C, "rbf", 0.4)
    mem.extend(X[:30])  # below the block size: one by one (warm-up)
    assert mem.ingest_path == "incremental"
    mem.extend(X[30:])  # 370 rows onto 30: the batch path, every token re-solved
    assert mem.ingest_path == "libsvm+exact"
    assert_same_optimum(mem, incremental(C, 0.4, X))
    # the memory goes on exactly: removals of support tokens, single adds
    support = mem.support_ids()
    for t in support[:5]:
        cert = mem.remove(t)
        assert cert.kkt_residual_after <= mem.tol
    mem.add(X[0] + 0.01)
    assert mem.ingest_path == "incremental"
    alpha, _ = retrain(mem)
    assert np.abs(mem.alpha - alpha).max() <= 1e-12


def test_small_block_onto_a_large_memory_stays_incremental(small_blocks):
    X = clustered(300, seed=6)
    mem = SVDDMemory(1 / 30, "rbf", 0.5)
    mem.extend(X[:200])
    assert mem.ingest_path == "libsvm+exact"
    mem.extend(X[200:])  # 100 rows onto 200: not twice the memory
    assert mem.ingest_path == "incremental"
    assert_same_optimum(mem, incremental(1 / 30, 0.5, X))


def test_exp_kernel_keeps_its_own_path(small_blocks):
    X = 0.3 * clustered(120, seed=7)
    mem = SVDDMemory(1 / 12, "exp", 0.2)
    mem.extend(X)
    assert mem.ingest_path == "incremental"


def test_copies_in_the_support_share_one_budget_on_the_batch_path(small_blocks):
    """Ten copies of an outlier (error set): the finish merges them into one token of
    bound 10·C and spreads the weight back in id order — the batch path, not rows one
    by one — and reaches the optimum of the incremental path (the same partition and
    alpha: both give the group's members C in id order)."""
    X = clustered(200, seed=8)
    X[0] = [9.0, 9.0, 9.0, 9.0]
    X[150:160] = X[0]
    C = 1 / (0.1 * 200)
    mem = SVDDMemory(C, "rbf", 0.5)
    mem.extend(X)
    assert mem.ingest_path == "libsvm+exact"
    assert_same_optimum(mem, incremental(C, 0.5, X))


def test_a_failure_leaves_the_memory_unchanged(small_blocks, monkeypatch):
    X = clustered(300, seed=9)
    mem = SVDDMemory(1 / 30, "rbf", 0.5)
    mem.extend(X[:20])
    before = snapshot(mem)

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(ingest, "install_solution", boom)
    with pytest.raises(OperationError):
        mem.extend(X[20:])
    assert snapshot(mem) == before
    monkeypatch.undo()
    monkeypatch.setattr(ingest, "BATCH_MIN_ROWS", 64)
    mem.extend(X[20:])
    assert mem.ingest_path == "libsvm+exact"


def test_estimator_says_which_path_ran_and_forgets_exactly(small_blocks):
    X = clustered(300, seed=10)
    model = SVDD(nu=0.05, gamma=0.5).fit(X)
    assert model.fit_path_ == "libsvm+exact"
    model.forget(indices=[int(model.support_[0]), int(model.support_[3])])
    keep = np.setdiff1d(np.arange(300), [int(i) for i in model.memory_.ids], assume_unique=True)
    assert len(keep) == 2
    rest = X[model.memory_.ids]
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(rest)
    assert fresh.fit_path_ == "libsvm+exact"
    assert np.abs(model.decision_function(X) - fresh.decision_function(X)).max() <= 1e-9
    model.partial_fit(X[:3] + 0.05)
    assert model.fit_path_ == "incremental"
    small = SVDD(nu=0.2, gamma=0.5).fit(X[:40])
    assert small.fit_path_ == "incremental"


# --------------------------------------------------- fast kernels beside their references
def test_libsvm_warm_start_is_c_times_beta():
    from sklearn.svm import OneClassSVM

    X = clustered(150, seed=11)
    C = 1 / (0.2 * 150)
    alpha = libsvm_warm_start(X, C, 0.5, tol=1e-10)
    oc = OneClassSVM(nu=0.2, gamma=0.5, tol=1e-10).fit(X)
    beta = np.zeros(150)
    beta[oc.support_] = oc.dual_coef_.ravel()
    assert np.array_equal(alpha, C * beta)
    assert abs(alpha.sum() - 1.0) <= 1e-12
    # libsvm's rho is the SVDD's (1 − mu) / (2C): the sign and offset conventions
    mem = SVDDMemory(C, "rbf", 0.5)
    mem.extend(X)
    assert abs((1.0 - mem.mu) / (2.0 * C) - float(oc.offset_[0])) <= 1e-6


@pytest.mark.parametrize(("n", "d", "nu", "gamma", "seed"),
                         [(178, 13, 0.1, 0.08, 0), (300, 4, 0.05, 0.5, 1), (500, 2, 0.5, 2.0, 2)])
def test_the_warm_start_calls_libsvm_as_one_class_svm_does(n, d, nu, gamma, seed):
    """The warm start's libsvm call, without ``OneClassSVM.fit``'s input checks, gives
    what the estimator (its reference) gives: support, β and the support's keys, bit
    for bit."""
    X = clustered(n, d, seed=seed)
    fast = batch._one_class_dual(X, nu, gamma, 1e-2)
    ref = batch._one_class_dual_by_estimator(X, nu, gamma, 1e-2)
    for a, b in zip(fast, ref, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_first_block_of_64_rows_is_batched_and_blocks_onto_held_rows_are_not():
    """An empty memory's first rbf block of 64 rows and more (a fit) takes the batch
    path, reaching the optimum the rows one by one reach; 63 rows, and a block onto held
    rows under 512, are added one by one, equal to repeated ``add`` bit for bit."""
    X = clustered(200, seed=16)
    C = 1 / (0.1 * 178)
    fast = SVDDMemory(C, "rbf", 0.5)
    fast.extend(X[:178])
    assert fast.ingest_path == "libsvm+exact"
    assert_same_optimum(fast, incremental(C, 0.5, X[:178]))
    assert SVDD(nu=0.1, gamma=0.5).fit(X[:178]).fit_path_ == "libsvm+exact"
    small = SVDDMemory(1 / 20, "rbf", 0.5)
    small.extend(X[:63])
    assert small.ingest_path == "incremental"
    onto, one_by_one = SVDDMemory(C, "rbf", 0.5), SVDDMemory(C, "rbf", 0.5)
    onto.extend(X[:30])
    onto.extend(X[30:200])  # 170 rows onto 30: under 512
    assert onto.ingest_path == "incremental"
    for row in X:
        one_by_one.add(row)
    assert onto.state_digest() == one_by_one.state_digest()
    assert np.array_equal(onto.alpha, one_by_one.alpha)


def test_kernel_columns_are_the_kernel():
    X = clustered(80, seed=12)
    cols = KernelColumns(X, 0.7, capacity=2)
    idx = np.array([5, 3, 5, 70])
    pos = cols.ensure(idx)
    assert pos[0] == pos[2]
    pos2 = cols.ensure(np.array([3, 11, 12, 13]))  # grows past its capacity
    assert pos2[0] == pos[1]
    K = kernel_matrix(X, X, "rbf", 0.7)
    np.fill_diagonal(K, 1.0)
    for j in (5, 3, 70, 11, 12, 13):
        assert np.array_equal(cols.rows[cols.pos[j]], K[:, j])
    cols.scrub()
    assert not cols.rows.any() and not cols.XT.any()


def test_bordered_solves_equal_the_general_ones():
    X = clustered(60, seed=13)
    K = kernel_matrix(X, X, "rbf", 0.5)
    Q = np.zeros((61, 61))
    Q[0, 1:] = Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K
    ref = np.linalg.inv(Q)
    scale = np.abs(ref).max()
    assert np.abs(bordered_inverse(Q) - ref).max() <= 1e-12 * scale * np.linalg.cond(Q) ** 0.5
    r = np.random.default_rng(0).normal(size=61)
    x = _margin_solver(Q)(r)
    assert np.abs(Q @ x - r).max() <= 1e-9
    Q[1:, 1:] = -Q[1:, 1:]  # not positive definite: no Cholesky solver, a general inverse
    assert _margin_solver(Q) is None
    assert np.allclose(bordered_inverse(Q) @ Q, np.eye(61), atol=1e-8)


def test_column_finish_repairs_a_wrong_partition_and_refuses_without_a_free_token():
    X = clustered(200, seed=14)
    C = 1 / (0.1 * 200)
    exact, _ = retrain_of(X, C, 0.5)
    rng = np.random.default_rng(1)
    rough = np.clip(exact + 0.3 * C * rng.normal(size=200) * (exact > 0), 0.0, C)
    rough[rng.choice(200, 10, replace=False)] = 0.5 * C  # ten wrong memberships
    sol = column_finish(KernelColumns(X, 0.5), C, rough, tol=1e-12)
    assert sol is not None
    assert np.abs(sol.alpha - exact).max() <= 1e-12
    # no free token at all: the finish does not guess
    assert column_finish(KernelColumns(X, 0.5), C, np.zeros(200), tol=1e-12) is None


def retrain_of(X, C, gamma):
    from svattn.exact.core.kernels import gram_matrix
    from svattn.exact.oracle import solve_svdd

    return solve_svdd(gram_matrix(X, "rbf", gamma), C, return_mu=True)


@pytest.mark.parametrize("n", [7, 90])  # the narrow and the wide distance loop
def test_sq_distances_t_is_sq_distances(n):
    from svattn.exact.core.kernels import sq_distances, sq_distances_t

    rng = np.random.default_rng(n)
    x, y = rng.normal(size=(5, 3)) + 1e3, rng.normal(size=(n, 3)) + 1e3
    ref = sq_distances(x, y)
    yT = np.ascontiguousarray(y.T)
    assert np.array_equal(sq_distances_t(x, yT), ref)
    out = np.full((5, n), np.nan)
    assert sq_distances_t(x, yT, out=out) is out
    assert np.array_equal(out, ref)


def test_a_numerical_failure_of_the_finish_takes_the_incremental_path(small_blocks,
                                                                      monkeypatch):
    import svattn.exact.operations.batch as batch

    def singular(*args, **kwargs):
        raise np.linalg.LinAlgError("injected: singular matrix")

    monkeypatch.setattr(batch, "bordered_inverse", singular)
    X = clustered(200, seed=15)
    mem = SVDDMemory(1 / 20, "rbf", 0.5)
    mem.extend(X)
    assert mem.ingest_path == "incremental"
    monkeypatch.undo()
    assert_same_optimum(mem, incremental(1 / 20, 0.5, X))


def test_permute_rows_is_the_fancy_index():
    rng = np.random.default_rng(7)
    for m, na in [(9, 9), (12, 5), (40, 31), (1, 1), (6, 0)]:
        rows = rng.normal(size=(m + 3, 11))
        pos = rng.permutation(m)[:na]
        want = rows.copy()
        want[:na] = rows[pos]
        want[na:m] = 0.0
        cache.permute_rows(rows, pos, m)
        assert np.array_equal(rows, want)


def test_the_finish_columns_become_the_cache_as_a_copy_would_write_them(small_blocks,
                                                                         monkeypatch):
    """A fit hands the finish's kernel-column buffer to the memory (no second n×|S|
    array): the cache, its column arrays and every later operation are those of the
    path that copies the columns into a cache of its own."""
    X = clustered(500, seed=8)
    C = 1 / (0.08 * 500)
    taken = SVDDMemory(C, "rbf", 0.4)
    seen = []
    real = solver.adopt_rows
    monkeypatch.setattr(solver, "adopt_rows", lambda *a: seen.append(real(*a)) or seen[-1])
    taken.extend(X)
    assert seen == [True] and taken.ingest_path == "libsvm+exact"
    monkeypatch.setattr(solver, "adopt_rows", lambda *a: False)
    copied = SVDDMemory(C, "rbf", 0.4)
    copied.extend(X)
    a, b = taken._s, copied._s
    assert a.KC.flags.f_contiguous and a.KC.shape[0] == a.cap
    assert a.chi == b.chi and a.nS == b.nS
    w = min(a.ccap, b.ccap)
    assert np.array_equal(a.KC[:, :w], b.KC[:, :w])
    assert not a.KC[:, a.chi:].any() and not b.KC[:, b.chi:].any()
    for name in ("XC", "slot_of_col", "ac"):
        assert np.array_equal(getattr(a, name)[: a.chi], getattr(b, name)[: b.chi]), name
    assert np.array_equal(a.col_of_slot, b.col_of_slot)
    assert np.array_equal(a.Qinv, b.Qinv) and np.array_equal(a.g, b.g)
    for t in taken.support_ids()[:4]:
        taken.remove(t)
        copied.remove(t)
    taken.add(X[3] + 0.02)
    copied.add(X[3] + 0.02)
    assert taken.state_digest() == copied.state_digest()
    assert np.array_equal(taken.alpha, copied.alpha)


def test_a_changed_margin_set_keeps_the_last_factor():
    """The finish's next margin system where the set changed a little: the tokens
    that left deleted, the new ones appended (in index order), the system the one
    assembled afresh in that order, and the kept factor a Cholesky factor of it; a
    set that changed by more than the share is assembled afresh in index order with
    no factor."""
    from scipy.linalg import cholesky

    X = clustered(120, seed=15)
    K = kernel_matrix(X, X, "rbf", 0.5)
    np.fill_diagonal(K, 1.0)
    cols = KernelColumns(X, 0.5)
    state = np.zeros(120, dtype=np.int8)
    state[np.arange(0, 120, 3)] = 1  # 40 margin tokens
    S, Q, factor = _margin_system(cols, state, None, None, None)
    assert np.array_equal(S, np.arange(0, 120, 3)) and factor is None
    factor = cholesky(Q[1:, 1:], lower=True)
    r = np.random.default_rng(2).normal(size=50)

    def check(S2, Q2, L):
        m = len(S2)
        assert np.array_equal(Q2[1:, 1:], 2.0 * K[np.ix_(S2, S2)])
        assert np.array_equal(Q2[0, 1:], np.ones(m)) and Q2[0, 0] == 0.0
        T = np.tril(L)
        assert np.abs(T @ T.T - Q2[1:, 1:]).max() <= 1e-12
        assert np.abs(T - cholesky(Q2[1:, 1:], lower=True)).max() <= 1e-10
        # the solver and the inverse on the kept factor
        assert np.abs(Q2 @ _margin_solver(Q2, factor=L)(r[: m + 1]) - r[: m + 1]).max() <= 1e-9
        assert np.abs(bordered_inverse(Q2, factor=L) @ Q2 - np.eye(m + 1)).max() <= 1e-8

    state[[4, 50, 7]] = 1  # three more: appended in index order
    S2, Q2, L = _margin_system(cols, state, S, Q, factor)
    assert np.array_equal(S2, np.concatenate([S, [4, 7, 50]]))
    check(S2, Q2, L)
    state[[0, 51]] = 0  # two left: deleted (its order kept)
    S3, Q3, L3 = _margin_system(cols, state, S2, Q2, L.copy())
    assert np.array_equal(S3, [s for s in S2 if s not in (0, 51)])
    check(S3, Q3, L3)
    state[[9, 10, 11]] = [0, 1, 1]  # one left, two came: both
    S4, Q4, L4 = _margin_system(cols, state, S3, Q3, L3.copy())
    assert np.array_equal(S4, np.concatenate([[s for s in S3 if s != 9], [10, 11]]))
    check(S4, Q4, L4)
    state[1:60:3] = 1  # 17 more than 42 tokens' quarter: afresh
    S5, _, L5 = _margin_system(cols, state, S4, Q4, L4)
    assert L5 is None and np.array_equal(S5, np.flatnonzero(state == 1))


def test_a_resolve_of_many_rbf_tokens_goes_by_columns_and_equals_the_gram_solve(monkeypatch):
    """A re-solve (an operation's last resort) of at least RESOLVE_BY_COLUMNS_FROM rbf
    tokens takes the batch path (O(n·|S ∪ E|), no n×n Gram matrix) and reaches the
    optimum the Gram solve reaches, with a copy in the support too (both merge copies)."""
    monkeypatch.setattr(solver, "RESOLVE_BY_COLUMNS_FROM", 200)
    X = clustered(320, seed=21)
    C = 1 / (0.1 * 320)

    def built(columns: bool) -> SVDDMemory:
        mem = SVDDMemory(C, "rbf", 0.4)
        mem.extend(X)
        support = mem.support_ids()[:3]
        for t in support + [t for t in (5, 6, 8, 9) if t not in support][:2]:
            mem.remove(t)  # (holes in the slot table)
        taken = []
        real = solver.resolve_by_columns
        monkeypatch.setattr(solver, "resolve_by_columns",
                            (lambda ss, be: taken.append(real(ss, be)) or taken[-1])
                            if columns else (lambda ss, be: False))
        solver.resolve(mem.solver_state, mem._be)
        monkeypatch.setattr(solver, "resolve_by_columns", real)
        assert taken == ([True] if columns else [])
        return mem

    fast, slow = built(True), built(False)
    assert_same_optimum(fast, slow)
    alpha, mu = retrain(fast)
    assert np.abs(fast.alpha - alpha).max() <= 1e-12 and abs(fast.mu - mu) <= 1e-12
    for mem in (fast, slow):  # and the memories go on alike
        mem.remove(mem.support_ids()[0])
        mem.add(X[7] + 0.05)
    assert_same_optimum(fast, slow)
    # a copy in the support: the columns path merges it (one budget, spread in id
    # order) and reaches the Gram solve's optimum, the split included
    mem = SVDDMemory(C, "rbf", 0.4)
    mem.extend(X)
    first = mem.ids.index(mem.support_ids()[0])
    mem.add(mem.keys[first].copy())
    gram_solved = mem.copy()
    assert solver.resolve_by_columns(mem.solver_state, mem._be) is True
    solver.resolve_by_gram(gram_solved.solver_state, gram_solved._be)
    assert_same_optimum(mem, gram_solved)
    alpha, _ = retrain(mem)  # (the oracle splits the copies' weight, the memory fills
    got = mem.alpha  # the first: the same optimum)
    pair = [first, len(got) - 1]
    assert abs(got[pair].sum() - alpha[pair].sum()) <= 1e-9
    assert np.abs(np.delete(got - alpha, pair)).max() <= 1e-9


def test_an_appended_margin_token_whose_row_grows_the_column_buffer(small_blocks,
                                                                    monkeypatch):
    """The finish appends a token to its kept factor when the kept column rows are full:
    its row is computed into a grown buffer and read from that one (an IndexError, the
    extend failing, where the old, smaller buffer was read); the fit is the optimum."""
    X = clustered(300, seed=12)
    C, gamma = 1 / (0.05 * 300), 0.5
    alpha0 = libsvm_warm_start(X, C, gamma)
    exact = column_finish(KernelColumns(X, gamma, capacity=300), C, alpha0, tol=1e-12)
    assert exact is not None and len(exact.margin) >= 8
    start = exact.alpha.copy()
    start[exact.margin[0]] = 0.0  # one margin token starts in the reserve set
    full = len(exact.margin) + len(exact.error) - 1  # every kept row taken at the first solve
    sol = column_finish(KernelColumns(X, gamma, capacity=full), C, start, tol=1e-12)
    assert sol is not None
    assert np.abs(sol.alpha - exact.alpha).max() <= 1e-12
    assert np.array_equal(np.sort(sol.margin), np.sort(exact.margin))
    # the same through a public extend (the warm start and the first buffer as above)
    real = batch.KernelColumns
    monkeypatch.setattr(batch, "libsvm_warm_start", lambda *a, **k: start.copy())
    monkeypatch.setattr(batch, "KernelColumns",
                        lambda X, g, capacity=64: real(X, g, capacity=full))
    mem = SVDDMemory(C, "rbf", gamma)
    mem.extend(X)
    assert mem.ingest_path == "libsvm+exact"
    monkeypatch.undo()
    assert_same_optimum(mem, incremental(C, gamma, X))


def test_a_failure_as_the_cache_is_adopted_leaves_no_kernel_values(small_blocks,
                                                                    monkeypatch):
    """The finish's column buffer is handed over only once the memory holds it: a
    failure as the cache takes it leaves the buffer with the finish (which scrubs it),
    not dropped unscrubbed between the two; the memory is unchanged and goes on."""
    from svattn.exact.core.state import SlotState

    X = clustered(300, seed=9)
    mem = SVDDMemory(1 / 30, "rbf", 0.5)
    mem.extend(X[:20])
    before = snapshot(mem)
    held = []

    def boom(self, KC):
        held.append(KC)
        raise RuntimeError("injected")

    monkeypatch.setattr(SlotState, "adopt_cols", boom)
    with pytest.raises(OperationError):
        mem.extend(X[20:])
    assert len(held) == 1 and held[0].size and not held[0].any()
    assert snapshot(mem) == before
    monkeypatch.undo()
    monkeypatch.setattr(ingest, "BATCH_MIN_ROWS", 64)
    mem.extend(X[20:])
    assert mem.ingest_path == "libsvm+exact"
    assert_same_optimum(mem, incremental(1 / 30, 0.5, X))


def test_the_finish_leaves_its_systems_and_factors_zeroed(monkeypatch):
    """Every margin system and Cholesky factor the finish built or kept (kernel values:
    ``2 K_SS``, and the unread triangle of a LAPACK factor holds it verbatim) goes back
    zeroed: the ones its next step replaced (appended to, deleted from — an F-ordered
    factor copied for the delete as well as the copy), and the last ones; the optimum
    is the oracle's."""
    from svattn.exact.oracle import solve_svdd

    X = clustered(400, seed=0)
    C, gamma = 1 / (0.05 * 400), 0.5
    held, kinds = [], set()
    real_system, real_solver = batch._margin_system, batch._margin_solver

    def system(cols, state, S, Q, factor):
        out = real_system(cols, state, S, Q, factor)
        if factor is not None and out[2] is not None:
            if len(np.setdiff1d(S, out[0])):
                kinds.add("delete")
            if len(np.setdiff1d(out[0], S)):
                kinds.add("append")
        held.extend(a for a in (Q, factor, out[1], out[2]) if a is not None)
        return out

    def solver(Q, **kw):
        solve = real_solver(Q, **kw)
        held.append(solve.factor)
        return solve

    monkeypatch.setattr(batch, "_margin_system", system)
    monkeypatch.setattr(batch, "_margin_solver", solver)
    alpha0 = libsvm_warm_start(X, C, gamma, tol=0.1)  # a rough start: several steps
    sol = column_finish(KernelColumns(X, gamma, capacity=400), C, alpha0, tol=1e-12)
    assert sol is not None and kinds == {"append", "delete"}
    assert held and not any(a.any() for a in held)
    K = kernel_matrix(X, X, "rbf", gamma)
    np.fill_diagonal(K, 1.0)
    alpha, mu = solve_svdd(K, C, return_mu=True)
    assert np.abs(sol.alpha - alpha).max() <= 1e-12 and abs(sol.mu - mu) <= 1e-12


@pytest.mark.parametrize("exc", [MemoryError("exhausted"), KeyboardInterrupt()])
@pytest.mark.parametrize("op", ["remove", "extend"])
def test_an_unhandled_error_in_the_finish_scrubs_its_columns(monkeypatch, small_blocks, exc,
                                                             op):
    """An error the finish does not turn into "cannot certify" (memory exhausted, an
    interrupt) inside libsvm_solve — a re-solve by columns, a large block's add —
    undoes the operation, and the columns it had computed (the keys transposed, the
    kernel rows) go back zeroed: nobody else holds them to scrub."""
    from svattn.exact.core.state import NeedResolve

    monkeypatch.setattr(solver, "RESOLVE_BY_COLUMNS_FROM", 200)
    X = clustered(300, seed=5)
    mem = SVDDMemory(1 / (0.1 * 300), "rbf", 0.4)
    mem.extend(X[:100])
    if op == "remove":
        mem.extend(X[100:])
    made = []
    real_init = KernelColumns.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)

    def fail(cols, *a, **k):
        cols.ensure(np.arange(5))  # some kernel rows computed, then the failure
        raise exc

    def need(*a, **k):
        raise NeedResolve

    monkeypatch.setattr(KernelColumns, "__init__", init)
    monkeypatch.setattr(batch, "_margin_system", fail)
    monkeypatch.setattr(mem._be, "remove_by_segments", need)
    before = snapshot(mem)
    with pytest.raises((OperationError, KeyboardInterrupt)):
        if op == "remove":
            mem.remove(mem.support_ids()[0])
        else:
            mem.extend(X[100:])
    assert snapshot(mem) == before
    assert made and all(not c.rows.any() and not c.XT.any() for c in made)


def test_kernel_columns_that_cannot_allocate_scrub_the_transposed_keys():
    """The column buffer is a batch solve's largest allocation: where memory runs out
    there, the keys' transposed copy made just before goes back zeroed."""
    X = clustered(50, seed=2)
    cols = KernelColumns.__new__(KernelColumns)
    with pytest.raises(MemoryError):
        cols.__init__(X, 0.4, capacity=1 << 50)
    assert cols.XT.shape == (X.shape[1], 50) and not cols.XT.any()
