"""Synthetic key streams shared by the exact-core benchmarks and tests."""

from __future__ import annotations

import numpy as np


def redundant_stream(n: int, d: int = 64, *, n_clusters: int = 8, outlier_rate: float = 0.01,
                     noise: float = 0.15, seed: int = 0) -> np.ndarray:
    """Clustered keys (many near-repeats) with rare outliers, shape (n, d)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, d))
    X = centers[rng.integers(0, n_clusters, n)] + noise * rng.normal(size=(n, d))
    out = rng.random(n) < outlier_rate
    X[out] = 2.0 * rng.normal(size=(int(out.sum()), d))
    return X


def gaussian_stream(n: int, d: int = 64, *, seed: int = 0) -> np.ndarray:
    """Standard Gaussian keys, shape (n, d)."""
    return np.random.default_rng(seed).normal(size=(n, d))
