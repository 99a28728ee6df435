"""The capacitance system of a removal's path (``backends/compiled/schur.py``) against
its obviously correct reference: the bordered margin system of the active set, formed
and inverted (or solved) densely, after each change of a sequence of drops, joins and
rejoins."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact.backends.compiled import schur

N0, EXTRA = 24, 4


def _setup(seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N0 + EXTRA, 3))
    K = np.exp(-0.4 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    KC = np.ascontiguousarray(K)  # slot i holds cache column i
    cos = np.arange(N0 + EXTRA)
    diag = np.diag(K).copy()
    A0 = _bordered(K, np.arange(N0))
    Q0 = np.linalg.inv(A0)
    qrow_col = np.arange(-1, N0)  # row a of Q0 is slot a - 1 (row 0: mu's)
    return K, KC, cos, diag, Q0, qrow_col


def _bordered(K, slots):
    n = len(slots)
    A = np.zeros((n + 1, n + 1))
    A[0, 1:] = A[1:, 0] = 1.0
    A[1:, 1:] = 2.0 * K[np.ix_(slots, slots)]
    return A


def _check(K, Q0, sy, base_active, joined):
    """materialise and solve_from_z against the dense reference on the active set."""
    slots = [a - 1 for a in base_active] + [s for s, _ in joined]
    cols, cnt = sy[0], sy[1]
    aug = [0] + list(base_active)
    for _, e in joined:
        q = schur.col_index(sy, schur.JOIN, e)
        assert q >= 0
        aug.append(-1 - q)
    m = len(aug)
    out = np.zeros((m, m))
    aug = np.array(aug, dtype=np.int64)
    schur.materialise(Q0, Q0.shape[0], sy, aug, m, out.reshape(-1), False)
    want = np.linalg.inv(_bordered(K, np.array(slots)))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-9 * np.abs(want).max())
    _check_in_place(Q0, sy, aug, out)
    # a solve: z = Q0 b over rows of Q0 (dropped rows 0), bj for the joined
    rng = np.random.default_rng(len(slots))
    rhs = rng.normal(size=m)
    b = np.zeros(Q0.shape[0])
    b[0] = rhs[0]
    for i, a in enumerate(base_active):
        b[a] = rhs[1 + i]
    bj = np.zeros(sy[5].shape[0])
    for i, (_, e) in enumerate(joined):
        bj[e] = rhs[1 + len(base_active) + i]
    z = Q0 @ b
    x, xj = np.empty(Q0.shape[0]), np.zeros(sy[5].shape[0])
    schur.solve_from_z(z, Q0.shape[0], bj, sy, x, xj)
    got = np.concatenate([[x[0]], x[list(base_active)], [xj[e] for _, e in joined]])
    exact = np.linalg.solve(_bordered(K, np.array(slots)), rhs)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-9 * np.abs(exact).max())
    dropped = set(range(1, N0 + 1)) - set(base_active)
    assert all(x[a] == 0.0 for a in dropped)
    assert cnt[0] == len(dropped) + len(joined) and cols.shape[1] == 2


def _check_in_place(Q0, sy, aug, out):
    """Written over a copy of ``Q0`` (with room for two more rows, zeros) where it fits:
    the same floats as ``out`` (each row of ``Q0`` read before a row of the result
    reaches it, upwards or downwards), zeros past the result in the old inverse's
    memory, and nothing written past that memory (NaN guards). Without the room, a
    larger result does not fit."""
    m0, m = Q0.shape[0], out.shape[0]
    room = (m0 + 2) ** 2
    assert schur.fits_in_place(aug, m, m0, room)
    assert schur.fits_in_place(aug, m, m0, m0 * m0) == (m <= m0)
    flat = np.full(room + 16, np.nan)
    flat[:room] = 0.0
    flat[: m0 * m0] = Q0.reshape(-1)
    schur.materialise(flat[: m0 * m0].reshape(m0, m0), m0, sy, aug, m, flat[:room], True)
    np.testing.assert_array_equal(flat[: m * m].reshape(m, m), out)
    assert not flat[m * m: room].any() and np.isnan(flat[room:]).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drops_joins_and_rejoins_match_the_dense_system(seed):
    K, KC, cos, diag, Q0, qrow_col = _setup(seed)
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 12, 6)
    schur.scrub(sy, m0)
    base = list(range(1, N0 + 1))
    joined = []
    _check(K, Q0, sy, base, joined)  # (no change: Q0 itself)
    assert schur.add_drop(Q0, m0, 4, KC, cos, diag, sy)
    base.remove(4)
    _check(K, Q0, sy, base, joined)
    e = schur.new_join(Q0, m0, N0, qrow_col, KC, sy)
    assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)
    joined.append((N0, e))
    _check(K, Q0, sy, base, joined)
    assert schur.add_drop(Q0, m0, 9, KC, cos, diag, sy)
    base.remove(9)
    f = schur.new_join(Q0, m0, N0 + 1, qrow_col, KC, sy)
    assert schur.add_join(Q0, m0, f, KC, cos, diag, sy, 1.0)
    joined.append((N0 + 1, f))
    _check(K, Q0, sy, base, joined)
    assert schur.remove_col(schur.DROP, 4, m0, sy, 1.0)  # token 3 rejoins
    base = sorted(base + [4])
    _check(K, Q0, sy, base, joined)
    assert schur.remove_col(schur.JOIN, e, m0, sy, 1.0)  # the first joined leaves
    joined = [(N0 + 1, f)]
    _check(K, Q0, sy, base, joined)
    assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)  # and comes back
    joined.append((N0, e))
    _check(K, Q0, sy, base, joined)
    schur.scrub(sy, m0)
    assert not sy[1].any() and not sy[4][:3].any() and not sy[5][:2].any()


@pytest.mark.parametrize("drops", [5, 6])
@pytest.mark.parametrize("joins", [0, 1])
def test_a_rank_past_four_matches_the_dense_system_with_a_row_alone(drops, joins):
    """More than four capacitance columns (two sweeps of the rank update) with an odd
    number of rows of Q0 (6 drops: 19), so that a row is updated alone: the inverse
    materialised equals the dense one (a row alone passed as both rows of the pair had
    its second sweep added twice)."""
    K, KC, cos, diag, Q0, qrow_col = _setup(drops + 10 * joins)
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 12, 6)
    schur.scrub(sy, m0)
    base = list(range(1, N0 + 1))
    for a in (3, 7, 8, 15, 20, 22)[:drops]:
        assert schur.add_drop(Q0, m0, a, KC, cos, diag, sy)
        base.remove(a)
    joined = []
    for s in range(N0, N0 + joins):
        e = schur.new_join(Q0, m0, s, qrow_col, KC, sy)
        assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)
        joined.append((s, e))
    assert sy[1][0] == drops + joins > 4
    _check(K, Q0, sy, base, joined)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_inverse_written_over_the_old_one_in_a_removal_s_order(seed):
    """A removal's order (``working_set.final_order``): every kept row in its place,
    the holes the dropped rows leave taken by rows from the end and by the joined
    tokens. Written over the old inverse's memory it equals the dense inverse and the
    out-of-place result bit for bit; an order that moves a row of ``Q0`` down
    (``aug[i] < i``: the row would be overwritten before it is read), or a result larger
    than the old inverse, is refused."""
    K, KC, cos, diag, Q0, qrow_col = _setup(seed)
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 12, 6)
    schur.scrub(sy, m0)
    for a in (2, 5, 11):
        assert schur.add_drop(Q0, m0, a, KC, cos, diag, sy)
    e = schur.new_join(Q0, m0, N0, qrow_col, KC, sy)
    assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)
    # holes at rows 2 and 5 taken by the last two rows, hole 11 by the joined token
    aug = list(range(m0))
    aug[2], aug[5], aug[11] = m0 - 1, m0 - 2, -1 - schur.col_index(sy, schur.JOIN, e)
    aug = np.array(aug[: m0 - 2], dtype=np.int64)
    m = len(aug)
    assert schur.fits_in_place(aug, m, m0, m0 * m0)
    slots = [a - 1 if a >= 0 else N0 for a in aug[1:]]
    out = np.zeros((m, m))
    schur.materialise(Q0, m0, sy, aug, m, out.reshape(-1), False)
    want = np.linalg.inv(_bordered(K, np.array(slots)))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-9 * np.abs(want).max())
    _check_in_place(Q0, sy, aug, out)
    # rows moved against the direction of writing are set aside first: the same floats
    moved_down = aug.copy()
    moved_down[8], moved_down[3] = aug[3], aug[8]  # row 3 of Q0 to row 8, 8 to 3
    out2 = np.zeros((m, m))
    schur.materialise(Q0, m0, sy, moved_down, m, out2.reshape(-1), False)
    _check_in_place(Q0, sy, moved_down, out2)
    assert not schur.fits_in_place(aug, m, m0, m * m - 1)  # no room


def test_a_larger_inverse_written_over_the_old_one_downwards():
    """A removal that ends on more margin tokens (two join, one leaves: its hole taken
    by the last row, the joined tokens last) written over the old inverse's memory with
    room to grow: rows written downwards, the moved-up row set aside; equal to the
    dense inverse and to the out-of-place result bit for bit."""
    K, KC, cos, diag, Q0, qrow_col = _setup(4)
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 12, 6)
    schur.scrub(sy, m0)
    assert schur.add_drop(Q0, m0, 6, KC, cos, diag, sy)
    joins = []
    for s in (N0, N0 + 1):
        e = schur.new_join(Q0, m0, s, qrow_col, KC, sy)
        assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)
        joins.append(-1 - schur.col_index(sy, schur.JOIN, e))
    aug = list(range(m0))
    aug[6] = m0 - 1
    aug = np.array(aug[: m0 - 1] + joins, dtype=np.int64)
    m = len(aug)
    assert m == m0 + 1
    slots = [a - 1 for a in aug[1: m0 - 1]] + [N0, N0 + 1]
    out = np.zeros((m, m))
    schur.materialise(Q0, m0, sy, aug, m, out.reshape(-1), False)
    want = np.linalg.inv(_bordered(K, np.array(slots)))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-9 * np.abs(want).max())
    _check_in_place(Q0, sy, aug, out)


def test_a_copy_joining_fails_its_pivot_and_leaves_the_system_unchanged():
    """A token whose kernel column equals a margin token's makes the bordered system
    singular: the join reports False (as a rank-one append does) and the system is as
    before."""
    K, KC, cos, diag, Q0, qrow_col = _setup(3)
    K[N0, :] = K[2, :]
    K[:, N0] = K[:, 2]
    K[N0, N0] = K[2, 2]
    KC = np.ascontiguousarray(K)
    diag = np.diag(K).copy()
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 8, 4)
    schur.scrub(sy, m0)
    assert schur.add_drop(Q0, m0, 6, KC, cos, diag, sy)
    before = [a.copy() for a in sy]
    e = schur.new_join(Q0, m0, N0, qrow_col, KC, sy)
    assert not schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)
    assert sy[1][0] == before[1][0] == 1
    np.testing.assert_array_equal(sy[3][:1, :1], before[3][:1, :1])
    _check(K, Q0, sy, [a for a in range(1, N0 + 1) if a != 6], [])


def test_a_warm_refined_solve_starts_from_the_given_solution_and_reads_no_product():
    """``solve_refined(..., warm=True)``: the working set's final solve refines the
    solution it is handed (its last unrefined one) instead of forming ``Q0 b`` again;
    from a start off by 1e-9 it ends where the cold solve and the dense system do, and
    leaves ``z`` unwritten."""
    K, KC, cos, diag, Q0, qrow_col = _setup(4)
    m0 = Q0.shape[0]
    sy = schur.new_system(m0, 12, 6)
    schur.scrub(sy, m0)
    assert schur.add_drop(Q0, m0, 4, KC, cos, diag, sy)  # slot 3 leaves
    e = schur.new_join(Q0, m0, N0, qrow_col, KC, sy)
    assert schur.add_join(Q0, m0, e, KC, cos, diag, sy, 1.0)  # slot N0 joins
    nPos = N0 + 1
    pslot = np.arange(nPos, dtype=np.int64)
    pq = np.append(np.arange(1, N0 + 1), -1).astype(np.int64)
    pe = np.full(nPos, -1, dtype=np.int64)
    pe[N0] = e
    pact = np.ones(nPos, dtype=np.bool_)
    pact[3] = False
    KSS = np.ascontiguousarray(K[:nPos, :nPos])
    esum = np.zeros(N0 + EXTRA)
    none = np.zeros(0, dtype=np.int64)
    active = np.flatnonzero(pact)
    exact = np.linalg.solve(_bordered(K, active), np.concatenate([[1.0], diag[active]]))

    def solve(xt, z, warm):
        schur.solve_refined(Q0, m0, sy, KSS, KC, cos, diag, esum, none, 0, none, 0, 0, 0.1,
                            pslot, pq, pe, pact, nPos, xt, z, warm)
        return np.concatenate([[xt[0]], xt[1:][pact]])

    cold = solve(np.empty(nPos + 1), np.empty(m0), False)
    np.testing.assert_allclose(cold, exact, rtol=0, atol=1e-11)
    start = np.zeros(nPos + 1)
    start[0] = exact[0]
    start[1:][pact] = exact[1:]
    start *= 1.0 + 1e-9 * np.random.default_rng(0).standard_normal(nPos + 1)
    z = np.full(m0, np.nan)
    warm = solve(start, z, True)
    np.testing.assert_allclose(warm, exact, rtol=0, atol=1e-11)
    assert np.isnan(z).all()  # no product with Q0 formed for the start


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 64, 101])
def test_the_symmetric_product_reads_the_upper_triangle_and_equals_numpys(n):
    """``sym_matvec`` (eight rows at a time, then one by one) is ``A @ x`` for a symmetric
    ``A``, to rounding, for sizes around its blocks; it reads nothing below the diagonal
    (made NaN here) past each block of eight, and writes nothing past ``n``."""
    rng = np.random.default_rng(n)
    A = rng.normal(size=(n + 3, n + 3))
    A = A + A.T
    x, y = rng.normal(size=n + 3), np.full(n + 3, 7.0)
    ref = A[:n, :n] @ x[:n]
    for i in range(n):  # below the diagonal blocks of eight: never read
        A[i, : (i // 8) * 8 if i < (n // 8) * 8 else i] = np.nan
    schur.sym_matvec(A, n, x, y)
    np.testing.assert_allclose(y[:n], ref, rtol=1e-13, atol=1e-12)
    assert (y[n:] == 7.0).all()
