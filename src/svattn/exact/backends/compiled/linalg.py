"""Small dense linear algebra of the bordered system, compiled: margin solves with
iterative refinement, the margin Gram gather, health measures, a Cholesky test and
the kept factor's updates (a row deleted by Givens rotations, a row appended).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import VEC
from svattn.exact.backends.compiled.columns import contract, matvec_lead
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR


@njit(cache=True)
def contract_margin(Qinv, KC, XC, ac, soc, cos, p, nS, hi):
    """:meth:`SVDDMemory._contract` compiled: returns ``(nS, Qinv)``."""
    Qb = Qinv.copy()
    nS = contract(Qb, KC, XC, ac, soc, cos, p, nS, hi)
    if nS == 0:
        return 0, np.zeros((0, 0))
    return nS, Qb[: nS + 1, : nS + 1].copy()


@njit(cache=True, fastmath=VEC)
def solve_partition(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS):
    """``x = [mu, alpha_S]`` on the current partition (error tokens at C, every other
    non-margin token at 0), with iterative refinement (:func:`refine`, whose probe
    residual it returns). ``KSS[:nS, :nS]`` receives the margin Gram block
    (gathered once from the cache's margin rows; the refinement reads it there).

    The error tokens' share of the right-hand side is read from the (synced)
    error-column sum ``esum`` at the margin rows; the numpy reference sums their
    cached columns there instead.
    """
    gather_margin_gram_into(KC, soc, nS, KSS)
    return solve_gathered(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS)


@njit(cache=True, fastmath=VEC)
def solve_gathered(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS):
    """:func:`solve_partition` with ``KSS[:nS, :nS]`` holding the margin Gram block
    already (kept up to date by :func:`kss_drop` and :func:`kss_append` between the
    segments of one removal: the gather, the largest part of a segment's margin solve
    at hundreds of margin tokens — its reads are scattered over the cache's rows —
    is paid once per removal, not once per segment)."""
    nE = 0  # (error tokens keep no cache column: counted by slot)
    for i in range(state.shape[0]):
        if state[i] == ERROR:
            nE += 1
    m = nS + 1
    rhs = np.empty(m)
    rhs[0] = 1.0 - C * nE
    for i in range(nS):
        si = soc[i]
        rhs[i + 1] = diag[si] - 2.0 * C * esum[si]
    matvec_lead(Qinv, rhs, m, x, 1.0)
    return refine(Qinv, KSS, rhs, x, nS)


@njit(cache=True)
def kss_drop(KSS, p, n):
    """The margin Gram block of ``n`` tokens after :func:`columns.contract` of position
    ``p``: the last token takes position ``p`` (its row and column swapped in), the
    block is then ``n - 1`` square. The same values a gather would read (the cache's
    columns are moved, never recomputed)."""
    last = n - 1
    if p != last:
        for j in range(n):
            t = KSS[p, j]
            KSS[p, j] = KSS[last, j]
            KSS[last, j] = t
        for i in range(n):
            t = KSS[i, p]
            KSS[i, p] = KSS[i, last]
            KSS[i, last] = t


@njit(cache=True)
def kss_append(KSS, KC, soc, n):
    """The margin Gram block of ``n`` tokens after :func:`columns.expand` put one more
    at position ``n``: its row and column read from the cache, as a gather would."""
    s = soc[n]
    for j in range(n + 1):
        KSS[n, j] = KC[s, j]
    for i in range(n):
        KSS[i, n] = KC[soc[i], n]


# A first residual this small (relative to the right-hand side) and a first correction
# this small (relative to mu and to the largest alpha) leave nothing for a second
# refinement step: its correction is the inverse's defect times the first one. On a
# well-conditioned margin system (the ICU vitals: r near 1e-13, corrections near 1e-11)
# one step does; near-copies (cond 1e8 and more) make the first correction large, and
# the second step runs (without it a group of copies' alpha sum ended 1e-7 off the
# oracle's, tests/exact/test_copies_on_the_drive.py).
REFINE_ONE_STEP = 1e-8
REFINE_ONE_STEP_DX = 1e-10


@njit(cache=True, fastmath=VEC)
def refine(Qinv, K, rhs, x, n):
    """Iterative refinement of ``x = Qinv rhs`` against ``Q = [[0, 1^T], [1, 2 K]]``
    (``K`` the Gram block of the ``n`` margin tokens): two steps, the second skipped when
    the first residual is at most :data:`REFINE_ONE_STEP` and the first correction at
    most :data:`REFINE_ONE_STEP_DX` of mu and of the largest alpha. Each step
    reads ``K`` and ``Qinv`` once (``O(|S|²)``): the second was half of a settled
    removal's solve.

    Returns the first residual's relative size ``‖rhs − Q x‖∞ / ‖rhs‖∞`` (``x`` as
    given: ``Qinv rhs``): the inverse's residual on the probe ``rhs``, the measure
    :func:`bordered_health` takes on a fixed probe."""
    m = n + 1
    res = np.empty(m)
    dx = np.empty(m)
    bmax = 0.0
    for i in range(m):
        bmax = max(bmax, abs(rhs[i]))
    first = 0.0
    for step in range(2):
        acc = 0.0
        for j in range(n):
            acc += x[j + 1]
        res[0] = rhs[0] - acc
        for i in range(n):
            r = rhs[i + 1] - x[0]
            for j in range(n):
                r -= K[i, j] * (2.0 * x[j + 1])
            res[i + 1] = r
        matvec_lead(Qinv, res, m, dx, 1.0)
        for i in range(m):
            x[i] += dx[i]
        if step == 0:
            rmax = 0.0
            for i in range(m):
                rmax = max(rmax, abs(res[i]))
            first = rmax / bmax if bmax > 0.0 else rmax
            amax = 0.0
            dmax = 0.0
            for i in range(1, m):
                amax = max(amax, abs(x[i]))
                dmax = max(dmax, abs(dx[i]))
            if (first <= REFINE_ONE_STEP and dmax <= REFINE_ONE_STEP_DX * amax
                    and abs(dx[0]) <= REFINE_ONE_STEP_DX * abs(x[0])):
                break
    return first


@njit(cache=True)
def gather_margin_gram_into(KC, soc, nS, out):
    """``out[:nS, :nS] = K_SS`` from the cache's margin rows (margin order). Column by
    column: each read stays in one contiguous cache column (KC is F-ordered), where
    row by row every read was a cache miss (3x slower at 16k rows, 300 columns); and
    within a column in increasing row order (the margin order is the order tokens
    joined: its rows scattered over the column defeated the prefetcher, ~45 ns a read
    at 4k rows and 1,155 margin tokens)."""
    order = np.argsort(soc[:nS])
    for j in range(nS):
        for q in range(nS):
            i = order[q]
            out[i, j] = KC[soc[i], j]


@njit(cache=True)
def gather_margin_gram(KC, soc, nS):
    """The margin Gram block ``K_SS`` as a dense array (rows and columns in margin order)."""
    K = np.empty((nS, nS))
    gather_margin_gram_into(KC, soc, nS, K)
    return K


@njit(cache=True)
def solve_margin(KC, Qinv, soc, cos, state, diag, alpha, ac, esum, nS, chi, C, KSS):
    """alpha_S and mu on the current partition (:func:`solve_partition`, which
    leaves ``K_SS`` in ``KSS``), then alpha of every cached column into ``ac``.

    Returns ``(mu, n_at_bound)``: how many margin coefficients landed within
    1e-13·C of 0 or C (the caller then moves them to that bound's set).
    """
    for col in range(nS, chi):
        sl = soc[col]
        if sl >= 0 and state[sl] == ERROR:
            alpha[sl] = C
    x = np.empty(nS + 1)
    solve_partition(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS)
    n_at_bound = 0
    tol = 1e-13 * C
    for i in range(nS):
        a = x[i + 1]
        alpha[soc[i]] = a
        if min(abs(a - C), abs(a)) <= tol:
            n_at_bound += 1
    for col in range(chi):
        sl = soc[col]
        ac[col] = alpha[sl] if sl >= 0 else 0.0
    return x[0], n_at_bound


@njit(cache=True, fastmath=VEC)
def bordered_health(Qinv, KSS, nS):
    """``(cond1, inverse residual)`` of ``Qinv`` given the margin Gram block
    ``KSS`` (see HealthMonitor.measure), in one pass over each block along its rows:
    the 1-norms' column sums go into one accumulator per column (each column's sum in
    row order, the order of a column-by-column loop: the same bits), beside the probe's
    products ``Qinv v`` and ``K_SS w``. Column by column, every read of the C-ordered
    blocks was a cache miss, and four passes read them (2 ms at 781 margin tokens; now
    two passes, 0.3 ms)."""
    m = nS + 1
    v = np.empty(m)
    vmax = 0.0
    for i in range(m):
        v[i] = math.cos(0.7 * i) + 0.5
        vmax = max(vmax, abs(v[i]))
    sums = np.zeros(m)
    w = np.empty(m)  # Qinv v (matvec_lead's sums), beside Qinv's column sums
    for i in range(m):
        acc = 0.0
        for j in range(m):
            q = Qinv[i, j]
            sums[j] += abs(q)
            acc += q * v[j]
        w[i] = acc
    norm_qinv = 0.0
    for j in range(m):
        norm_qinv = max(norm_qinv, sums[j])
        sums[j] = 0.0
    acc = 0.0
    for j in range(nS):
        acc += w[j + 1]
    rmax = abs(acc - v[0])
    for i in range(nS):  # Q w - v on the margin rows, beside K_SS's column sums
        r = w[0] - v[i + 1]
        for j in range(nS):
            k = KSS[i, j]
            sums[j] += abs(k)
            r += 2.0 * k * w[j + 1]
        rmax = max(rmax, abs(r))
    colmax = 0.0
    for j in range(nS):
        colmax = max(colmax, sums[j])
    norm_q = max(float(nS), 1.0 + 2.0 * colmax)
    return norm_q * norm_qinv, rmax / vmax


# ------------------------------------------------ uniqueness and the kept factor
@njit(cache=True, fastmath=VEC)
def cholesky_into(K, n, shift, L):
    """``L[:n, :n]`` = the lower Cholesky factor of the symmetric part of ``K[:n, :n]``
    minus ``shift · I`` (:func:`positive_definite`'s loop, into a kept buffer whose
    upper triangle is zero); False, ``L`` partly written, when there is none."""
    for j in range(n):
        s = K[j, j] - shift
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:  # also False on NaN
            return False
        ljj = math.sqrt(s)
        L[j, j] = ljj
        for i in range(j + 1, n):
            a = 0.5 * (K[i, j] + K[j, i])
            for k in range(j):
                a -= L[i, k] * L[j, k]
            L[i, j] = a / ljj
    return True


@njit(cache=True, fastmath=VEC)
def positive_definite(K, rel_shift):
    """True when the symmetric part of ``K`` minus ``rel_shift · trace(K) · I`` has a
    Cholesky factor (``np.linalg.cholesky`` succeeding is the reference): the loop of
    :func:`cholesky_into`, whose inner products vectorize (a rounding-level reordering,
    as LAPACK's blocking is: 3x faster at 300 margin tokens, where this was the largest
    part of a removal), into a temporary freed zeroed."""
    n = K.shape[0]
    tr = 0.0
    for i in range(n):
        tr += K[i, i]
    L = np.zeros((n, n))
    ok = cholesky_into(K, n, rel_shift * tr, L)
    L.fill(0.0)  # a factor of kernel values: nothing of it outlives the test
    return ok


@njit(cache=True, fastmath=VEC)
def chol_delete(L, p, n):
    """Delete row and column ``p`` of the matrix ``L[:n, :n] L[:n, :n]ᵀ`` in its factor,
    ``L`` column-major (Fortran order: a column's entries adjacent; any order gives the
    same result, slower). With ``L``'s rows below ``p`` split as ``[L31, l32, L33]``
    (before, at, after column ``p``), the smaller matrix's factor is ``[[L11, 0], [L31,
    L33']]`` with ``L33' L33'ᵀ = L33 L33ᵀ + l32 l32ᵀ``: a rank-one update of ``L33`` by
    Givens rotations, column by column, each folding ``l32``'s entry into one diagonal and
    rotating the rest of its column and of ``l32`` (adjacent entries: the loop
    vectorizes, where rotating row-major rows ran as eight chains of dependent entries,
    7.6 ms at p = 0 of 2,468 tokens), the column written where it goes (up one row, left
    one column, ``L31``'s columns moved up one row first). The factor of the smaller
    matrix is unique, so in exact arithmetic it holds nothing of the deleted row (its
    rounding does, as the bordered inverse's downdate's does); the freed last row and
    column are zeroed. Returns ``n - 1``."""
    m = n - 1 - p  # the rows below p
    q = p + 1  # L33's first row and column
    Lt = L.T  # (Lt[j]: column j of L, adjacent entries in column-major order)
    x = np.empty(max(m, 1))
    lp = Lt[p]
    for i in range(m):
        x[i] = lp[q + i]
    for j in range(p):  # L31: up one row, over the deleted row
        src = Lt[j][q:n]
        dst = Lt[j][p:n - 1]
        for i in range(m):
            dst[i] = src[i]
    for k in range(m):
        col = q + k
        a = L[col, col]
        h = math.hypot(a, x[k])
        c = a / h
        s = x[k] / h
        L[col - 1, col - 1] = h
        src = Lt[col][col + 1:n]  # the rest of the column, rotated with l32's rest
        dst = Lt[col - 1][col:n - 1]  # where it goes
        xr = x[k + 1:m]
        for i in range(m - 1 - k):
            t = src[i]
            xi = xr[i]
            dst[i] = c * t + s * xi
            xr[i] = c * xi - s * t
    for j in range(n):  # the freed last row and column
        L[n - 1, j] = 0.0
        L[j, n - 1] = 0.0
    x.fill(0.0)  # rotated kernel-derived values: freed zeroed
    return n - 1


@njit(cache=True, fastmath=VEC)
def chol_hole(L, p, n):
    """Delete row and column ``p`` of ``L[:n, :n] L[:n, :n]ᵀ`` from its factor in place,
    leaving a hole: the rank-one update of :func:`chol_delete` on ``L33`` where it lies
    (column-major: each column's rest rotated with ``l32``'s, adjacent entries), then
    row and column ``p`` those of the unit matrix. The matrix factored is then the one
    without ``p``, with a decoupled unit entry in its place: positive definite exactly
    when the smaller matrix is, a row appended against a zero in its column gets the
    smaller matrix's factor row with a zero there (:func:`chol_append_block`), and
    nothing moves — :func:`chol_delete` moves every row below ``p`` up one row, as many
    entries again as it rotates (more for ``p`` past a third). A hole's own entries
    (zeros, its unit diagonal) pass the later rotations unchanged (skipped). Holes go
    at :func:`chol_compact`. Returns ``n``."""
    q = p + 1
    m = n - q
    Lt = L.T  # (Lt[j]: column j of L)
    x = np.empty(max(m, 1))
    lp = Lt[p]
    for i in range(m):
        x[i] = lp[q + i]
    for k in range(m):
        xk = x[k]
        if xk == 0.0:  # (a hole below p, or an exact zero: the identity rotation)
            continue
        _rotate_into(L, Lt, q + k, n, xk, x[k + 1:m])
    for j in range(p):  # the hole: row and column p of the unit matrix
        L[p, j] = 0.0
    for i in range(p, n):
        lp[i] = 0.0
    L[p, p] = 1.0
    x.fill(0.0)  # rotated kernel-derived values: freed zeroed
    return n


@njit(cache=True, fastmath=VEC)
def _rotate_into(L, Lt, col, n, xk, xr):
    """The Givens rotation that takes a rank-one term's entry ``xk`` in column ``col`` of
    ``L`` (``Lt = L.T``, column-major) into its diagonal, applied to the column's rest
    and the term's (``xr``, the rows below ``col``) in place: :func:`chol_hole`'s and
    :func:`chol_holes`' step (:func:`chol_delete` writes its column one place left,
    source and target apart: its loop is its own, one helper for both ran 1.4× slower)."""
    a = L[col, col]
    h = math.hypot(a, xk)
    c = a / h
    s = xk / h
    L[col, col] = h
    cl = Lt[col][col + 1:n]
    for i in range(n - 1 - col):
        t = cl[i]
        xi = xr[i]
        cl[i] = c * t + s * xi
        xr[i] = c * xi - s * t


@njit(cache=True, fastmath=VEC)
def chol_holes(L, drops, n):
    """:func:`chol_hole` for every row of ``drops`` (distinct) at once: the columns
    below the deleted rows (less their entries in rows deleted with them) are each one
    term of a rank-r update of the rows kept, applied by rotations column by column
    from the first deleted row on — one read and write of the factor below it, where a
    row at a time reads it once per row (each column's rest rotated with every term in
    turn while it is in cache). The same factor up to rounding: the Cholesky factor of
    the matrix without the rows, with unit entries in their places
    (``tests/exact/test_kept_factor.py`` holds it to :func:`chol_hole` a row at a time).
    Returns ``n``."""
    r = drops.shape[0]
    Lt = L.T  # (Lt[j]: column j of L)
    gone = np.zeros(n, dtype=np.bool_)
    pmin = n
    for q in range(r):
        gone[drops[q]] = True
        pmin = min(pmin, drops[q])
    X = np.zeros((r, n))  # each deleted row's column below it: a term of the update
    for q in range(r):
        lp = Lt[drops[q]]
        xq = X[q]
        for i in range(drops[q] + 1, n):
            if not gone[i]:
                xq[i] = lp[i]
    for q in range(r):  # the holes: rows and columns of the unit matrix
        p = drops[q]
        lp = Lt[p]
        for j in range(p):
            L[p, j] = 0.0
        for i in range(p, n):
            lp[i] = 0.0
        L[p, p] = 1.0
    for col in range(pmin + 1, n):
        for q in range(r):
            xq = X[q]
            xk = xq[col]
            if xk == 0.0:  # (a hole, a row above the term's own, or an exact zero)
                continue
            xq[col] = 0.0
            _rotate_into(L, Lt, col, n, xk, xq[col + 1:n])
    X.fill(0.0)  # rotated kernel-derived values: freed zeroed
    return n


@njit(cache=True)
def chol_compact(L, n, live):
    """Close the holes of ``L[:n, :n]`` (column-major): the rows and columns with
    ``live`` set move up and left in order, one read and write of the factor (each entry
    goes to an address at or before its own, read in address order); the freed rows
    and columns are zeroed. Returns the rows left."""
    Lt = L.T
    newpos = np.empty(n, dtype=np.int64)
    k = 0
    for i in range(n):
        newpos[i] = k
        if live[i]:
            k += 1
    for j in range(n):
        if not live[j]:
            continue
        src = Lt[j]
        dst = Lt[newpos[j]]
        for i in range(j, n):
            if live[i]:
                dst[newpos[i]] = src[i]
    for j in range(k):  # below the new block, in its columns
        dst = Lt[j]
        for i in range(k, n):
            dst[i] = 0.0
    for j in range(k, n):  # the freed columns
        dst = Lt[j]
        for i in range(n):
            dst[i] = 0.0
    return k


@njit(cache=True, fastmath=VEC)
def chol_append(L, n, b, d, shift):
    """Append a row ``b`` (its diagonal entry ``d``, then shifted) to the matrix that
    ``L[:n, :n]`` factors: one forward substitution; False, ``L`` unchanged, when the
    grown matrix would not be positive definite."""
    ell = np.empty(n)
    acc = 0.0
    for i in range(n):
        v = b[i]
        for k in range(i):
            v -= L[i, k] * ell[k]
        ell[i] = v / L[i, i]
        acc += ell[i] * ell[i]
    piv = d - shift - acc
    ok = piv > 0.0
    if ok:
        for k in range(n):
            L[n, k] = ell[k]
        L[n, n] = math.sqrt(piv)
    for k in range(n):  # a temporary of kernel-derived values: freed zeroed
        ell[k] = 0.0
    return ok


@njit(cache=True, fastmath=VEC)
def chol_append_block(L, n, B, D, shift):
    """Append the rows ``B[t]`` (``t < nn``: each new token against the ``n`` of
    ``L[:n, :n]``) with their own block ``D`` (``nn × nn``, then shifted on its diagonal)
    at once: one forward substitution with ``nn`` right-hand sides by columns of ``L``,
    four at a time (one read of ``L``, where :func:`chol_append` row by row reads it
    ``nn`` times; adjacent entries in the kept factor's column-major order; each row of
    the right-hand sides read once per four columns), then the factor of the
    ``nn × nn`` Schur complement ``D − shift·I − Y Yᵀ`` — the appended rows' own block,
    the same factor up to rounding. False, ``L`` unchanged, when the grown matrix would
    not be positive definite."""
    nn = B.shape[0]
    Y = np.empty((nn, n))
    for t in range(nn):
        for i in range(n):
            Y[t, i] = B[t, i]
    Lt = L.T  # (Lt[k]: column k of L, adjacent entries in column-major order)
    k = 0
    while k + 4 <= n:  # four columns of L at a time: the rows below them in one sweep
        for t in range(nn):  # (read four streams at once, each row of Y once)
            yt = Y[t]
            v0 = yt[k] / L[k, k]
            v1 = (yt[k + 1] - L[k + 1, k] * v0) / L[k + 1, k + 1]
            v2 = (yt[k + 2] - L[k + 2, k] * v0 - L[k + 2, k + 1] * v1) / L[k + 2, k + 2]
            v3 = (yt[k + 3] - L[k + 3, k] * v0 - L[k + 3, k + 1] * v1
                  - L[k + 3, k + 2] * v2) / L[k + 3, k + 3]
            yt[k], yt[k + 1], yt[k + 2], yt[k + 3] = v0, v1, v2, v3
            c0 = Lt[k][k + 4:n]
            c1 = Lt[k + 1][k + 4:n]
            c2 = Lt[k + 2][k + 4:n]
            c3 = Lt[k + 3][k + 4:n]
            yr = yt[k + 4:n]
            for i in range(n - 4 - k):
                yr[i] -= c0[i] * v0 + c1[i] * v1 + c2[i] * v2 + c3[i] * v3
        k += 4
    first = k
    for k in range(first, n):  # the last columns, one at a time
        d = L[k, k]
        lk = Lt[k][k + 1:n]
        for t in range(nn):
            v = Y[t, k] / d
            Y[t, k] = v
            yr = Y[t][k + 1:n]
            for i in range(n - 1 - k):
                yr[i] -= lk[i] * v
    S = np.zeros((nn, nn))
    for t in range(nn):
        for u in range(t + 1):
            acc = D[t, u]
            for k in range(n):
                acc -= Y[t, k] * Y[u, k]
            S[t, u] = acc
        S[t, t] -= shift
    ok = True
    for t in range(nn):  # (its factor in place, row by row: chol_append's pivots)
        for u in range(t + 1):
            acc = S[t, u]
            for k in range(u):
                acc -= S[t, k] * S[u, k]
            if u < t:
                S[t, u] = acc / S[u, u]
            elif acc > 0.0:
                S[t, t] = math.sqrt(acc)
            else:
                ok = False
        if not ok:
            break
    if ok:
        for t in range(nn):
            for k in range(n):
                L[n + t, k] = Y[t, k]
            for u in range(t + 1):
                L[n + t, n + u] = S[t, u]
    Y.fill(0.0)  # kernel-derived temporaries: freed zeroed
    S.fill(0.0)
    return ok


@njit(cache=True)
def chol_update(L, n, drops, fpos, news, K, shift):
    """The kept factor of ``K``'s block at margin positions ``fpos[:n]`` (-1: a hole;
    factor rows ``drops``, in descending order, made holes first, :func:`chol_holes`)
    grown by the margin positions ``news`` in order, read from ``K`` (margin order,
    symmetric part; all appended at once, :func:`chol_append_block`). Returns the rows
    in use (holes included), or -1 when the appended rows would leave the matrix not
    positive definite (the factor is then partly updated: the caller discards it)."""
    if drops.shape[0] == 1:
        n = chol_hole(L, drops[0], n)
    elif drops.shape[0] > 1:  # (one sweep for all: chol_holes)
        n = chol_holes(L, drops, n)
    nn = news.shape[0]
    if nn == 0:
        return n
    B = np.empty((nn, n))
    D = np.empty((nn, nn))
    for t in range(nn):
        j = news[t]
        for i in range(n):
            f = fpos[i]
            B[t, i] = 0.5 * (K[f, j] + K[j, f]) if f >= 0 else 0.0  # (-1: a hole)
        for u in range(nn):
            D[t, u] = 0.5 * (K[j, news[u]] + K[news[u], j])
    ok = chol_append_block(L, n, B, D, shift)
    B.fill(0.0)  # kernel values: freed zeroed
    D.fill(0.0)
    if not ok:
        return -1
    for t in range(nn):
        fpos[n + t] = news[t]
    return n + nn


quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
