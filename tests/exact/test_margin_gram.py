"""The margin Gram block kept across the segments of one removal (issue #36): after a
margin token leaves (:func:`columns.contract`) or a token joins (:func:`columns.expand`),
:func:`linalg.kss_drop` / :func:`linalg.kss_append` leave exactly the block a fresh
gather reads, so the segment loop's margin solves (:func:`linalg.solve_gathered`) see
the same numbers as before, without a gather per segment."""

from __future__ import annotations

import numpy as np

from svattn.exact import SVDDMemory
from svattn.exact.backends.compiled import columns, linalg
from svattn.exact.core.kktsets import ERROR


def test_kept_block_equals_a_fresh_gather_after_leaves_and_joins():
    rng = np.random.default_rng(3)
    mem = SVDDMemory(1 / 40, "rbf", 2.0)
    mem.extend(rng.normal(size=(400, 3)))
    ss = mem.solver_state.copy()
    nS, hi, soc = ss.nS, ss.hi, ss.slot_of_col
    assert nS >= 20
    kss = np.zeros((ss.ccap, ss.ccap + 8))
    linalg.gather_margin_gram_into(ss.KC, soc, nS, kss)
    qb = np.zeros((ss.ccap + 1, ss.ccap + 1))
    columns.bordered_into(ss.Qinv, nS, qb)

    def fresh(n):
        return linalg.gather_margin_gram(ss.KC, soc, n)

    for p in (3, nS - 2, 0):  # inner, the one before last, the first
        n_was = nS
        nS = columns.contract(qb, ss.KC, ss.XC, ss.ac, soc, ss.col_of_slot, p, nS, hi)
        linalg.kss_drop(kss, p, n_was)
        assert np.array_equal(kss[:nS, :nS], fresh(nS))
    errors = [int(s) for s in soc[nS:ss.chi] if s >= 0 and ss.state[s] == ERROR]
    left = [int(s) for s in soc[nS:ss.chi] if s >= 0]
    for k in (errors + left)[:3]:  # tokens with a cache column outside the margin block
        assert columns.expand(qb, ss.KC, ss.XC, ss.ac, soc, ss.col_of_slot, ss.diag, k, nS, hi,
                              1.0)
        linalg.kss_append(kss, ss.KC, soc, nS)
        nS += 1
        assert np.array_equal(kss[:nS, :nS], fresh(nS))
    # and the solve on the kept block is the solve on a gathered one, bit for bit
    from svattn.exact.backends.compiled import sync_error_sum

    sync_error_sum(ss)
    x1, x2 = np.empty(nS + 1), np.empty(nS + 1)
    other = np.zeros_like(kss)
    Q = np.ascontiguousarray(qb[: nS + 1, : nS + 1])
    linalg.solve_gathered(ss.KC, Q, soc, ss.state, ss.diag, ss.esum, nS, ss.chi, ss.C, x1, kss)
    linalg.solve_partition(ss.KC, Q, soc, ss.state, ss.diag, ss.esum, nS, ss.chi, ss.C, x2,
                           other)
    assert np.array_equal(x1, x2)
