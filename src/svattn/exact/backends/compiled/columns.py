"""Kernel-cache columns and the bordered inverse, compiled: column allocation (with a
vectorizable exp), moves, frees, and the margin set's expansions and contractions.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import SEG_ESUM_UPDATES, SEG_ILL, VEC
from svattn.exact.core.cache import ILL_SCHUR, SINGULAR_SCHUR
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE


@njit(cache=True, fastmath=VEC)
def row_dot(A, i, B, k):
    """A[i] · B[k] over the last axis."""
    acc = 0.0
    for j in range(A.shape[1]):
        acc += A[i, j] * B[k, j]
    return acc


@njit(cache=True, fastmath=VEC)
def row_sqdist(A, i, B, k):
    """‖A[i] − B[k]‖² from differences: the form ‖a‖² + ‖b‖² − 2a·b cancels
    ~1e-16·‖a‖² and breaks the rbf kernel for keys far from the origin."""
    acc = 0.0
    for j in range(A.shape[1]):
        t = A[i, j] - B[k, j]
        acc += t * t
    return acc


@njit(cache=True, fastmath=VEC)
def matvec_lead(Q, v, m, out, sign):
    """out[:m] = sign · Q[:m, :m] @ v[:m]."""
    for i in range(m):
        acc = 0.0
        for j in range(m):
            acc += Q[i, j] * v[j]
        out[i] = sign * acc


@njit(cache=True)
def add_block_matvec(KC, w, n_cols, hi, out):
    """out[:hi] += KC[:hi, :n_cols] @ w[:n_cols] (columns contiguous: KC is F-ordered).

    Four columns per sweep: ``out`` is read and written a quarter as often, which
    is what bounds the plain column loop (2–2.5× faster at 4k–16k rows).
    """
    j = 0
    while j + 4 <= n_cols:
        w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
        for i in range(hi):
            out[i] += (KC[i, j] * w0 + KC[i, j + 1] * w1) + (KC[i, j + 2] * w2
                                                             + KC[i, j + 3] * w3)
        j += 4
    while j < n_cols:
        wj = w[j]
        for i in range(hi):
            out[i] += KC[i, j] * wj
        j += 1


@njit(cache=True)
def add_column(KC, col, w, hi, out):
    """out[:hi] += w · KC[:hi, col]."""
    for i in range(hi):
        out[i] += KC[i, col] * w


@njit(cache=True)
def swap_cols(KC, XC, ac, soc, cos, hi, p, q):
    if p == q:
        return
    for i in range(hi):
        t = KC[i, p]
        KC[i, p] = KC[i, q]
        KC[i, q] = t
    for j in range(XC.shape[1]):
        t = XC[p, j]
        XC[p, j] = XC[q, j]
        XC[q, j] = t
    t = ac[p]
    ac[p] = ac[q]
    ac[q] = t
    ts = soc[p]
    soc[p] = soc[q]
    soc[q] = ts
    if soc[p] >= 0:
        cos[soc[p]] = p
    if soc[q] >= 0:
        cos[soc[q]] = q


@njit(cache=True)
def free_col(KC, XC, ac, soc, cos, slot, chi):
    col = cos[slot]
    if col < 0:
        return chi
    for i in range(KC.shape[0]):
        KC[i, col] = 0.0
    for j in range(XC.shape[1]):
        XC[col, j] = 0.0
    soc[col] = -1
    cos[slot] = -1
    ac[col] = 0.0
    while chi > 0 and soc[chi - 1] < 0:
        chi -= 1
    return chi


@njit(cache=True)
def error_sum_after(KC, cos, esum, s, err_in, n_in, err_out, n_out):
    """Token ``s``'s error sum (``esum[s]``: its kernel values summed over the error
    set) after the error set gains ``err_in[:n_in]`` and loses ``err_out[:n_out]``,
    one cache entry read per change."""
    e = esum[s]
    for q in range(n_in):
        e += KC[s, cos[err_in[q]]]
    for q in range(n_out):
        e -= KC[s, cos[err_out[q]]]
    return e


@njit(cache=True)
def free_column_available(soc, state, nS, chi, ccap):
    """A column can be had: a hole, room past ``chi``, or a standby column to evict."""
    if chi < ccap:
        return True
    for col in range(nS, chi):
        if soc[col] < 0 or state[soc[col]] == RESERVE:
            return True
    return False


# exp for a kernel column, written so LLVM vectorizes it (numba calls libm's
# scalar exp, ~6x slower here, and its SVML path needs a patched llvmlite):
# Cody–Waite reduction x = k ln2 + r with fdlibm's split of ln 2 (k·LN2_HI is
# exact), |r| <= ln2/2, then exp(r) by its Taylor series to degree 13 (truncation
# below 5e-18) and an exact scaling by 2**k. Within 1 ulp of np.exp
# (tests/exact/test_backends.py); arguments outside [-708, 709], where the
# result leaves the normal range, take libm's exp.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_POW2 = np.ldexp(1.0, np.arange(-1022, 1024))  # 2**k for every normal k
INV_FACT = np.array([1.0 / math.factorial(n) for n in range(13, -1, -1)])


@njit(cache=True, fastmath={"contract"})
def exp_column(KC, col, hi):
    """KC[:hi, col] = exp(KC[:hi, col])."""
    lo_x = math.inf
    hi_x = -math.inf
    for i in range(hi):
        lo_x = min(lo_x, KC[i, col])
        hi_x = max(hi_x, KC[i, col])
    if not (lo_x >= -708.0 and hi_x <= 709.0):  # also on NaN
        for i in range(hi):
            KC[i, col] = math.exp(KC[i, col])
        return
    for i in range(hi):
        x = KC[i, col]
        k = math.floor(x * _LOG2E + 0.5)
        r = (x - k * _LN2_HI) - k * _LN2_LO
        p = INV_FACT[0]
        for n in range(1, 14):
            p = p * r + INV_FACT[n]
        KC[i, col] = p * _POW2[int(k) + 1022]


@njit(cache=True)
def alloc_col(KC, XC, ac, soc, cos, X, diag, alpha, state, slot, nS, chi, hi, gamma,
               is_rbf):
    """Cache ``slot``'s kernel column (:func:`free_column_available` must hold);
    return chi. With no hole and no room, a standby column (a reserve token's)
    is evicted."""
    col = -1
    for j in range(nS, chi):
        if soc[j] < 0:
            col = j
            break
    if col < 0 and chi < KC.shape[1]:
        col = chi
        chi += 1
    if col < 0:
        for j in range(nS, chi):
            if state[soc[j]] == RESERVE:
                col = j
                cos[soc[j]] = -1
                break
    d = X.shape[1]
    kernel_column(KC, X, diag, slot, col, hi, gamma, is_rbf)
    for k in range(d):
        XC[col, k] = X[slot, k]
    soc[col] = slot
    cos[slot] = col
    ac[col] = alpha[slot]
    return chi


@njit(cache=True)
def expand(Qb, KC, XC, ac, soc, cos, diag, k, nS, hi, scale):
    """Add margin token ``k`` to the bordered inverse: :func:`qb_append`'s code (0: Q would
    turn singular, nothing changed; 1: joined; 2: joined, the border ill-conditioned)."""
    col_k = cos[k]
    if nS == 0:
        Qb[0, 0] = -2.0 * diag[k]
        Qb[0, 1] = 1.0
        Qb[1, 0] = 1.0
        Qb[1, 1] = 0.0
        code = 1
    else:
        u = np.empty(nS + 1)
        u[0] = 1.0
        for j in range(nS):
            u[j + 1] = 2.0 * KC[soc[j], col_k]
        code = qb_append(Qb, u, nS, diag[k], scale)
        if code == 0:
            return 0
    swap_cols(KC, XC, ac, soc, cos, hi, col_k, nS)
    return code


@njit(cache=True)
def schur_complement(Qb, u, m, w, d_k):
    """The Schur complement ``2 d_k − uᵀ Q⁻¹ u`` of a token against the ``m − 1`` margin
    tokens whose bordered inverse leads ``Qb`` (``u = [1, 2 K(S, k)]``), with
    ``w[:m] = Q⁻¹ u`` written: twice the squared feature-space distance from the token
    to the affine span of the margin keys."""
    matvec_lead(Qb, u, m, w, 1.0)
    uw = 0.0
    for i in range(m):
        uw += u[i] * w[i]
    return 2.0 * d_k - uw


@njit(cache=True)
def qb_append(Qb, u, n, d_k, scale):
    """Border the inverse of ``n`` margin tokens with one more, whose column of Q is
    ``u = [1, 2 K(S, k)]`` and diagonal ``2 d_k`` (a Schur-complement update). Returns
    0, ``Qb`` untouched, when the complement is at most ``SINGULAR_SCHUR·size`` (``size =
    min(scale, max(1, d_k))``, :func:`svattn.exact.core.cache.border_size`), 2 when it is
    at most ``ILL_SCHUR·size`` (an ill-conditioned border), else 1."""
    m = n + 1
    w = np.empty(m)
    schur = schur_complement(Qb, u, m, w, d_k)
    size = min(scale, max(1.0, d_k))
    if schur <= SINGULAR_SCHUR * size:
        return 0
    for i in range(m):
        wi = w[i] / schur
        for j in range(m):
            Qb[i, j] += wi * w[j]
        Qb[i, m] = -wi
        Qb[m, i] = -wi
    Qb[m, m] = 1.0 / schur
    return 2 if schur <= ILL_SCHUR * size else 1


@njit(cache=True)
def qb_drop(Qb, p, n):
    """Drop margin position ``p`` from the inverse of ``n`` tokens (``n`` >= 2): its
    row and column move last, then a rank-one downdate. Returns ``n - 1``."""
    last = n - 1
    if p != last:
        a, b = p + 1, last + 1
        for j in range(n + 1):
            t = Qb[a, j]
            Qb[a, j] = Qb[b, j]
            Qb[b, j] = t
        for i in range(n + 1):
            t = Qb[i, a]
            Qb[i, a] = Qb[i, b]
            Qb[i, b] = t
    m = last + 1
    piv = Qb[m, m]
    for i in range(m):
        qi = Qb[i, m] / piv
        for j in range(m):
            Qb[i, j] -= qi * Qb[m, j]
    return last


@njit(cache=True)
def contract(Qb, KC, XC, ac, soc, cos, p, nS, hi):
    """Remove the margin token in column ``p`` from the bordered inverse; return nS."""
    if nS == 1:
        return 0
    swap_cols(KC, XC, ac, soc, cos, hi, p, nS - 1)
    return qb_drop(Qb, p, nS)


@njit(cache=True)
def leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, to_error, nS, chi, hi, C):
    """Margin token ``who`` reaches a bound and leaves the bordered inverse: into the
    error set at C (its column stays cached until the operation ends, when the error
    sum takes it: :func:`~.checks.fold_error_columns`) or the reserve set at 0 (its
    column is freed). Returns ``(nS, chi)``."""
    nS = contract(Qb, KC, XC, ac, soc, cos, cos[who], nS, hi)
    if to_error:
        alpha[who] = C
        state[who] = ERROR
        ac[cos[who]] = C
    else:
        alpha[who] = 0.0
        state[who] = RESERVE
        chi = free_col(KC, XC, ac, soc, cos, who, chi)
    return nS, chi


@njit(cache=True)
def copy_of_any(KC, cos, diag, i, slots, n):
    """Whether slot ``i`` is a copy of one of ``slots[:n]`` (each with a cache column):
    keys the kernel cannot tell apart, ``K_ii + K_jj − 2 K_ij <= 1e-13 (K_ii + K_jj)``
    (rbf: ``K_ij >= 1 − 1e-13``, the batch finish's test). A copy of a margin token
    has its g, 0 along the whole path: it never joins the margin set beside it (the
    group's coefficient budget is one; ``docs/design.md``, duplicates)."""
    for q in range(n):
        s = slots[q]
        if s == i:
            continue
        dd = diag[i] + diag[s]
        if dd - 2.0 * KC[i, cos[s]] <= 1e-13 * dd:
            return True
    return False


@njit(cache=True)
def is_copy(diag, k_c, i, c):
    """Whether slot ``i`` is a copy of slot ``c`` (``k_c``: ``c``'s kernel column), by
    :func:`copy_of_any`'s test."""
    dd = diag[i] + diag[c]
    return i != c and dd - 2.0 * k_c[i] <= 1e-13 * dd


@njit(cache=True)
def join_margin(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state, who, nS, chi, hi,
                 gamma, is_rbf, scale):
    """An error or reserve token reaches g = 0 and joins the margin set (a reserve
    token gets its kernel column first). Returns ``(ok, chi)``; ``ok`` is :func:`expand`'s
    code: 0 when Q would turn singular (the caller re-solves), 2 on an ill-conditioned
    border."""
    g[who] = 0.0
    if cos[who] < 0:  # a standby reserve token has its column already
        chi = alloc_col(KC, XC, ac, soc, cos, X, diag, alpha, state, who, nS, chi, hi,
                         gamma, is_rbf)
    state[who] = MARGIN
    return expand(Qb, KC, XC, ac, soc, cos, diag, who, nS, hi, scale), chi


@njit(cache=True)
def flat_exchange(Qb, KC, ac, soc, cos, diag, alpha, g, state, v, up, nS, hi, C, scale, gtol,
                  mu):
    """:func:`svattn.exact.core.cache.flat_exchange` on the work inverse ``Qb``: bound
    token ``v`` (with a cache column) reaches ``g = 0``; where its Schur complement is
    at most ``SINGULAR_SCHUR·min(scale, max(1, K_vv))`` (the size of ``g_v``'s terms, which the
    exchange's neglected curvature moves ``g_v`` against; the core's docstring) it
    first exchanges weight with the margin
    combination it is nearly in the span of (``α_v`` up from the reserve set with
    ``up``, else down; ``(μ, α_S)`` by ``∓t·Q⁻¹u``; every other row's g by
    ``±t·(2K_iv − 2K_iS w_S − w_μ)``), as far as the first bound. Returns
    ``(code, left, mu)``: 0, nothing moved (``v`` can join); 1, the margin slot ``left``
    reached its bound (alpha set there; the caller takes it off the margin, then lets
    ``v`` join); 2, ``v`` reached its other bound (alpha set); 3, nothing moved, a bound
    token's g would cross 0 on the way (beyond ``gtol``): the caller re-solves."""
    m = nS + 1
    cv = cos[v]
    u = np.empty(m)
    w = np.empty(m)
    u[0] = 1.0
    for j in range(nS):
        u[j + 1] = 2.0 * KC[soc[j], cv]
    if schur_complement(Qb, u, m, w, diag[v]) > SINGULAR_SCHUR * min(scale, max(1.0, diag[v])):
        return 0, -1, mu
    sg = 1.0 if up else -1.0
    t = C
    p = -1
    for j in range(nS):
        d = -sg * w[j + 1]
        a = alpha[soc[j]]
        tj = math.inf
        if d < 0.0:
            tj = max(a, 0.0) / -d
        elif d > 0.0:
            tj = max(C - a, 0.0) / d
        if tj < t:
            t = tj
            p = j
    rate = np.empty(hi)
    for i in range(hi):
        rate[i] = 2.0 * KC[i, cv] - w[0]
    for j in range(nS):
        wj = 2.0 * w[j + 1]
        for i in range(hi):
            rate[i] -= wj * KC[i, j]
    st_t = sg * t
    for i in range(hi):
        gi = g[i] + st_t * rate[i]
        if i != v and ((state[i] == RESERVE and gi < -gtol)
                       or (state[i] == ERROR and gi > gtol)):
            return 3, -1, mu
    for i in range(hi):
        if state[i] != MARGIN:
            g[i] += st_t * rate[i]
    g[v] = 0.0
    for j in range(nS):
        alpha[soc[j]] -= st_t * w[j + 1]
        ac[j] = alpha[soc[j]]
    mu -= st_t * w[0]
    if p < 0:
        alpha[v] = C if up else 0.0
        ac[cv] = alpha[v]
        return 2, -1, mu
    alpha[v] = t if up else C - t
    ac[cv] = alpha[v]
    left = soc[p]
    alpha[left] = C if -sg * w[p + 1] > 0.0 else 0.0
    ac[p] = alpha[left]
    return 1, left, mu


@njit(cache=True)
def leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who, to_error, nS, chi,
                    hi, C, out):
    """:func:`leave_margin` for the segment loop: the error
    sum follows its set (counted in ``out[SEG_ESUM_UPDATES]``)."""
    nS, chi = leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, to_error, nS, chi, hi, C)
    if to_error:
        add_column(KC, cos[who], 1.0, hi, esum)
        member[who] = True
        out[SEG_ESUM_UPDATES] += 1
    return nS, chi


@njit(cache=True)
def join_with_sum(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state, esum, member, who,
                   nS, chi, hi, gamma, is_rbf, scale, out):
    """:func:`join_margin` for the segment loop: an error token leaves the error sum
    (by the column it gets for the margin set: error tokens keep none)."""
    ok, chi = join_margin(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state, who, nS, chi,
                          hi, gamma, is_rbf, scale)
    if ok == 2:
        out[SEG_ILL] = 1
    if member[who]:
        add_column(KC, cos[who], -1.0, hi, esum)
        member[who] = False
        out[SEG_ESUM_UPDATES] += 1
    return ok, chi


@njit(cache=True)
def bordered_into(Qinv, nS, Qb):
    """The bordered inverse of ``nS`` margin tokens into ``Qb`` ((ccap + 1)²: room to
    grow to every cache column)."""
    for i in range(nS + 1 if nS else 0):
        for j in range(nS + 1):
            Qb[i, j] = Qinv[i, j]


@njit(cache=True)
def bordered_work(Qinv, nS, ccap):
    """:func:`bordered_into` a new buffer."""
    Qb = np.empty((ccap + 1, ccap + 1))
    bordered_into(Qinv, nS, Qb)
    return Qb


@njit(cache=True)
def bordered_out(Qb, nS):
    """The bordered inverse of ``nS`` margin tokens, as a new exact-size array."""
    out = np.zeros((nS + 1, nS + 1)) if nS else np.zeros((0, 0))
    for i in range(nS + 1 if nS else 0):
        for j in range(nS + 1):
            out[i, j] = Qb[i, j]
    return out


@njit(cache=True)
def kernel_column(KC, X, diag, slot, col, hi, gamma, is_rbf):
    """Write ``slot``'s kernel column into column ``col`` over slots ``[0, hi)``, as
    :func:`alloc_col` computes it (an unpickled state's cache rebuilt with the same
    rounding, :mod:`svattn.exact.records.pickled`)."""
    if is_rbf:
        for i in range(hi):
            KC[i, col] = -gamma * row_sqdist(X, i, X, slot)
    else:
        for i in range(hi):
            KC[i, col] = gamma * row_dot(X, i, X, slot)
    exp_column(KC, col, hi)
    KC[slot, col] = diag[slot]

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
