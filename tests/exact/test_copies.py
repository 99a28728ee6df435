"""Copies of a key share one coefficient budget (``svattn.exact.operations.copies``).

Keys the kernel cannot tell apart fix only the sum of their coefficients. The memory
must reach the optimum with them in its support — by the batch path of a large block
(no fall back to adding rows one by one), along the removal path (no dense re-solve),
and when one or all copies are forgotten — and agree with the independent dense oracle
(:func:`svattn.exact.oracle.solve_svdd`, which splits a group's weight its own way) on
the decision function and on every group's sum of coefficients, to 1e-9.
"""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import retrain
from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import decision_values, gram_matrix
from svattn.exact.operations import ingest
from svattn.exact.operations.copies import kernel_copies, spread

GAMMA = 0.5


def clustered(n: int, d: int = 3, *, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = 3.0 * rng.normal(size=(4, d))
    return centers[rng.integers(0, 4, n)] + rng.normal(size=(n, d))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 rows or more take the batch path (512 by default)."""
    monkeypatch.setattr(ingest, "BATCH_MIN_ROWS", 64)


def groups(keys: np.ndarray, gamma: float) -> np.ndarray:
    """Each key's group: keys the kernel cannot tell apart share one (K >= 1 − 1e-13)."""
    K = gram_matrix(keys, "rbf", gamma)
    label = np.full(len(keys), -1)
    for i in range(len(keys)):
        if label[i] < 0:
            label[(K[i] >= 1.0 - 1e-13) & (label < 0)] = i
    return label


def assert_oracle_optimum(mem: SVDDMemory, probes: np.ndarray) -> None:
    """The decision function and each group's coefficient sum equal the oracle's
    (1e-9); at most one member of a group is free; the KKT residual is within tol."""
    keys, alpha = mem.keys, mem.alpha
    alpha_r, mu_r = retrain(mem)
    label = groups(keys, mem.gamma_value)
    ids = np.unique(label)
    sums = np.array([alpha[label == g].sum() for g in ids])
    sums_r = np.array([alpha_r[label == g].sum() for g in ids])
    assert np.abs(sums - sums_r).max() <= 1e-9
    dec_r = decision_values(probes, keys, alpha_r, mu_r, "rbf", mem.gamma_value)
    assert np.abs(mem.decision_function(probes) - dec_r).max() <= 1e-9
    free = (alpha > 1e-13 * mem.C) & (alpha < mem.C * (1 - 1e-13))
    assert max(np.bincount(label[free], minlength=len(keys)), default=0) <= 1
    assert mem.kkt_residual() <= mem.tol


def with_copies(n: int, *, margin: int, error: int, seed: int) -> tuple[np.ndarray, float]:
    """Clustered keys plus a key on the margin repeated ``margin`` times and an outlier
    (in the error set) repeated ``error`` times; C = 1 / (0.1 n)."""
    X = clustered(n, seed=seed)
    C = 1.0 / (0.1 * n)
    mem = SVDDMemory(C, "rbf", GAMMA)
    mem.extend(X)
    on_margin = X[mem.partition()["margin"][0]]
    far = X.max(axis=0) + 2.0
    X = np.concatenate([X, np.repeat(on_margin[None], margin - 1, 0),
                        np.repeat(far[None], error, 0)])
    return X, C


@pytest.mark.parametrize("m", [2, 3, 5])
def test_copies_in_the_support_take_the_batch_path_and_meet_the_oracle(small_blocks, m):
    X, C = with_copies(200, margin=m, error=m, seed=m)
    mem = SVDDMemory(C, "rbf", GAMMA)
    mem.extend(X)
    assert mem.ingest_path == "libsvm+exact"  # copies no longer send it row by row
    assert mem.n_resolves == 0
    assert_oracle_optimum(mem, np.concatenate([X, X[:50] + 0.3]))


def test_copies_added_one_by_one_meet_the_oracle():
    X, C = with_copies(150, margin=4, error=3, seed=11)
    mem = SVDDMemory(C, "rbf", GAMMA)
    for x in X:
        mem.add(x)
    assert_oracle_optimum(mem, X)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("m", [2, 3, 5])
def test_forgetting_one_copy_hands_its_weight_to_the_others(small_blocks, backend, m):
    """A copy with weight whose siblings have room: removed with no solve along the
    path (status "copies"), the group's sum and the decision function unchanged."""
    X, C = with_copies(200, margin=m, error=m, seed=20 + m)
    mem = SVDDMemory(C, "rbf", GAMMA, backend=backend)
    mem.extend(X)
    before = mem.decision_function(X)
    ids = np.array(mem.ids)
    alpha = mem.alpha
    ss = mem.solver_state
    # a member with weight whose group can absorb it
    for t in ids[alpha > 0]:
        slot = ss.id_to_slot[int(t)]
        sib = kernel_copies(ss, slot)
        if len(sib) and np.sum(C - ss.alpha[sib]) >= ss.alpha[slot]:
            break
    else:
        pytest.fail("no copy with room in the support")
    resolves = mem.n_resolves
    cert = mem.remove(int(t))
    assert mem.n_resolves == resolves
    assert cert.kkt_residual_after <= mem.tol
    assert np.abs(mem.decision_function(X) - before).max() <= 1e-9
    assert_oracle_optimum(mem, X)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_forgetting_every_copy_meets_the_oracle(small_blocks, backend):
    X, C = with_copies(200, margin=4, error=4, seed=31)
    mem = SVDDMemory(C, "rbf", GAMMA, backend=backend)
    mem.extend(X)
    label = groups(mem.keys, GAMMA)
    resolves = mem.n_resolves
    for g in (label[-1], label[200]):  # the outlier's copies, then the margin key's
        for t in [mem.ids[i] for i in np.flatnonzero(groups(mem.keys, GAMMA) == g)]:
            mem.remove(int(t))
            assert_oracle_optimum(mem, X)
    assert mem.n_resolves == resolves  # no dense re-solve on the way


def test_forgetting_other_tokens_with_copies_in_the_support_needs_no_resolve(small_blocks):
    """Removals of support tokens that are no copies, with copies on the margin and in
    the error set: a reserve copy of a margin token never joins the margin beside it
    (it would make the margin system singular: a dense re-solve)."""
    X, C = with_copies(300, margin=3, error=2, seed=41)
    mem = SVDDMemory(C, "rbf", GAMMA)
    mem.extend(X)
    rng = np.random.default_rng(0)
    resolves = mem.n_resolves
    for _ in range(12):
        support = [t for t in mem.support_ids() if t < 300]
        mem.remove(int(rng.choice(support)))
    assert mem.n_resolves == resolves
    assert_oracle_optimum(mem, X)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_near_copies_meet_the_oracle(small_blocks, backend):
    """Keys 1e-12 apart (the kernel cannot tell them apart) are copies too."""
    rng = np.random.default_rng(5)
    X, C = with_copies(200, margin=3, error=3, seed=51)
    X[200:] += 1e-12 * rng.normal(size=X[200:].shape)
    mem = SVDDMemory(C, "rbf", GAMMA, backend=backend)
    mem.extend(X)
    assert mem.ingest_path == "libsvm+exact"
    assert_oracle_optimum(mem, X)
    for t in [mem.ids[i] for i in range(200, len(X), 2)]:
        mem.remove(int(t))
        assert_oracle_optimum(mem, X)


def test_spread_keeps_one_member_free():
    assert spread(0.25, 3, 0.1).tolist() == pytest.approx([0.1, 0.1, 0.05, ])
    assert spread(0.2, 3, 0.1).tolist() == pytest.approx([0.1, 0.1, 0.0])
    assert spread(0.0, 2, 0.1).tolist() == [0.0, 0.0]


def test_the_oracle_cross_check_compares_each_group_of_copies_sum(small_blocks):
    """Where copies make alpha unique only up to its split, the cross-check compares the
    decision function and each group's sum with the dense re-solve — and a state whose
    group sums are wrong (weight moved between two groups) fails it."""
    from svattn.exact.auditor.crosscheck import oracle_comparison

    X, C = with_copies(200, margin=3, error=3, seed=61)
    mem = SVDDMemory(C, "rbf", GAMMA)
    mem.extend(X)
    cross = oracle_comparison(mem, probes=X, tol=1e-9, seed=0, unique=False)
    assert cross.reasons == () and cross.group_sum_dev <= 1e-9
    ss = mem.solver_state
    margin = ss.margin_slots()
    ss.alpha[margin[0]] += 1e-6  # not an optimum: one group's sum up, another's down
    ss.alpha[margin[1]] -= 1e-6
    cross = oracle_comparison(mem, probes=X, tol=1e-9, seed=0, unique=False)
    assert cross.group_sum_dev >= 1e-7
    assert any("group of copies" in r for r in cross.reasons)


def test_real_icu_vitals_with_copies_fit_in_batch_and_forget_without_a_resolve():
    """The ICU slice as the loader gives it (z-scored, 6 exact copies among 3,064 rows),
    gamma = 1 (over a third of the rows on the margin): the fit takes the batch path and
    support forgets need no re-solve; the result equals a fresh fit (decision function
    and each group of copies' coefficient sum)."""
    from svattn import SVDD
    from svattn.data.icu import default_slice_path, load_mimic3_vitals

    X = np.ascontiguousarray(load_mimic3_vitals(default_slice_path()).standardised().keys)
    assert len(X) - len(np.unique(X, axis=0)) > 0
    model = SVDD(nu=0.05, gamma=1.0).fit(X)
    assert model.fit_path_ == "libsvm+exact"
    rng = np.random.default_rng(0)
    held = np.ones(len(X), bool)
    for _ in range(6):
        victim = int(model.support_[rng.integers(len(model.support_))])
        model.forget(indices=[victim])
        held[victim] = False
    assert model.memory_.n_resolves == 0
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(X[held])
    probes = X[::5]
    assert np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max() <= 1e-9
    _, group = np.unique(X[held], axis=0, return_inverse=True)
    mine = np.zeros(int(held.sum()))
    mine[np.searchsorted(np.flatnonzero(held), model.support_)] = model.dual_coef_.ravel()
    theirs = np.zeros(len(mine))
    theirs[fresh.support_] = fresh.dual_coef_.ravel()
    group = group.ravel()
    assert np.abs(np.bincount(group, mine) - np.bincount(group, theirs)).max() * model.C_ <= 1e-9
