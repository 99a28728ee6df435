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


def clustered_outliers(n: int, d: int = 8, *, n_clusters: int = 20, outlier_rate: float = 0.02,
                       spread: float = 1.0, center_scale: float = 3.0, seed: int = 0
                       ) -> np.ndarray:
    """Gaussian clusters (centres N(0, center_scale²), unit spread) with uniform outliers
    over the clusters' bounding box, shape (n, d): issue #36's stream, on which an rbf
    one-class SVM with γ = 0.1 has hundreds of margin vectors (d = 8, ν = 0.05)."""
    rng = np.random.default_rng(seed)
    centers = center_scale * rng.normal(size=(n_clusters, d))
    X = centers[rng.integers(0, n_clusters, n)] + spread * rng.normal(size=(n, d))
    out = rng.random(n) < outlier_rate
    X[out] = rng.uniform(X.min(axis=0), X.max(axis=0), size=(int(out.sum()), d))
    return X
