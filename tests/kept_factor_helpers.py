"""What the kept uniqueness factor's tests share (``tests/exact/test_kept_factor.py`` and
its attack, ``test_attack_kept_factor_holes.py``): a Gram matrix, numpy's factor as the
reference, and the little of a solver state that ``margin_positive_definite`` reads."""

from __future__ import annotations

import numpy as np

from svattn.exact.core.gram import MarginGramScratch


def rbf_gram(rng: np.random.Generator, n: int, d: int = 4, gamma: float = 0.5) -> np.ndarray:
    """The rbf Gram matrix of ``n`` normal keys in ``d`` dimensions."""
    X = rng.normal(size=(n, d))
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-gamma * sq)


def numpy_factor(K: np.ndarray, shift: float) -> np.ndarray:
    """numpy's lower Cholesky factor of ``K``'s symmetric part minus ``shift · I``."""
    return np.linalg.cholesky(0.5 * (K + K.T) - shift * np.eye(len(K)))


class MarginStub(MarginGramScratch):
    """The little of a SlotState that margin_positive_definite reads."""

    def __init__(self, ids, ccap=16, factor=None):
        self.ids, self.nS, self.ccap, self.pd_factor = np.asarray(ids), len(ids), ccap, factor

    def margin_ids(self):
        return self.ids


def padded_block(K: np.ndarray, ids, ccap: int = 16) -> np.ndarray:
    """``K``'s block of ``ids`` in a Gram buffer of ``ccap`` rows (``ccap + 8`` columns)."""
    kss = np.zeros((ccap, ccap + 8))
    kss[: len(ids), : len(ids)] = K[np.ix_(ids, ids)]
    return kss


def assert_holes_are_unit(L: np.ndarray, n: int, live: np.ndarray) -> None:
    """Each hole of the kept buffer ``L`` (``live`` False) a row and column of the unit
    matrix within its ``n`` rows, and nothing written past them."""
    for p in np.flatnonzero(~live):
        unit = np.zeros(n)
        unit[p] = 1.0
        np.testing.assert_array_equal(L[p, :n], unit)
        np.testing.assert_array_equal(L[:n, p], unit)
    assert not L[n:].any() and not L[:, n:].any()
