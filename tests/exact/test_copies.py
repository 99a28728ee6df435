"""Copies of a key share one coefficient budget (``svattn.exact.operations.copies``).

Keys the kernel cannot tell apart fix only the sum of their coefficients. The memory
must reach the optimum with them in its support — by the batch path of a large block
(no fall back to adding rows one by one), along the removal path (no dense re-solve),
and when one or all copies are forgotten — and agree with the independent dense oracle
(:func:`svattn.exact.oracle.solve_svdd`, which splits a group's weight its own way) on
the decision function and on every group's sum of coefficients, to 1e-9.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exact_helpers import retrain
from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import decision_values, gram_matrix
from svattn.exact.operations import ingest
from svattn.exact.operations.copies import kernel_copies, spread

GAMMA = 0.5
# 17 keys of a trained recall model's memory, near-copies among them (test_copies_on_the_drive)
TRAINED = Path(__file__).parent / "data" / "trained_copies.npz"


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


# Twenty-one keys, gamma = 8.034795410579068, C = 0.04976368548152144: keys 9 and 10 exact
# copies, keys 0 and 1 near-copies with 2 − 2K = 2.6e-13 (just above the copy test's
# 2e-13: two singleton groups), both on the margin. Seed 4 of the outside review's
# add/forget streams (a forget left a superset of these keys; a fit of them is judged
# the same).
_FLAT = np.array([
    [0.6248663505788951, 1.09017986530538, 1.6820210064715346, -0.13109289942963767],
    [0.6248663791383812, 1.0901798663673614, 1.6820208967228814, -0.13109284116543016],
    [2.2527263110483986, -1.9156483620451386, 1.1018022357139596, -0.3299022601228846],
    [1.0620759249030431, -0.8294887139368005, -0.24878000286367677, -1.688529305413903],
    [-0.7543747264549445, 0.009248189011741795, -0.10133885706584574, -0.04367359861427566],
    [0.49553972212029984, -1.3506872052058774, -1.0254756280086132, 1.1219208705156984],
    [-0.28233039748883504, -0.046564305577509096, 0.6119379473112638, 0.791812857723111],
    [-0.14227878584071332, 0.08018752414269664, 0.818736303952953, 0.9381846358677198],
    [-0.05894193951479713, 1.2884654366703447, -0.6258324239768248, 0.6350174895697084],
    [1.7719189395189767, 0.6483385275977063, -0.40744478373891585, 0.6204893353394123],
    [1.7719189395189767, 0.6483385275977063, -0.40744478373891585, 0.6204893353394123],
    [-0.24905620767605252, -0.8976904193941799, 2.8043319412036705, 0.18290134186419704],
    [-1.1169905865894318, -1.0368651406568785, -0.10387420939642665, -0.09927146856704905],
    [-0.9537264726805303, 0.5900864341051688, 1.5655534503057242, -0.8636458732292807],
    [0.42810194284383857, 1.4409062638197778, 0.8212016985315312, -1.2298004019005293],
    [-1.1212269270861612, 0.04168013510434051, -0.8194099656011558, -0.6514171909737703],
    [0.7509714114673515, 2.628106119344124, 1.4274554265620245, 1.3393956530093372],
    [0.2026726183568746, 0.05913431606857885, -1.5071538681636054, 1.1297919219231545],
    [0.49371721742131663, -0.6430266177294371, 0.7172439574798849, 0.07942344483599749],
    [2.2527289428123813, -1.9156454372104854, 1.1018018777255647, -0.3299039504736951],
    [0.47962821970188263, -0.027718929155257546, 1.7806575945572853, 1.0627810970389353],
])


# The singletons 0 and 1 split 0.0845 as (0.0498, 0.0348) in the memory (0 at C) against
# the oracle's (0.0454, 0.0391), 4.4e-3 apart, while the dual objectives agree to 1.1e-16
# and the decision function to 9.5e-11: each solution carries its own residual (the
# memory's 2.1e-15 on key 0's row, ~10 eps; the oracle's 1.1e-16), amplified by the
# near-singular merged margin system (keys 0 and 1, 2 − 2K = 2.6e-13; |A⁻¹| up to 1.9e12)
# to 4.0e-3 and 2.1e-4. The allowance counted one ulp of the kernel alone (9.9e-4) and
# rejected this optimum; it now counts both residuals (5.2e-3).
@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_the_cross_check_accepts_an_optimum_whose_near_copies_split_their_sum_otherwise(
        backend):
    """A fit at KKT 1e-15 beside near-copies just above the copy test: the same optimum
    as the oracle's to rounding, which the cross-check accepts."""
    from svattn.exact.auditor.crosscheck import oracle_comparison

    mem = SVDDMemory(C=0.04976368548152144, kernel="rbf", gamma=8.034795410579068,
                     backend=backend)
    mem.extend(_FLAT)
    assert mem.kkt_residual() <= 1e-14
    oc = oracle_comparison(mem, probes=None, tol=1e-8, seed=0, unique=mem.unique_optimum())
    assert oc.decision_dev <= 1e-9
    assert not oc.reasons, oc.reasons


def test_the_cross_check_rejects_group_sums_further_off_than_the_residuals_allow():
    """The allowance counts the memory's residual only where it meets the standard the
    oracle is polished to (``crosscheck.ORACLE_POLISH_TOL`` of each row's terms): the
    trained model's keys (merged margin system's smallest eigenvalue 5e-8) at their
    optimum, then moved along that eigenvector by 1e-4 in the group sums — a state whose
    KKT residual (~5e-12) and decision function (at the keys) are within tol 1e-9, but
    whose group sums are 1e-4 off the optimum's — are rejected for those sums (counted
    in full, the residual would excuse any move on the oracle's partition)."""
    from svattn.exact.auditor.crosscheck import oracle_comparison
    from svattn.exact.core.kernels import copy_groups
    from svattn.exact.oracle import kkt_residual

    data = np.load(TRAINED)
    X, C, gamma = data["keys"], float(data["C"]), float(data["gamma"])
    mem = SVDDMemory(C, "rbf", gamma)
    mem.extend(X)
    before = oracle_comparison(mem, probes=X, tol=1e-9, seed=0, unique=False)
    assert before.reasons == () and before.group_sum_tol < 1e-6
    K = gram_matrix(mem.keys, "rbf", gamma)
    group, reps = copy_groups(K)
    alpha = mem.alpha
    free = (alpha > 0.0) & (alpha < C)
    margin = np.flatnonzero(np.bincount(group, free, len(reps)) > 0)
    S = [int(np.flatnonzero(group == m)[0]) for m in margin]
    A = np.block([[2.0 * K[np.ix_(S, S)], np.ones((len(S), 1))],
                  [np.ones((1, len(S))), np.zeros((1, 1))]])
    w, V = np.linalg.eigh(A)
    v = V[:, np.argmin(np.abs(w))]
    v *= 1e-4 / np.abs(v[:-1]).max()  # the group sums' largest move: 1e-4
    ss = mem.solver_state
    slots = ss.ordered_slots()
    for m, dv in zip(margin, v[:-1], strict=True):
        member = np.flatnonzero((group == m) & free)[0]
        ss.alpha[slots[member]] += dv
    ss.mu += v[-1]
    moved = mem.alpha
    assert np.all((moved > 0.0) & (moved < C) | ~free)
    assert kkt_residual(K, moved, mem.mu, C) <= 1e-9  # an optimum to tol, not to rounding
    after = oracle_comparison(mem, probes=X, tol=1e-9, seed=0, unique=False)
    assert after.decision_dev <= 1e-9
    assert after.group_sum_dev >= 1e-4 * (1 - 1e-6) > 20 * after.group_sum_tol
    assert any("group of copies" in r for r in after.reasons), after.reasons
