"""A forget that leaves fewer than ``ceil(1/C)`` tokens takes the memory back to the
warm-up convention (alpha = 1/n, mu = 0) on both backends, whatever set the forgotten
token was in: a margin token's cache column goes with the solution it belonged to.

The reference backend freed the margin token's column before dropping the solution and
refused every such forget (``AssertionError: a margin token's column is freed only
after contraction``): narrow kernels (all tokens on the margin), C just above 1/n, and
the last forgets of a memory with C near 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.auditor.verify import verify_deletion


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize(("n", "C", "gamma"), [(6, 1 / 5.5, 100.0), (4, 1 / 3.5, 3.0),
                                               (2, 0.99, 1.0)])
def test_forgetting_a_margin_token_into_warm_up(backend, n, C, gamma):
    X = np.random.default_rng(0).normal(size=(n, 3))
    mem = SVDDMemory(C, "rbf", gamma, backend=backend)
    for x in X:
        mem.add(x)
    margin = mem.partition()["margin"]
    assert margin
    gone = margin[0]
    cert = mem.remove(gone)
    assert (n - 1) * C < 1 and len(mem) == n - 1
    np.testing.assert_array_equal(mem.alpha, np.full(n - 1, 1.0 / (n - 1)))
    assert verify_deletion(mem, cert, oracle=True).ok
    mem.add(X[gone])  # and back past the threshold: the optimum of all n again
    assert mem.kkt_residual() <= mem.tol
