"""A removal's margin systems solved against the memory's own inverse, held fixed.

A removal's path changes the margin set a few times: a token leaves, another joins.
Following each change with a rank-one update of the bordered inverse reads and writes
its ``(|S| + 1)²`` floats per event, and a copy of the result is written once more at
the end. Here the memory's inverse ``Q0`` of the bordered system ``A0`` of the margin
set ``S0`` the removal starts from is not written on the way: the set changes are held in a
small Schur-complement system beside it, as in the Schur-complement active-set
methods for quadratic programs (Gill, Murray, Saunders and Wright, "Sparse matrix
methods in optimization", SIAM J. Sci. Stat. Comput. 5, 1984; Bartlett and Biegler,
"QPSchur: a dual, active-set, Schur-complement method for large-scale and
structured convex quadratic programming", Optim. Eng. 7, 2006). With ``U`` the
columns of the changes and ``V`` their own block, the augmented system

    [[A0, U], [Uᵀ, V]] [x; w] = [b; b']

has the solution ``z = Q0 b``, ``S w = b' − Uᵀ z`` with the capacitance matrix
``S = V − Uᵀ Q0 U`` (``k × k``), ``x = z − (Q0 U) w``. A token of ``S0`` that leaves the
margin set is a column ``e_a`` (its coefficient held at 0; its row's equation is
taken up by its multiplier, so the rest of the system is the margin system without
it); a token that joins is its column of the bordered matrix, ``u = [1, 2 K(S0, s)]``,
with ``V``'s entries ``2 K(s, s')``. A change costs ``O(|S|·k)`` (a joining token one
product with ``Q0``, ``Q0 u``), a solve ``O(|S|·k + k³)``; the inverse of the margin
set the path ends on is written once (:func:`materialise`, over ``Q0``'s own memory
where it fits): ``Q0 + (Q0 U) S⁻¹ (Q0 U)ᵀ`` on the tokens of ``S0`` kept,
``−(Q0 U) S⁻¹`` beside the joined ones and ``S⁻¹`` between them.

The arrays of one system: ``cols`` ((kcap, 2): each capacitance column's kind,
:data:`DROP` or :data:`JOIN`, and its index: a row of ``Q0`` or a joined token's
entry), ``Sm`` / ``Si`` (``S`` and its inverse), ``Wc`` (``Q0 U``, one row per column),
``Ut`` / ``Wt`` / ``UW`` (each joined token's ``u``, ``Q0 u`` and ``u · Q0 u'``), ``eslot``
(the joined tokens' slots) and ``cnt`` (``[k, joined, the largest k so far]``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import VEC
from svattn.exact.backends.compiled.columns import error_sum_after
from svattn.exact.backends.compiled.linalg import REFINE_ONE_STEP, REFINE_ONE_STEP_DX
from svattn.exact.core.cache import SINGULAR_SCHUR
from svattn.exact.core.compiling import quick_load

DROP, JOIN = 0, 1


@njit(cache=True)
def _inverse(Sm, Si, k):
    """``Si[:k, :k]`` = the inverse of ``Sm[:k, :k]`` (nonsingular: each change checks
    its pivot first), by Gauss-Jordan elimination with partial pivoting: ``k`` is small,
    and a LAPACK call would make a fresh process load numba's registries to link the
    cached kernel (``core.compiling``)."""
    A = np.empty((k, 2 * k))
    for i in range(k):
        for j in range(k):
            A[i, j] = Sm[i, j]
            A[i, k + j] = 1.0 if i == j else 0.0
    for col in range(k):
        piv = col
        for i in range(col + 1, k):
            if abs(A[i, col]) > abs(A[piv, col]):
                piv = i
        if piv != col:
            for j in range(2 * k):
                t = A[col, j]
                A[col, j] = A[piv, j]
                A[piv, j] = t
        d = A[col, col]
        for j in range(2 * k):
            A[col, j] /= d
        for i in range(k):
            if i != col:
                f = A[i, col]
                if f != 0.0:
                    for j in range(2 * k):
                        A[i, j] -= f * A[col, j]
    for i in range(k):
        for j in range(k):
            Si[i, j] = A[i, k + j]


@njit(cache=True)
def _pivot(Sm, Si, k):
    """The pivot of column ``k`` of ``Sm`` against the first ``k``: its diagonal less
    ``s · S⁻¹ s`` (``O(k²)``)."""
    p = Sm[k, k]
    for i in range(k):
        acc = 0.0
        for j in range(k):
            acc += Si[i, j] * Sm[j, k]
        p -= Sm[i, k] * acc
    return p


@njit(cache=True)
def _fill_column(Q0, KC, cos, diag, sy, k):
    """``Sm``'s row and column ``k`` (the new column ``cols[k]``) against the others."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    kind, ref = cols[k, 0], cols[k, 1]
    for q in range(k + 1):
        kq, rq = cols[q, 0], cols[q, 1]
        if kind == DROP and kq == DROP:
            v = -Q0[ref, rq]
        elif kind == DROP:
            v = -Wt[rq, ref]
        elif kq == DROP:
            v = -Wt[ref, rq]
        elif rq == ref:
            v = 2.0 * diag[eslot[ref]] - UW[ref, ref]
        else:
            v = 2.0 * KC[eslot[ref], cos[eslot[rq]]] - UW[rq, ref]
        Sm[k, q] = v
        Sm[q, k] = v


@njit(cache=True)
def _append(Q0, m0, kind, ref, row, KC, cos, diag, sy, floor):
    """Append set change ``(kind, ref)`` to the capacitance system, ``row`` its
    ``Q0 u`` (a row of ``Q0`` for a drop, of ``Wt`` for a join); False, the system
    unchanged, when its pivot fails the change's test (a drop's must be negative, a
    join's above ``floor``)."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    k = cnt[0]
    if k >= cols.shape[0]:
        return False
    cols[k, 0], cols[k, 1] = kind, ref
    _fill_column(Q0, KC, cos, diag, sy, k)
    pivot = _pivot(Sm, Si, k)
    if not (pivot < 0.0 if kind == DROP else pivot > floor):
        return False
    for j in range(m0):
        Wc[k, j] = row[j]
    cnt[0] = k + 1
    cnt[2] = max(cnt[2], k + 1)
    _inverse(Sm, Si, k + 1)
    return True


@njit(cache=True)
def add_drop(Q0, m0, a, KC, cos, diag, sy):
    """A token of ``S0`` (row ``a`` of ``Q0``) leaves the margin set; False, the system
    unchanged, when its pivot is not negative (the inverse's diagonal entry there, which
    a rank-one drop divides by, would not be positive)."""
    return _append(Q0, m0, DROP, a, Q0[a], KC, cos, diag, sy, 0.0)


@njit(cache=True, fastmath=VEC)
def new_join(Q0, m0, s, qrow_col, KC, sy):
    """Enter slot ``s`` (its cache column computed) as joined token ``cnt[1]``: its
    column ``u = [1, 2 K(S0, s)]`` (``qrow_col[a]``: the cache column of row ``a``'s
    token; -1: a row left at 0, whose value the multiplier takes up), ``Q0 u`` (one
    product with the inverse) and ``u · Q0 u'`` against the joined tokens. Returns its
    index, -1 when there is no room."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    e = cnt[1]
    if e >= Ut.shape[0]:
        return -1
    Ut[e, 0] = 1.0
    for a in range(1, m0):
        col = qrow_col[a]
        Ut[e, a] = 2.0 * KC[s, col] if col >= 0 else 0.0
    sym_matvec(Q0, m0, Ut[e], Wt[e])
    for f in range(e + 1):
        acc = 0.0
        for j in range(m0):
            acc += Ut[f, j] * Wt[e, j]
        UW[f, e] = acc
        if f != e:
            acc = 0.0
            for j in range(m0):
                acc += Ut[e, j] * Wt[f, j]
            UW[e, f] = acc
    eslot[e] = s
    cnt[1] = e + 1
    return e


@njit(cache=True)
def add_join(Q0, m0, e, KC, cos, diag, sy, scale):
    """Joined token ``e`` enters the margin system; False, the system unchanged, when its
    pivot (the bordered Schur complement a rank-one append tests) is at most
    ``SINGULAR_SCHUR · scale``: Q would turn singular."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    return _append(Q0, m0, JOIN, e, Wt[e], KC, cos, diag, sy, SINGULAR_SCHUR * scale)


@njit(cache=True)
def remove_col(kind, ref, m0, sy, scale):
    """Take capacitance column ``(kind, ref)`` out: a dropped token of ``S0`` rejoins
    (False unless its bordered Schur complement, the append's pivot, ``−Si[q, q]``,
    exceeds ``SINGULAR_SCHUR · scale``) or a joined token leaves (False unless the inverse's
    diagonal entry there, ``Si[q, q]``, is positive). False leaves the system as it was."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    k = cnt[0]
    q = col_index(sy, kind, ref)
    if q < 0:
        return False
    piv = Si[q, q]
    if kind == DROP:
        if not -piv > SINGULAR_SCHUR * scale:
            return False
    elif not piv > 0.0:
        return False
    last = k - 1
    if q != last:
        cols[q, 0], cols[q, 1] = cols[last, 0], cols[last, 1]
        for j in range(k):
            Sm[q, j] = Sm[last, j]
        for i in range(k):
            Sm[i, q] = Sm[i, last]
        Sm[q, q] = Sm[last, last]
        for j in range(m0):
            Wc[q, j] = Wc[last, j]
    cnt[0] = last
    _inverse(Sm, Si, last)
    return True


@njit(cache=True, fastmath=VEC)
def solve_from_z(z, m0, bj, sy, x, xj):
    """With ``z = Q0 b`` (``m0`` entries), the solution ``x`` (``m0``; a dropped row's
    entry 0) and each joined token's value ``xj[e]`` (``bj[e]``: its right-hand side)."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    k = cnt[0]
    r = np.empty(k)
    for q in range(k):
        ref = cols[q, 1]
        if cols[q, 0] == DROP:
            r[q] = -z[ref]
        else:
            acc = 0.0
            for j in range(m0):
                acc += Ut[ref, j] * z[j]
            r[q] = bj[ref] - acc
    w = np.empty(k)
    for q in range(k):
        acc = 0.0
        for p in range(k):
            acc += Si[q, p] * r[p]
        w[q] = acc
    for j in range(m0):
        x[j] = z[j]
    for q in range(k):
        wq = w[q]
        for j in range(m0):
            x[j] -= wq * Wc[q, j]
    for q in range(k):
        ref = cols[q, 1]
        if cols[q, 0] == DROP:
            x[ref] = 0.0
        else:
            xj[ref] = w[q]


@njit(cache=True, fastmath=VEC)
def sym_matvec(A, n, x, y):
    """``y[:n] = A[:n, :n] x`` for a symmetric ``A`` (the bordered inverse, the margin Gram
    block: symmetric to rounding) from its upper triangle, eight rows at a time: each
    row's part right of their diagonal block read once for eight dot products and one
    update of ``y`` (in cache). About half the reads of the full product, which is bound
    by memory: 1.5-1.7x faster at 2,468 rows (four rows at a time: 1.2-1.3x; ``A @ x`` is
    the reference: equal to rounding where ``A`` is symmetric)."""
    for i in range(n):
        y[i] = 0.0
    i = 0
    while i + 8 <= n:
        r0, r1, r2, r3 = A[i], A[i + 1], A[i + 2], A[i + 3]
        r4, r5, r6, r7 = A[i + 4], A[i + 5], A[i + 6], A[i + 7]
        for a in range(8):  # the diagonal block, from its upper triangle (its lower
            y[i + a] += A[i + a, i + a] * x[i + a]  # one is never read: not even a NaN
            for b in range(a + 1, 8):  # there reaches y)
                v = A[i + a, i + b]
                y[i + a] += v * x[i + b]
                y[i + b] += v * x[i + a]
        x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        x4, x5, x6, x7 = x[i + 4], x[i + 5], x[i + 6], x[i + 7]
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for j in range(i + 8, n):
            xj = x[j]
            v0, v1, v2, v3 = r0[j], r1[j], r2[j], r3[j]
            v4, v5, v6, v7 = r4[j], r5[j], r6[j], r7[j]
            a0 += v0 * xj
            a1 += v1 * xj
            a2 += v2 * xj
            a3 += v3 * xj
            a4 += v4 * xj
            a5 += v5 * xj
            a6 += v6 * xj
            a7 += v7 * xj
            y[j] += (v0 * x0 + v1 * x1 + v2 * x2 + v3 * x3) + (v4 * x4 + v5 * x5 + v6 * x6
                                                                + v7 * x7)
        y[i] += a0
        y[i + 1] += a1
        y[i + 2] += a2
        y[i + 3] += a3
        y[i + 4] += a4
        y[i + 5] += a5
        y[i + 6] += a6
        y[i + 7] += a7
        i += 8
    while i < n:  # the last rows, one at a time
        row = A[i]
        acc = 0.0
        for j in range(i, n):
            acc += row[j] * x[j]
        xi = x[i]
        for j in range(i + 1, n):
            y[j] += row[j] * xi
        y[i] += acc
        i += 1


@njit(cache=True, fastmath=VEC)
def _rank_update_pair(da, db, sa, sb, W, ga, gb, b, n, k):
    """``da[:n] = sa[b:b + n] + Σ_r ga[r] · W[r, b:b + n]`` and the same for ``sb`` into
    ``db``: the rank-``k`` update of a run of two rows of ``Q0`` written where they go,
    four terms a sweep (one write for ``k <= 4``; the loops vectorize over ``t``), each
    load of ``W``'s rows serving both rows (1.6× the speed of one row a time at 2,468
    margin tokens, ``k = 3``). ``da`` and ``db`` must not overlap (past four terms a
    sweep adds to them)."""
    ra = sa[b:b + n]
    rb = sb[b:b + n]
    if k == 0:
        for t in range(n):
            da[t] = ra[t]
            db[t] = rb[t]
        return
    r = 0
    first = True
    while r < k:  # (a term past k: a valid row times 0)
        m = min(4, k - r)
        a0 = ga[r]
        b0 = gb[r]
        a1 = ga[r + 1] if m > 1 else 0.0
        b1 = gb[r + 1] if m > 1 else 0.0
        a2 = ga[r + 2] if m > 2 else 0.0
        b2 = gb[r + 2] if m > 2 else 0.0
        a3 = ga[r + 3] if m > 3 else 0.0
        b3 = gb[r + 3] if m > 3 else 0.0
        w0 = W[r, b:b + n]
        w1 = W[r + 1 if m > 1 else r, b:b + n]
        w2 = W[r + 2 if m > 2 else r, b:b + n]
        w3 = W[r + 3 if m > 3 else r, b:b + n]
        if first:
            for t in range(n):
                x0 = w0[t]
                x1 = w1[t]
                x2 = w2[t]
                x3 = w3[t]
                da[t] = ra[t] + a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                db[t] = rb[t] + b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
        else:
            for t in range(n):
                x0 = w0[t]
                x1 = w1[t]
                x2 = w2[t]
                x3 = w3[t]
                da[t] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                db[t] += b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
        first = False
        r += 4


# rows of Q0 set aside before a write in place, at most (module text of materialise)
SET_ASIDE_ROWS = 64


@njit(cache=True)
def _overwritten_first(aug, i, mT, m0):
    """Whether row ``i`` of the result reads a row of ``Q0`` that the rows written before
    it in place overwrite: rows are written upwards when the result is no larger
    (``aug[i] < i``: a row of Q0 moved down), downwards when it grows (``aug[i] > i``:
    moved up)."""
    a = aug[i]
    return a >= 0 and (a < i if mT <= m0 else a > i)


@njit(cache=True)
def _row_aside(Q0, A, aside, q, buf):
    """Row ``A`` of ``Q0`` as a write in place reads it: the copy set aside first
    (``q >= 0``), else a copy into ``buf`` taken now."""
    if q >= 0:
        return aside[q]
    for j in range(Q0.shape[1]):
        buf[j] = Q0[A, j]
    return buf


@njit(cache=True)
def fits_in_place(aug, mT, m0, room):
    """Whether :func:`materialise` can write the inverse of ``mT`` rows over ``Q0``'s own
    memory of ``room`` floats (``Q0`` row-major in its first ``m0²``): the result fits,
    and at most :data:`SET_ASIDE_ROWS` rows of ``Q0`` must be set aside first (a
    removal's order keeps every row's place or moves one up from the end into a hole:
    :func:`~svattn.exact.backends.compiled.working_set.final_order`; none is set aside
    when the set shrinks, one per hole when it grows)."""
    if mT * mT > room or m0 * m0 > room:
        return False
    n = 0
    for i in range(mT):
        if _overwritten_first(aug, i, mT, m0):
            n += 1
    return n <= SET_ASIDE_ROWS


@njit(cache=True, fastmath=VEC)
def materialise(Q0, m0, sy, aug, mT, dst, in_place):
    """The bordered inverse of the margin system, row-major into ``dst[:mT²]``: its row
    ``i`` is row ``aug[i]`` of the augmented system (``aug[i] >= 0``: a row of ``Q0``;
    ``-1 − q``: the joined token of capacitance column ``q``; ``aug[0]`` is 0, mu's row).
    One read of ``Q0`` and one write of the result, ``O(|S|²·k)`` operations (a rank-k
    update): each run of consecutive rows of ``Q0`` in a row of the result (a removal's
    order moves a few) written once, updated as it is, two rows at a time
    (:func:`_rank_update_pair`).

    ``in_place``: ``dst`` is ``Q0``'s own memory (:func:`fits_in_place` holds). The
    result's rows are written upwards where it is no larger than ``Q0`` (row ``i`` over
    the floats of rows ``<= i`` of ``Q0``), downwards where it grows (into the room past
    ``Q0``); each row of ``Q0`` is copied aside just before the rows written over it,
    and the few that a row written earlier would overwrite first are set aside before
    any is written. The floats past the result (the old inverse's tail) are zeroed.
    The old inverse is then gone, and its memory was read and written once: no second
    array's memory to fault in or write, and none to zero after the operation."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    k = cnt[0]
    G = np.zeros((max(k, 1), m0))  # G = (Q0 U) S⁻¹, by rows
    for r in range(k):
        for q in range(k):
            s = Si[q, r]
            for j in range(m0):
                G[r, j] += s * Wc[q, j]
    # the columns as runs of consecutive rows of Q0
    run_j = np.empty(mT, dtype=np.int64)  # a run's first column, its length, its row
    run_n = np.empty(mT, dtype=np.int64)
    run_b = np.empty(mT, dtype=np.int64)
    nr = 0
    j = 0
    while j < mT:
        if aug[j] < 0:
            j += 1
            continue
        run_j[nr] = j
        run_b[nr] = aug[j]
        j += 1
        while j < mT and aug[j] >= 0 and aug[j] == aug[j - 1] + 1:
            j += 1
        run_n[nr] = j - run_j[nr]
        nr += 1
    joined = np.empty(mT, dtype=np.int64)  # the joined tokens' columns
    nj = 0
    for j in range(mT):
        if aug[j] < 0:
            joined[nj] = j
            nj += 1
    # the rows in groups written together: two rows of Q0, or one row alone
    gs = np.empty(mT + 1, dtype=np.int64)
    ng = 0
    i = 0
    while i < mT:
        gs[ng] = i
        ng += 1
        i += 2 if aug[i] >= 0 and i + 1 < mT and aug[i + 1] >= 0 else 1
    gs[ng] = mT
    # in place: the rows of Q0 a row written earlier would overwrite, set aside first
    aside_of = np.full(mT if in_place else 0, -1, dtype=np.int64)
    n_aside = 0
    if in_place:
        for i in range(mT):
            if _overwritten_first(aug, i, mT, m0):
                aside_of[i] = n_aside
                n_aside += 1
    aside = np.empty((n_aside, m0))
    for i in range(mT if in_place else 0):
        if aside_of[i] >= 0:
            for j in range(m0):
                aside[aside_of[i], j] = Q0[aug[i], j]
    gk = np.zeros(max(k, 1))
    gk2 = np.zeros(max(k, 1))
    alone = np.empty(mT)  # the second row of a row alone's update (discarded)
    sa = np.empty(m0 if in_place else 0)  # in place: the rows an update reads, aside
    sb = np.empty(m0 if in_place else 0)
    down = in_place and mT > m0
    for g in range(ng):
        gi = ng - 1 - g if down else g
        i = gs[gi]
        A = aug[i]
        o = dst[i * mT:(i + 1) * mT]
        if A < 0:  # a joined token's row
            qa = -1 - A
            for j in range(mT):
                B = aug[j]
                o[j] = -G[qa, B] if B >= 0 else Si[qa, -1 - B]
            continue
        i2 = i + 1 if gs[gi + 1] == i + 2 else i  # two rows of Q0 at once
        B = aug[i2]  # (a row alone: its own row again, written to a scratch row)
        for r in range(k):
            gk[r] = G[r, A]
            gk2[r] = G[r, B]
        o2 = dst[i2 * mT:(i2 + 1) * mT] if i2 > i else alone
        if in_place:
            ra = _row_aside(Q0, A, aside, aside_of[i], sa)
            rb = _row_aside(Q0, B, aside, aside_of[i2], sb)
        else:
            ra, rb = Q0[A], Q0[B]
        for q in range(nr):
            j0 = run_j[q]
            _rank_update_pair(o[j0:], o2[j0:], ra, rb, Wc, gk, gk2, run_b[q], run_n[q], k)
        for q in range(nj):
            j = joined[q]
            o[j] = -G[-1 - aug[j], A]
            o2[j] = -G[-1 - aug[j], B]
    if in_place and mT < m0:
        dst[mT * mT:m0 * m0] = 0.0
    G.fill(0.0)
    gk.fill(0.0)
    gk2.fill(0.0)
    alone.fill(0.0)
    sa.fill(0.0)
    sb.fill(0.0)
    aside.fill(0.0)


@njit(cache=True)
def scrub(sy, m0):
    """Zero what a system held (rows of the old inverse, kernel values of the tokens it
    touched)."""
    cols, cnt, Sm, Si, Wc, Ut, Wt, UW, eslot = sy
    k = min(cnt[2] + 1, cols.shape[0])  # (a column that failed its pivot wrote Sm)
    e = cnt[1]
    Sm[:k, :k] = 0.0
    Si[:k, :k] = 0.0
    Wc[:k, :m0] = 0.0
    Ut[:e, :m0] = 0.0
    Wt[:e, :m0] = 0.0
    UW[:e, :e] = 0.0
    cnt[:] = 0


@njit(cache=True)
def new_system(m0, kcap, ecap):
    """The arrays of an empty system over an inverse of ``m0`` rows (module docs)."""
    return (np.zeros((kcap, 2), dtype=np.int64), np.zeros(3, dtype=np.int64),
            np.empty((kcap, kcap)), np.empty((kcap, kcap)), np.empty((kcap, m0)),
            np.empty((ecap, m0)), np.empty((ecap, m0)), np.empty((ecap, ecap)),
            np.empty(ecap, dtype=np.int64))


@njit(cache=True)
def col_index(sy, kind, ref):
    """The capacitance column of ``(kind, ref)``, -1 for none."""
    cols, cnt = sy[0], sy[1]
    for q in range(cnt[0]):
        if cols[q, 0] == kind and cols[q, 1] == ref:
            return q
    return -1



# ------------------------------------------------- the path's margin set by position
# A removal's margin tokens keep a position for its whole course (``pslot[j]``): the
# first ``nS`` are the margin order the removal starts from (row ``pq[j]`` of ``Q0``),
# then every token that joined (``pe[j]``: its joined index; -1 for the first kind);
# ``pact[j]``: whether it is in the margin set now. A position out of the set has
# coefficient 0 in every solution by position (``xt``).


@njit(cache=True)
def rhs_on(KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, pslot, pq, pe, pact,
           nPos, m0, b, bj, rP):
    """The margin system's right-hand side on the path's partition (the error set with
    ``err_in`` added and ``err_out`` taken off): by rows of ``Q0`` (``b``; a dropped row
    0), joined token (``bj``) and position (``rP``, mu's row first)."""
    b[:m0] = 0.0
    r0 = 1.0 - C * (nE + n_in - n_out)
    b[0] = r0
    rP[0] = r0
    for j in range(nPos):
        if not pact[j]:
            rP[j + 1] = 0.0
            continue
        s = pslot[j]
        e = error_sum_after(KC, cos, esum, s, err_in, n_in, err_out, n_out)
        v = diag[s] - 2.0 * C * e
        rP[j + 1] = v
        if pe[j] < 0:
            b[pq[j]] = v
        else:
            bj[pe[j]] = v


@njit(cache=True)
def to_positions(xb, xj, pq, pe, pact, nPos, xt):
    """A solution by rows and joined tokens, by position (0 out of the margin set)."""
    xt[0] = xb[0]
    for j in range(nPos):
        if not pact[j]:
            xt[j + 1] = 0.0
        elif pe[j] < 0:
            xt[j + 1] = xb[pq[j]]
        else:
            xt[j + 1] = xj[pe[j]]


@njit(cache=True, fastmath=VEC)
def solve_refined(Q0, m0, sy, KSS, KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C,
                  pslot, pq, pe, pact, nPos, xt, z, warm):
    """``xt`` (by position) = the solution on the path's partition, with the iterative
    refinement of :func:`~svattn.exact.backends.compiled.linalg.refine` (two steps, the
    second skipped on the same test) against the Gram block by position
    ``KSS[:nPos, :nPos]``; ``z`` keeps ``Q0 b`` (the start of the unrefined solves that
    follow). Each step reads ``KSS`` and ``Q0`` once. ``warm``: ``xt`` holds the
    partition's solution as the inverse gives it already (the working set's last
    unrefined solve, :func:`~svattn.exact.backends.compiled.working_set.unrefined_solve`:
    ``Q0 b`` moved by known columns), so the refinement starts from it, one read of
    ``Q0`` fewer (``z`` not written). Returns the first residual's relative size,
    ``‖rhs − Q x‖∞ / ‖rhs‖∞`` for ``x`` as the inverse gives it (the probe residual the
    health reading takes)."""
    ecap = sy[5].shape[0]
    b = np.empty(m0)
    bj = np.zeros(ecap)
    rP = np.empty(nPos + 1)
    rhs_on(KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, pslot, pq, pe, pact,
           nPos, m0, b, bj, rP)
    xb = np.empty(m0)
    xj = np.zeros(ecap)
    if not warm:
        sym_matvec(Q0, m0, b, z)
        solve_from_z(z, m0, bj, sy, xb, xj)
        to_positions(xb, xj, pq, pe, pact, nPos, xt)
    bmax = 0.0
    for i in range(nPos + 1):
        bmax = max(bmax, abs(rP[i]))
    res = np.empty(nPos + 1)
    dxt = np.empty(nPos + 1)
    zr = np.empty(m0)
    first = 0.0
    x2 = np.empty(max(nPos, 1))
    kx = np.empty(max(nPos, 1))
    for step in range(2):
        acc = 0.0
        for j in range(nPos):
            acc += xt[j + 1]
            x2[j] = 2.0 * xt[j + 1]
        res[0] = rP[0] - acc
        sym_matvec(KSS, nPos, x2, kx)  # (rows of positions out of the set: unused)
        for i in range(nPos):
            res[i + 1] = rP[i + 1] - xt[0] - kx[i] if pact[i] else 0.0
        b[:m0] = 0.0
        b[0] = res[0]
        bj[:] = 0.0
        for i in range(nPos):
            if pact[i]:
                if pe[i] < 0:
                    b[pq[i]] = res[i + 1]
                else:
                    bj[pe[i]] = res[i + 1]
        sym_matvec(Q0, m0, b, zr)
        solve_from_z(zr, m0, bj, sy, xb, xj)
        to_positions(xb, xj, pq, pe, pact, nPos, dxt)
        for i in range(nPos + 1):
            xt[i] += dxt[i]
        if step == 0:
            rmax = 0.0
            for i in range(nPos + 1):
                rmax = max(rmax, abs(res[i]))
            first = rmax / bmax if bmax > 0.0 else rmax
            amax = 0.0
            dmax = 0.0
            for i in range(1, nPos + 1):
                amax = max(amax, abs(xt[i]))
                dmax = max(dmax, abs(dxt[i]))
            if (first <= REFINE_ONE_STEP and dmax <= REFINE_ONE_STEP_DX * amax
                    and abs(dxt[0]) <= REFINE_ONE_STEP_DX * abs(xt[0])):
                break
    kx.fill(0.0)  # (products with kernel values: freed zeroed, as the residual's)
    x2.fill(0.0)
    return first


quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
