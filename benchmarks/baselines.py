"""The baseline the exact-core benchmarks time removals against: scikit-learn's retrain."""

from __future__ import annotations

import time

import numpy as np


def sklearn_retrain_seconds(X: np.ndarray, C: float, gamma: float, *, tol: float) -> float:
    """Seconds for ``OneClassSVM`` (rbf, ``nu = 1/(C·n)``, capped at 1) to fit ``X``.

    The same problem as an ``SVDDMemory(C)`` with that rbf ``gamma`` holding ``X``
    (libsvm's ν-form; ``tol`` is its stopping tolerance).
    """
    from sklearn.svm import OneClassSVM

    t = time.perf_counter()
    OneClassSVM(kernel="rbf", gamma=gamma, nu=min(1.0, 1.0 / (C * len(X))), tol=tol,
                cache_size=1000).fit(X)
    return time.perf_counter() - t
