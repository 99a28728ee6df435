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


def _trace(mem: SVDDMemory, rng, steps: int, forget_gram: bool) -> list:
    """Removals (margin, error, reserve in turn) and adds; ``forget_gram``: the Gram copy
    is zeroed after every operation (the behaviour before it was kept)."""
    out = []
    for step in range(steps):
        part = mem.partition()
        kind = ("margin", "error", "reserve", "margin")[step % 4]
        if part[kind]:
            c = mem.remove(int(rng.choice(part[kind])))
            out.append((c.state_digest, c.n_events, c.kkt_residual_after, c.unique_optimum,
                        mem.health.cond1, mem.health.inv_residual))
        if forget_gram:
            mem.solver_state._zero_margin_gram()
        mem.add(rng.normal(size=3) * (2.5 if step % 3 == 0 else 1.0))
        if forget_gram:
            mem.solver_state._zero_margin_gram()
        out.append(mem.state_digest())
    return out


def test_a_gram_block_kept_between_operations_changes_no_number():
    """The next removal's first segment solves with the block the last operation left
    (issue #36: a gather per removal was 3 ms at 781 margin tokens); every certificate,
    digest and health reading equals a twin's that gathers it each time, bit for bit."""
    X = np.random.default_rng(5).normal(size=(400, 3))
    kept, gathered = SVDDMemory(1 / 40, "rbf", 2.0), SVDDMemory(1 / 40, "rbf", 2.0)
    for m in (kept, gathered):
        m.extend(X)
    assert kept.solver_state.nS >= 20
    used = []
    real = kept.solver_state.current_margin_gram

    def spy():
        block = real()
        used.append(block is not None)
        return block

    kept.solver_state.current_margin_gram = spy
    a = _trace(kept, np.random.default_rng(6), 60, False)
    b = _trace(gathered, np.random.default_rng(6), 60, True)
    assert a == b
    assert sum(used) >= 20  # the kept block was read, not only gathered


def test_bordered_health_is_the_column_by_column_definition_bit_for_bit():
    """:func:`linalg.bordered_health` reads its blocks along rows; its column sums are
    the plain column-by-column sums, in row order, to the bit (the digests of the
    health record depend on it)."""
    rng = np.random.default_rng(8)
    for n in (1, 2, 7, 33, 90):
        K = np.zeros((n, n + 8))
        K[:, :n] = rng.normal(size=(n, n)) * 10.0 ** rng.integers(-3, 3)
        Q = rng.normal(size=(n + 1, n + 1)) * 10.0 ** rng.integers(-3, 3)
        colmax = max(sum_in_order(abs(K[i, j]) for i in range(n))
                     for j in range(n))
        norm_q = max(float(n), 1.0 + 2.0 * colmax)
        norm_qinv = max(sum_in_order(abs(Q[i, j]) for i in range(n + 1)) for j in range(n + 1))
        cond, _ = linalg.bordered_health(Q, K, n)
        assert cond == norm_q * norm_qinv


def sum_in_order(values) -> float:
    acc = 0.0
    for v in values:
        acc += v
    return acc
