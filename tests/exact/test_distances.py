"""The compiled squared distances against the obvious numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact.core.kernels import gram_matrix, sq_distances


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    diff = x[:, None, :] - y[None, :, :]
    return (diff * diff).sum(axis=-1)


@pytest.mark.parametrize("shift", [0.0, 1e4, 1e8], ids=lambda s: f"shift{s:g}")
@pytest.mark.parametrize("m, n, d", [(1, 7, 3), (16, 200, 64), (5, 5, 1)])
def test_sq_distances_equal_the_difference_formula(m, n, d, shift):
    rng = np.random.default_rng(m + n + d)
    x, y = rng.normal(size=(m, d)) + shift, rng.normal(size=(n, d)) + shift
    got = sq_distances(x, y)
    np.testing.assert_allclose(got, reference(x, y), rtol=1e-14, atol=0)
    assert got.shape == (m, n) and got.dtype == np.float64


def test_gram_pairs_are_symmetric_with_a_unit_diagonal_and_equal_the_rows():
    x = np.random.default_rng(0).normal(size=(30, 4)) + 1e6
    K = gram_matrix(x, "rbf", 0.25)
    assert np.array_equal(K, K.T) and np.all(np.diag(K) == 1.0)
    np.testing.assert_allclose(K, np.exp(-0.25 * reference(x, x)), rtol=1e-13, atol=0)
    assert gram_matrix(x[:1], "rbf", 0.25).tolist() == [[1.0]]


def test_non_contiguous_and_integer_input():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    got = sq_distances(x[:, ::2], x[:, ::2])
    np.testing.assert_array_equal(got, reference(x[:, ::2].astype(float), x[:, ::2].astype(float)))


@pytest.mark.parametrize("n", [31, 32, 33, 257])
def test_the_wide_loop_is_bitwise_the_plain_loop(n):
    """Across columns or entry by entry, each distance is the same d additions in the
    same order: the two loops agree bit for bit (inf and NaN included), on both sides of
    the switch, so the switch cannot move a state by a rounding."""
    from svattn.exact.core.kernels import _WIDE, _sq_dist, _sq_dist_wide

    assert 31 < _WIDE <= 32
    rng = np.random.default_rng(n)
    x, y = rng.normal(size=(9, 64)) * 1e3, rng.normal(size=(n, 64)) + 1e7
    x[0, 0], y[-1, 3] = np.inf, np.nan
    plain = _sq_dist(x, y)
    wide = _sq_dist_wide(x, np.ascontiguousarray(y.T))
    assert np.array_equal(plain, wide, equal_nan=True)
    assert np.array_equal(sq_distances(x, y), plain, equal_nan=True)
