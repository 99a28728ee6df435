"""Copies of a key on the add path: the event loop keeps a group to one free member.

Rows added one by one are driven in by the event loop (both backends). A reserve or
error token that is a copy of a margin token has that token's g, 0, along the whole
path; where the margin block is ill-conditioned (near-copies ~1e-3 apart) the rate of a
copy's g is rounding, far above the loop's rate floor, and its g a rounding-level
negative number, so the loop took it as an entry at t = 0 — beside its sibling. The
Schur-complement test of the expansion, computed through that ill-conditioned inverse,
did not see the copy (3.5e-9 where it is 0), so the margin system turned singular and
the add failed in the finish's refactorisation (``LinAlgError: Singular matrix``).

Each memory here must end at the SVDD optimum: KKT residual within tol, at most one
free member per group of copies, and the decision function and every group's sum of
coefficients equal to the independent dense oracle's (the cross-check of
:mod:`svattn.exact.auditor.crosscheck`); a forget of one of the copies, and of each in
turn, is certified and its certificate verifies (proof from the keys, and the oracle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.auditor.crosscheck import oracle_comparison
from svattn.exact.auditor.verify import verify_deletion
from svattn.exact.core.kernels import gram_matrix

# 17 of the 32 keys of one memory the exact forward of the trained recall model
# results/recall_selection_models/selective-copy-T128-hybrid_sv-d64-lr0.003-s2 builds
# (C = 1/16, gamma = 1/32; written by scripts/make_copies_fixture.py, its command in
# trained_copies.json): six keys equal to the kernel among near-copies.
TRAINED = Path(__file__).parent / "data" / "trained_copies.npz"


def near_copy_stream(seed: int, near: float, n: int = 32, d: int = 4, copies: int = 6
                     ) -> np.ndarray:
    """``n`` keys in pairs ``near`` apart (shuffled), and ``copies`` exact copies of
    one of them inserted at random later positions."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n // 2, d))
    X = np.concatenate([base, base + near * rng.normal(size=base.shape)])
    rng.shuffle(X)
    k = int(rng.integers(0, n // 2))
    rows = list(X)
    for p in np.sort(rng.choice(np.arange(k + 1, n + copies), copies, replace=False)):
        rows.insert(min(int(p), len(rows)), X[k].copy())
    return np.array(rows)


# (seed, near, C): streams whose one-by-one adds made the margin system singular
# before the event loop kept copies off the margin (the compiled backend on the first
# three, the reference backend on the last two)
STREAMS = [(0, 1e-3, 1 / 8), (3, 1e-3, 1 / 16), (71, 1e-4, 1 / 16), (12, 1e-4, 1 / 8),
           (13, 1e-3, 1 / 8)]


def copy_groups_of(keys: np.ndarray, gamma: float) -> np.ndarray:
    """Each key's group label: keys the kernel cannot tell apart share one."""
    K = gram_matrix(keys, "rbf", gamma)
    label = np.full(len(keys), -1)
    for i in range(len(keys)):
        if label[i] < 0:
            label[(2.0 - 2.0 * K[i] <= 2e-13) & (label < 0)] = i
    return label


def assert_at_the_optimum(mem: SVDDMemory) -> None:
    """KKT within tol, one free member per group, and the oracle's decision function
    and group sums (1e-9)."""
    assert mem.kkt_residual() <= mem.tol
    label = copy_groups_of(mem.keys, mem.gamma_value)
    alpha = mem.alpha
    free = (alpha > 1e-13 * mem.C) & (alpha < mem.C * (1 - 1e-13))
    assert np.bincount(label[free], minlength=len(alpha)).max(initial=0) <= 1
    cross = oracle_comparison(mem, probes=mem.keys, tol=1e-9, seed=0, unique=False)
    assert cross.reasons == (), cross.reasons
    assert cross.decision_dev <= 1e-9 and cross.group_sum_dev <= 1e-9


def added_one_by_one(X: np.ndarray, C: float, gamma: float, backend: str) -> SVDDMemory:
    mem = SVDDMemory(C, "rbf", gamma, backend=backend)
    for x in X:
        mem.add(x)
    return mem


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize(("seed", "near", "C"), STREAMS)
def test_copies_added_beside_near_copies_end_at_the_optimum(backend, seed, near, C):
    X = near_copy_stream(seed, near)
    mem = added_one_by_one(X, C, 1.0 / X.shape[1], backend)
    assert_at_the_optimum(mem)
    assert mem.n_resolves == 0  # no copy sent the add to the dense re-solve


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_the_trained_models_keys_end_at_the_optimum(backend):
    data = np.load(TRAINED)
    X, C, gamma = data["keys"], float(data["C"]), float(data["gamma"])
    assert len(np.unique(X, axis=0)) == len(X)  # last-bit copies: equal only to the kernel
    assert np.bincount(copy_groups_of(X, gamma)).max() >= 4
    mem = added_one_by_one(X, C, gamma, backend)
    assert_at_the_optimum(mem)
    mem = SVDDMemory(C, "rbf", gamma, backend=backend)
    mem.extend(X)  # (the exact forward's way in: the same adds)
    assert_at_the_optimum(mem)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_forgetting_the_copies_after_the_drive_is_certified(backend):
    """Each exact copy forgotten in turn (the first with room among its siblings goes
    by handing its weight over): every certificate verifies against the keys and the
    oracle, and the memory stays at the optimum."""
    seed, near, C = STREAMS[0]
    X = near_copy_stream(seed, near)
    mem = added_one_by_one(X, C, 1.0 / X.shape[1], backend)
    label = copy_groups_of(mem.keys, mem.gamma_value)
    group = np.flatnonzero(label == np.bincount(label).argmax())
    assert len(group) == 7
    ids = [mem.ids[i] for i in group]
    for k, t in enumerate(ids):
        cert = mem.remove(int(t))
        report = verify_deletion(mem, cert, oracle=True)
        # the proof from the keys and the oracle's decision function hold every time;
        # while copies of the erased key live, the verifier names them (its data is
        # still in the memory) and that is its one failure
        assert report.optimality is not None and report.optimality.ok
        assert report.decision_dev <= 1e-9
        assert sorted(report.copies) == sorted(ids[k + 1:])
        last = k == len(ids) - 1
        assert len(report.reasons) == (0 if last else 1), report.summary()
        assert all("hold the same key and value" in r for r in report.reasons)
        assert report.ok == last
        assert_at_the_optimum(mem)
