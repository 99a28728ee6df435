"""Attacks on the flat exchange (a bound token nearly in the span of the margin keys
makes an exchange with their combination instead of joining): judged by the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.auditor.crosscheck import oracle_comparison


def _exp_keys() -> tuple[np.ndarray, float, float]:
    """26 normal keys in 3-d under the ``exp`` kernel (gamma 2.86: diagonals from ~1 to
    7e14) at C = 1.53/26 (seed 1 of the outside attack's streams)."""
    rng = np.random.default_rng(1)
    d, n = int(rng.integers(2, 5)), int(rng.integers(12, 40))
    gamma = float(rng.uniform(0.2, 3.0))
    X = rng.normal(size=(n, d))
    return X, float(rng.uniform(1.05, 3.0)) / n, gamma


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_join_refused_against_the_scale_but_not_the_tokens_own_diagonal_is_no_flat_exchange(
        backend):
    """The 21st add's path meets token 5 (K_55 = 8.9) at g = 0 beside one margin token
    (K = 502): its Schur complement, 1019, is under SINGULAR_SCHUR times the scale (the
    largest diagonal, 6.7e14), so the expansion refuses it, but it is nowhere near the
    margin key. The flat exchange, which neglects that curvature, moved weight 0.032
    along it and left g_5 at 1019·0.032: KKT 0.022, the oracle's partition missed
    (alpha 0.059 off), with no re-solve. The exchange now holds the complement to the
    token's own diagonal and the path re-solves as before: the oracle's optimum."""
    X, C, gamma = _exp_keys()
    mem = SVDDMemory(C, "exp", gamma, backend=backend)
    for x in X[:21]:
        mem.add(x)
    assert mem.kkt_residual() <= 1e-14
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert not oc.reasons, oc.reasons
    for x in X[21:]:
        mem.add(x)
    assert mem.kkt_residual() <= 1e-14
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert not oc.reasons, oc.reasons
