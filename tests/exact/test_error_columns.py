"""Error tokens keep no kernel column (issue #51): their share of every g is the kept
error sum, updated by one column (computed afresh, then zeroed) when a token enters or
leaves the error set, so the state grows with the margin set, not with n."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import kernel_diag, kernel_matrix
from svattn.exact.core.kktsets import ERROR


def _clustered(n: int, seed: int) -> np.ndarray:
    """Issue #36's clustered rows with 2 % outliers (benchmarks/streams.py), d = 8."""
    rng = np.random.default_rng(seed)
    centers = 3.0 * rng.normal(size=(20, 8))
    X = centers[rng.integers(0, 20, n)] + rng.normal(size=(n, 8))
    out = rng.random(n) < 0.02
    X[out] = rng.uniform(X.min(axis=0), X.max(axis=0), size=(int(out.sum()), 8))
    return X


def _check_error_sum(mem: SVDDMemory) -> None:
    """Between operations: no error token holds a column, the sum's members are the
    error set, and the sum equals the error columns recomputed from the keys."""
    ss = mem.solver_state
    if ss.warm or ss.n == 0:
        return
    hi = ss.hi
    err = np.flatnonzero(ss.state[:hi] == ERROR)
    assert (ss.col_of_slot[err] < 0).all(), "an error token holds a cache column"
    assert ss.esum_valid
    assert set(np.flatnonzero(ss.esum_member[:hi]).tolist()) == set(err.tolist())
    assert not (ss.slot_of_col[: ss.chi] < 0).any(), "a hole below chi"
    live = ss.live_slots()
    direct = kernel_matrix(ss.X[live], ss.X[err], ss.kernel, ss.gamma_value).sum(axis=1)
    own = np.isin(live, err)  # a cached column's own entry is the diagonal
    direct[own] += ss.diag[live[own]] - kernel_diag(ss.X[live[own]], ss.kernel,
                                                     ss.gamma_value)
    np.testing.assert_allclose(ss.esum[live], direct, rtol=0,
                               atol=1e-12 * max(1.0, float(np.abs(direct).max(initial=0))))


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_the_error_sum_is_the_recomputed_error_columns_after_random_operations(backend, kernel):
    rng = np.random.default_rng(11)
    scale = 0.4 if kernel == "exp" else 1.0
    X = rng.normal(size=(400, 5)) * scale
    mem = SVDDMemory(1 / 30, kernel=kernel, backend=backend)
    mem.extend(X[:150])
    _check_error_sum(mem)
    j, seen_error = 150, 0
    for step in range(60):
        part = mem.partition()
        seen_error += len(part["error"])
        op = rng.integers(0, 6)
        if op <= 2:  # a removal of an error, margin or reserve token
            kind = ("error", "margin", "reserve")[op]
            if part[kind]:
                mem.remove(int(rng.choice(part[kind])))
        elif op == 3:
            mem.add(X[j])
            j += 1
        elif op == 4:
            mem.extend(X[j : j + 4])
            j += 4
        else:
            ids = mem.ids
            mem.remove_many([int(t) for t in rng.choice(ids, 3, replace=False)])
        _check_error_sum(mem)
        if step % 20 == 19:
            mem.compact()
            _check_error_sum(mem)
    assert mem.kkt_residual() <= mem.tol
    assert j > 200 and seen_error >= 60  # the stream did keep error tokens


def _state_per_row(n: int) -> tuple[float, int, int]:
    mem = SVDDMemory(1.0 / (0.05 * n), "rbf", 0.01)  # ν = 0.05: |E| grows as ν·n
    mem.extend(_clustered(n, seed=5))
    part = mem.partition()
    return mem.view.state_nbytes / len(mem), len(part["margin"]), len(part["error"])


def test_the_state_per_row_is_flat_in_n_while_the_error_set_grows():
    # before issue #51 each error token kept a kernel column of n entries: 8·|E| bytes
    # per row with |E| ≈ ν·n, so 4× the rows were ~4× the error share per row
    small, m_small, e_small = _state_per_row(2000)
    large, m_large, e_large = _state_per_row(8000)
    assert e_large >= 3 * e_small  # the error set grows with n ...
    assert m_large <= 2 * m_small + 16  # ... the margin set barely
    assert large <= 1.25 * small, (small, large)
    # bytes per row ≈ 8·(|S| + d + small): the margin and standby columns, the key, the
    # per-slot arrays and the cache's room, independent of the error set
    assert large <= 8 * (1.5 * m_large + 16 + 8 + 64) + 200
