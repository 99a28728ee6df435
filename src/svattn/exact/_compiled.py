"""Compiled (numba) parts of the exact memory: the drive's event loop, the
margin solve, the KKT residual, the health measure and small bookkeeping.

:meth:`SVDDMemory._drive_reference` (numpy, one array call per step) is the
obviously-correct reference; :func:`drive_events` does the same steps, event by
event and in the same order, as one compiled loop: at n = 4k the numpy version
spends most of a removal in interpreter overhead between ~300 small array
calls. Floating-point results differ from the reference only by summation
order (BLAS vs loops), so two events that tie to within rounding may be taken
as one or two; ``tests/exact/test_compiled.py`` compares the trajectories.
Each other function names the numpy method it replaces.

:func:`remove_segments` is the removal's first resort: it takes whole segments
of the solution path (one margin solve and one pass over the margin block
each) instead of single events, and hands the rare cases it does not take
(ties, an empty margin set) to :func:`drive_events` from the state it reached.

State arrays are the memory's own (modified in place). ``Qinv`` comes in as the
memory's exact-size array and goes out as a new one (a new object: the health
monitor keys its checks on the object). The loop counters live in ``loop`` so
that a call that stops for Python's help (more cache columns; a move of ``mu``
alone when the margin set is empty) can be resumed where it stopped.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact._states import ERROR, FREE, MARGIN, RESERVE

# status codes of drive_events
DONE, NEED_RESOLVE, NEED_COLUMNS, EMPTY_MARGIN, FALLBACK = 0, 1, 2, 3, 4
# loop[...] indices
EVENTS, ZERO_STEPS, LAST_LEFT, LAST_ENTERED = 0, 1, 2, 3
# remove_segments' integer outputs: out[...] indices
(SEG_EVENTS, SEG_ESUM_UPDATES, SEG_LAST_LEFT, SEG_LAST_ENTERED, SEG_SYNC, SEG_GRAM,
 SEG_PASSES, SEG_JUMPED, SEG_MARGIN, SEG_ERROR, SEG_RESERVE, SEG_UNIQUE,
 SEG_SUPPORT) = range(13)
SEG_OUT = SEG_SUPPORT + 1  # the output's length
# the float outputs of a finished removal: KKT residual, cond1, inverse residual
FACT_KKT, FACT_COND, FACT_INV_RES = range(3)

_RATE_TOL = 1e-13
# Reassociation lets LLVM vectorize the dot products (a rounding-level change);
# no flag that assumes away NaN or inf, which the step tests rely on.
_VEC = {"reassoc", "contract"}


@njit(cache=True, fastmath=_VEC)
def _row_dot(A, i, B, k):
    """A[i] · B[k] over the last axis."""
    acc = 0.0
    for j in range(A.shape[1]):
        acc += A[i, j] * B[k, j]
    return acc


@njit(cache=True, fastmath=_VEC)
def _matvec_lead(Q, v, m, out, sign):
    """out[:m] = sign · Q[:m, :m] @ v[:m]."""
    for i in range(m):
        acc = 0.0
        for j in range(m):
            acc += Q[i, j] * v[j]
        out[i] = sign * acc


@njit(cache=True)
def _add_block_matvec(KC, w, n_cols, hi, out):
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
def _add_column(KC, col, w, hi, out):
    """out[:hi] += w · KC[:hi, col]."""
    for i in range(hi):
        out[i] += KC[i, col] * w


@njit(cache=True)
def _swap_cols(KC, XC, ac, soc, cos, hi, p, q):
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
def _free_col(KC, XC, ac, soc, cos, slot, chi):
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
def _free_column_available(soc, state, nS, chi, ccap):
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
# (tests/exact/test_compiled.py); arguments outside [-708, 709], where the
# result leaves the normal range, take libm's exp.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_POW2 = np.ldexp(1.0, np.arange(-1022, 1024))  # 2**k for every normal k
_INV_FACT = np.array([1.0 / math.factorial(n) for n in range(13, -1, -1)])


@njit(cache=True, fastmath={"contract"})
def _exp_column(KC, col, hi):
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
        p = _INV_FACT[0]
        for n in range(1, 14):
            p = p * r + _INV_FACT[n]
        KC[i, col] = p * _POW2[int(k) + 1022]


@njit(cache=True)
def _alloc_col(KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, slot, nS, chi, hi, gamma,
               is_rbf):
    """Cache ``slot``'s kernel column (:func:`_free_column_available` must hold);
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
    for i in range(hi):
        dot = _row_dot(X, i, X, slot)
        if is_rbf:
            v = xn2[i] + xn2[slot] - 2.0 * dot
            if v < 0.0:
                v = 0.0
            KC[i, col] = -gamma * v
        else:
            KC[i, col] = gamma * dot
    _exp_column(KC, col, hi)
    KC[slot, col] = diag[slot]
    for k in range(d):
        XC[col, k] = X[slot, k]
    soc[col] = slot
    cos[slot] = col
    ac[col] = alpha[slot]
    return chi


@njit(cache=True)
def _expand(Qb, KC, XC, ac, soc, cos, diag, k, nS, hi, scale):
    """Add margin token ``k`` to the bordered inverse; False if Q turns singular."""
    col_k = cos[k]
    if nS == 0:
        Qb[0, 0] = -2.0 * diag[k]
        Qb[0, 1] = 1.0
        Qb[1, 0] = 1.0
        Qb[1, 1] = 0.0
    else:
        u = np.empty(nS + 1)
        u[0] = 1.0
        for j in range(nS):
            u[j + 1] = 2.0 * KC[soc[j], col_k]
        if not _qb_append(Qb, u, nS, diag[k], scale):
            return False
    _swap_cols(KC, XC, ac, soc, cos, hi, col_k, nS)
    return True


@njit(cache=True)
def _qb_append(Qb, u, n, d_k, scale):
    """Border the inverse of ``n`` margin tokens with one more, whose column of Q is
    ``u = [1, 2 K(S, k)]`` and diagonal ``2 d_k`` (a Schur-complement update);
    False, and ``Qb`` untouched, when the complement is below ``1e-10·scale``."""
    m = n + 1
    w = np.empty(m)
    _matvec_lead(Qb, u, m, w, 1.0)
    uw = 0.0
    for i in range(m):
        uw += u[i] * w[i]
    schur = 2.0 * d_k - uw
    if schur <= 1e-10 * scale:
        return False
    for i in range(m):
        wi = w[i] / schur
        for j in range(m):
            Qb[i, j] += wi * w[j]
        Qb[i, m] = -wi
        Qb[m, i] = -wi
    Qb[m, m] = 1.0 / schur
    return True


@njit(cache=True)
def _qb_drop(Qb, p, n):
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
def _contract(Qb, KC, XC, ac, soc, cos, p, nS, hi):
    """Remove the margin token in column ``p`` from the bordered inverse; return nS."""
    if nS == 1:
        return 0
    _swap_cols(KC, XC, ac, soc, cos, hi, p, nS - 1)
    return _qb_drop(Qb, p, nS)


@njit(cache=True)
def _leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, to_error, nS, chi, hi, C):
    """Margin token ``who`` reaches a bound and leaves the bordered inverse: into the
    error set at C (its column stays cached) or the reserve set at 0 (its column
    is freed). Returns ``(nS, chi)``."""
    nS = _contract(Qb, KC, XC, ac, soc, cos, cos[who], nS, hi)
    if to_error:
        alpha[who] = C
        state[who] = ERROR
        ac[cos[who]] = C
    else:
        alpha[who] = 0.0
        state[who] = RESERVE
        chi = _free_col(KC, XC, ac, soc, cos, who, chi)
    return nS, chi


@njit(cache=True)
def _join_margin(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, who, nS, chi, hi,
                 gamma, is_rbf, scale):
    """An error or reserve token reaches g = 0 and joins the margin set (a reserve
    token gets its kernel column first). Returns ``(ok, chi)``; ``ok`` is False
    when Q would turn singular (the caller re-solves)."""
    g[who] = 0.0
    if cos[who] < 0:  # a standby reserve token has its column already
        chi = _alloc_col(KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, who, nS, chi, hi,
                         gamma, is_rbf)
    state[who] = MARGIN
    return _expand(Qb, KC, XC, ac, soc, cos, diag, who, nS, hi, scale), chi


@njit(cache=True)
def _leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who, to_error, nS, chi,
                    hi, C, out):
    """:func:`_leave_margin` for the segment loop and active-set steps: the error
    sum follows its set (counted in ``out[SEG_ESUM_UPDATES]``)."""
    nS, chi = _leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, to_error, nS, chi, hi, C)
    if to_error:
        _add_column(KC, cos[who], 1.0, hi, esum)
        member[who] = True
        out[SEG_ESUM_UPDATES] += 1
    return nS, chi


@njit(cache=True)
def _join_with_sum(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, esum, member, who,
                   nS, chi, hi, gamma, is_rbf, scale, out):
    """:func:`_join_margin` for the segment loop and active-set steps: an error
    token leaves the error sum first."""
    if member[who]:
        _add_column(KC, cos[who], -1.0, hi, esum)
        member[who] = False
        out[SEG_ESUM_UPDATES] += 1
    return _join_margin(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, who, nS, chi,
                        hi, gamma, is_rbf, scale)


@njit(cache=True)
def _bordered_work(Qinv, nS, ccap):
    """A copy of the bordered inverse with room to grow to every cache column."""
    Qb = np.empty((ccap + 1, ccap + 1))
    for i in range(nS + 1 if nS else 0):
        for j in range(nS + 1):
            Qb[i, j] = Qinv[i, j]
    return Qb


@njit(cache=True)
def _bordered_out(Qb, nS):
    """The bordered inverse of ``nS`` margin tokens, as a new exact-size array."""
    out = np.zeros((nS + 1, nS + 1)) if nS else np.zeros((0, 0))
    for i in range(nS + 1 if nS else 0):
        for j in range(nS + 1):
            out[i, j] = Qb[i, j]
    return out


@njit(cache=True)
def drive_events(KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, Qinv,
                 nS, chi, hi, mu, C, gamma, is_rbf, c, direction, k_c, sgn, loop,
                 max_events, scale):
    """Run the drive's events until done or Python is needed.

    Returns ``(status, nS, chi, mu, Qinv)``; ``status`` is one of DONE,
    NEED_RESOLVE (a degeneracy: re-solve the set), NEED_COLUMNS (grow the
    column cache, call again), EMPTY_MARGIN (move mu alone, call again).
    """
    ccap = KC.shape[1]
    if loop[EVENTS] == 0:  # a fresh drive: c's kernel column and the entry signs
        col_c = cos[c]
        for i in range(hi):
            k_c[i] = KC[i, col_c]
            st = state[i]
            # +1 on error tokens (they enter the margin when g rises to 0), −1 on
            # reserve tokens (when g falls to 0), 0 elsewhere; kept in step with events
            sgn[i] = 1.0 if st == ERROR else (-1.0 if st == RESERVE else 0.0)
    Qb = _bordered_work(Qinv, nS, ccap)
    s = float(direction)
    gtol = 1e-13 * scale
    rho = np.empty(hi)
    beta = np.empty(ccap + 1)
    u = np.empty(ccap + 1)
    t_m = np.empty(ccap)
    wS = np.empty(ccap)
    status = DONE
    while True:
        if not _free_column_available(soc, state, nS, chi, ccap):
            status = NEED_COLUMNS
            break
        loop[EVENTS] += 1
        if loop[EVENTS] > max_events or loop[ZERO_STEPS] > 2 * nS + 20:
            status = NEED_RESOLVE
            break
        if nS == 0:
            status = EMPTY_MARGIN
            break
        m = nS + 1
        u[0] = 1.0
        for j in range(nS):
            u[j + 1] = 2.0 * k_c[soc[j]]
        _matvec_lead(Qb, u, m, beta, -1.0)
        # rho_i = d g_i / dt: 2 (K_iS beta_S + k_ic) + beta_mu, times the direction
        b0 = s * beta[0]
        for i in range(hi):
            rho[i] = 2.0 * s * k_c[i] + b0
        for j in range(nS):
            wS[j] = 2.0 * s * beta[j + 1]
        _add_block_matvec(KC, wS, nS, hi, rho)
        # candidate steps (t >= 0 is |d alpha_c|): c itself
        who = -1
        if direction > 0:
            best_t = C - alpha[c]
            kind = 1  # c_error
            if rho[c] > _RATE_TOL * scale:
                t = max(-g[c], 0.0) / rho[c]
                if t <= best_t:
                    best_t = t
                    kind = 0  # c_margin
        else:
            best_t = alpha[c]
            kind = 2  # c_out
        # a margin coefficient moving down reaches 0, one moving up reaches C
        for j in range(nS):
            r = beta[j + 1] * s
            aS = alpha[soc[j]]
            tj = aS if r < 0 else C - aS
            if tj < 0.0:
                tj = 0.0
            ar = abs(r)
            t_m[j] = math.inf if ar <= _RATE_TOL else tj / ar
        le = loop[LAST_ENTERED]
        if le >= 0:  # no zero-length exit for the token that just entered
            p = cos[le]
            if 0 <= p < nS and t_m[p] == 0.0:
                t_m[p] = math.inf
        jbest = 0
        for j in range(1, nS):
            if t_m[j] < t_m[jbest]:
                jbest = j
        if t_m[jbest] < best_t:
            best_t = t_m[jbest]
            who = soc[jbest]
            kind = 3 if beta[jbest + 1] * s < 0 else 4  # m_reserve / m_error
        # an error token moves towards g = 0 when rho > 0, a reserve one when
        # rho < 0; it gets there at t = −g/rho, i.e. the largest ratio g/rho <= 0
        for j in range(nS):
            rho[soc[j]] = 0.0
        ll = loop[LAST_LEFT]
        ibest = -1
        rbest = -math.inf
        for i in range(hi):  # branch-light: the sign test is unpredictable
            ok = rho[i] * sgn[i] > gtol
            ratio = g[i] / rho[i] if ok else -math.inf
            if ratio > rbest:
                rbest = ratio
                ibest = i
        if ibest == ll and ll >= 0 and rbest >= 0.0:
            # no zero-length re-entry for the token that just left: take the
            # best of the others
            ibest = -1
            rbest = -math.inf
            for i in range(hi):
                ok = rho[i] * sgn[i] > gtol and i != ll
                ratio = g[i] / rho[i] if ok else -math.inf
                if ratio > rbest:
                    rbest = ratio
                    ibest = i
        if ibest >= 0:
            t_i = max(-rbest, 0.0)
            if t_i < best_t:
                best_t = t_i
                kind = 5  # enter
                who = ibest
        if not math.isfinite(best_t):
            status = NEED_RESOLVE
            break
        t = best_t
        loop[ZERO_STEPS] = loop[ZERO_STEPS] + 1 if t == 0.0 else 0
        # move everything linearly
        alpha[c] += s * t
        for j in range(nS):
            sj = soc[j]
            alpha[sj] += beta[j + 1] * s * t
            ac[j] = alpha[sj]
        mu += beta[0] * s * t
        for i in range(hi):
            g[i] += rho[i] * t
        loop[LAST_LEFT] = -1
        loop[LAST_ENTERED] = -1
        # apply the event
        if kind == 0:
            g[c] = 0.0
            state[c] = MARGIN
            ac[cos[c]] = alpha[c]
            if not _expand(Qb, KC, XC, ac, soc, cos, diag, c, nS, hi, scale):
                status = NEED_RESOLVE
                break
            nS += 1
            break
        if kind == 1:
            alpha[c] = C
            state[c] = ERROR
            break
        if kind == 2:
            alpha[c] = 0.0
            break
        if kind == 3 or kind == 4:
            nS, chi = _leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, kind == 4, nS,
                                    chi, hi, C)
            sgn[who] = 1.0 if kind == 4 else -1.0
            loop[LAST_LEFT] = who
        else:
            ok, chi = _join_margin(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, who,
                                   nS, chi, hi, gamma, is_rbf, scale)
            if not ok:
                status = NEED_RESOLVE
                break
            nS += 1
            sgn[who] = 0.0
            loop[LAST_ENTERED] = who
    return status, nS, chi, mu, _bordered_out(Qb, nS)


# ------------------------------------------------------------ active-set jumps
_JUMP_ROOM = 16  # how many more margin tokens than now a step may hold
_JUMP_COLUMNS = 2  # kernel columns the steps of one removal may compute
# The solution path applies one event per pass over the margin block. From the
# end point of the first segment, a primal-dual active-set step instead moves
# every token that violates its condition there at once, and is checked by a
# pass computing the exact g of the result; convexity makes any point that
# meets every KKT condition the optimum, however it was found. Up to
# ``max_jumps`` such steps are tried on a tentative copy (the bordered inverse
# and margin order edited without moving cache columns); only a converged one
# is applied to the memory, else the path goes on from its first event.


@njit(cache=True)
def _t_contract(Qt, tord, p, nT):
    """Drop position ``p`` from the tentative margin order and bordered inverse
    (``_contract`` without moving cache columns); return the new size."""
    if nT == 1:
        return 0
    t = tord[p]
    tord[p] = tord[nT - 1]
    tord[nT - 1] = t
    return _qb_drop(Qt, p, nT)


@njit(cache=True)
def _t_expand(Qt, tord, KC, cos, diag, k, nT, scale):
    """Append token ``k`` (its column cached) to the tentative margin order and
    bordered inverse (``_expand`` without moving cache columns); False when the
    set is empty or Q would turn singular."""
    if nT == 0:
        return False
    u = np.empty(nT + 1)
    u[0] = 1.0
    for j in range(nT):
        u[j + 1] = 2.0 * KC[tord[j], cos[k]]
    if not _qb_append(Qt, u, nT, diag[k], scale):
        return False
    tord[nT] = k
    return True


@njit(cache=True)
def _t_solve(Qt, tord, nT, KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, xt, KTT):
    """``xt = [mu, alpha_T]`` on the tentative partition, with two steps of
    iterative refinement against its Gram block (gathered into ``KTT``).

    The error tokens' share of the right-hand side is the synced error sum
    plus the columns of tokens the tentative partition puts at C (``err_in``)
    minus those of real error tokens it takes off (``err_out``).
    """
    m = nT + 1
    rhs = np.empty(m)
    rhs[0] = 1.0 - C * (nE + n_in - n_out)
    for i in range(nT):
        s = tord[i]
        e = esum[s]
        for q in range(n_in):
            e += KC[s, cos[err_in[q]]]
        for q in range(n_out):
            e -= KC[s, cos[err_out[q]]]
        rhs[i + 1] = diag[s] - 2.0 * C * e
    for i in range(nT):
        s = tord[i]
        for j in range(nT):
            KTT[i, j] = KC[s, cos[tord[j]]]
    _matvec_lead(Qt, rhs, m, xt, 1.0)
    _refine(Qt, KTT, rhs, xt, nT)


@njit(cache=True)
def _try_jumps(KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, esum, Qb, nS, chi, hi, C,
               gamma, is_rbf, scale, c, x, g_end, max_jumps, tstate, tord, Qt, xt, g_try):
    """Active-set steps from the end point ``(x, g_end)`` of the current partition
    without ``c`` (see above). Returns ``(passes, nT, changes, chi)``: ``nT`` >= 1 when a step
    converged (tentative margin order ``tord[:nT]``, solution ``xt``, exact g
    ``g_try``, states ``tstate``), -1 when none did within ``max_jumps`` passes
    or one met a tie, a singular Q or a full cache. Only cache columns of
    entering reserve tokens are written to the memory (a column in a hole or
    past ``chi``, never an eviction).
    """
    ccap = KC.shape[1]
    room = tord.shape[0]
    tol_a = 1e-13 * C
    tie = 1e-12 * scale
    nT = nS
    for i in range(nS):
        tord[i] = soc[i]
    for i in range(nS + 1):
        for j in range(nS + 1):
            Qt[i, j] = Qb[i, j]
    for i in range(hi):
        tstate[i] = state[i]
    for i in range(nS + 1):
        xt[i] = x[i]
    nE = 0
    for col in range(nS, chi):
        sl = soc[col]
        if sl >= 0 and state[sl] == ERROR:
            nE += 1
    err_in = np.empty(ccap, dtype=np.int64)
    err_out = np.empty(ccap, dtype=np.int64)
    n_in = 0
    n_out = 0
    leave = np.empty(room, dtype=np.int64)
    enter = np.empty(hi, dtype=np.int64)
    ac_try = np.empty(ccap)
    KTT = np.empty((room, room))
    g_cur = g_end
    passes = 0
    changes = 0
    new_columns = 0
    while True:
        # the tokens that violate their condition at the current point
        n_leave = 0
        for i in range(nT):
            a = xt[i + 1]
            if abs(a) <= tol_a or abs(a - C) <= tol_a:
                return passes, -1, changes, chi
            if a < 0.0 or a > C:
                leave[n_leave] = i
                n_leave += 1
        n_enter = 0
        for r in range(hi):
            st = tstate[r]
            if st != RESERVE and st != ERROR:
                continue
            gr = g_cur[r]
            if abs(gr) <= tie:
                return passes, -1, changes, chi
            if (st == RESERVE and gr < 0.0) or (st == ERROR and gr > 0.0):
                enter[n_enter] = r
                n_enter += 1
        if n_leave == 0 and n_enter == 0:
            return passes, (nT if passes else -1), changes, chi
        if passes >= max_jumps or nT - n_leave + n_enter > room:
            return passes, -1, changes, chi
        # each entering token without a column costs a pass over every key: a step
        # that needs many is a poor guess (the path computes only those it meets)
        for q in range(n_enter):
            new_columns += cos[enter[q]] < 0
        if new_columns > _JUMP_COLUMNS:
            return passes, -1, changes, chi
        changes += n_leave + n_enter
        # move them: leaving tokens (descending positions keep the rest in place)
        for q in range(n_leave - 1, -1, -1):
            p = leave[q]
            s = tord[p]
            to_error = xt[p + 1] > C
            nT = _t_contract(Qt, tord, p, nT)
            if nT == 0:
                return passes, -1, changes, chi
            tstate[s] = ERROR if to_error else RESERVE
            if to_error:
                if state[s] == ERROR:  # back where it was
                    for z in range(n_out):
                        if err_out[z] == s:
                            n_out -= 1
                            err_out[z] = err_out[n_out]
                            break
                else:
                    err_in[n_in] = s
                    n_in += 1
        for q in range(n_enter):
            s = enter[q]
            if tstate[s] == ERROR:
                if state[s] == ERROR:
                    err_out[n_out] = s
                    n_out += 1
                else:
                    for z in range(n_in):
                        if err_in[z] == s:
                            n_in -= 1
                            err_in[z] = err_in[n_in]
                            break
            if cos[s] < 0:
                free = chi < ccap
                for col in range(nS, chi):
                    if soc[col] < 0:
                        free = True
                        break
                if not free:  # no hole and no room: never evict for a guess
                    return passes, -1, changes, chi
                chi = _alloc_col(KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, s, nS, chi,
                                 hi, gamma, is_rbf)
            if not _t_expand(Qt, tord, KC, cos, diag, s, nT, scale):
                return passes, -1, changes, chi
            nT += 1
            tstate[s] = MARGIN
        _t_solve(Qt, tord, nT, KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, xt,
                 KTT)
        # the exact g of the tentative point: one pass, as g_from_error_sum reads
        # weights (margin block: alpha itself; other columns: alpha minus the
        # error sum's C)
        for col in range(chi):
            sl = soc[col]
            ac_try[col] = C if sl >= 0 and tstate[sl] == ERROR else 0.0
        for i in range(nT):
            ac_try[cos[tord[i]]] = xt[i + 1]
        ac_try[cos[c]] = 0.0
        g_from_error_sum(KC, ac_try, soc, state, esum, diag, xt[0], C, nS, chi, hi, g_try)
        passes += 1
        g_cur = g_try


@njit(cache=True)
def _finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member, state,
                    slot_id, Qb, KSS, nS, chi, hi, mu, C, scale, c, out, facts, sup_ids,
                    sup_values):
    """What a finished removal reports, computed where its arrays are in cache:
    the KKT residual, set sizes, ties and uniqueness, the support in id order
    with its alphas and mu (the digest's input), the health measure of the
    bordered inverse; then ``c``'s array entries are wiped (it left the error
    sum at the start). Equal to :func:`kkt_residual`, :func:`certificate_facts`
    and :func:`bordered_health` (the references). Returns chi.
    """
    # c is skipped: wiped below (alpha 0, no set)
    facts[FACT_KKT], nm, ne, nr, n_tied = _kkt_pass(g, alpha, state, diag, mu, C, hi, c,
                                                   1e-9 * scale)
    out[SEG_MARGIN] = nm
    out[SEG_ERROR] = ne
    out[SEG_RESERVE] = nr
    if n_tied:
        out[SEG_UNIQUE] = -1  # the caller runs the general check with the keys
    elif nS <= 1:
        out[SEG_UNIQUE] = 1
    else:
        out[SEG_UNIQUE] = 1 if positive_definite(KSS[:nS, :nS], 1e-10) else 0
    # the support: margin and error tokens, all of them cached columns
    n = 0
    slots = np.empty(chi, dtype=np.int64)
    for col in range(chi):
        sl = soc[col]
        if sl >= 0 and sl != c and alpha[sl] > 0:
            slots[n] = sl
            sup_ids[n] = slot_id[sl]
            n += 1
    order = np.argsort(sup_ids[:n], kind="mergesort")
    for k in range(n):
        sl = slots[order[k]]
        sup_values[k] = alpha[sl]
        sup_ids[k] = slot_id[sl]
    sup_values[n] = mu
    out[SEG_SUPPORT] = n
    cond, res = bordered_health(Qb, KSS, nS)
    facts[FACT_COND] = cond
    facts[FACT_INV_RES] = res
    chi, _ = wipe_slot_arrays(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, c, chi, hi, True)
    return chi


@njit(cache=True)
def _commit_jump(KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, Qb, esum, member, nS, chi,
                 hi, C, gamma, is_rbf, scale, c, tstate, tord, nT, xt, g_try, out, KSS):
    """Apply a converged active-set step to the memory: margin exits and entries
    through the helpers the path uses (in that order), then the step's alpha,
    mu and exact g. Returns ``(status, nS, chi, mu)``."""
    n_leave = 0
    leavers = np.empty(nS, dtype=np.int64)
    for j in range(nS):
        if tstate[soc[j]] != MARGIN:
            leavers[n_leave] = soc[j]
            n_leave += 1
    for q in range(n_leave):
        who = leavers[q]
        nS, chi = _leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who,
                                  tstate[who] == ERROR, nS, chi, hi, C, out)
    for i in range(nT):
        who = tord[i]
        if state[who] == MARGIN:
            continue
        ok, chi = _join_with_sum(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, esum,
                                 member, who, nS, chi, hi, gamma, is_rbf, scale, out)
        if not ok:
            return NEED_RESOLVE, nS, chi, xt[0]
        nS += 1
    for i in range(nT):
        alpha[tord[i]] = xt[i + 1]
    alpha[c] = 0.0
    for col in range(chi):
        sl = soc[col]
        ac[col] = alpha[sl] if sl >= 0 else 0.0
    for i in range(hi):
        g[i] = g_try[i]
    mu = xt[0]
    _gather_margin_gram_into(KC, soc, nS, KSS)  # the certificate's K_SS, in margin order
    out[SEG_GRAM] = max(out[SEG_GRAM], nS)
    return DONE, nS, chi, mu


@njit(cache=True)
def remove_segments(KC, XC, ac, soc, cos, X, V, xn2, diag, alpha, g, state, slot_id, Qinv, esum,
                    member, rebuild, nS, chi, hi, mu, C, gamma, is_rbf, c, contract_col,
                    max_segments, max_jumps, scale, g_end, out, facts, sup_ids, sup_values,
                    KSS):
    """Remove token ``c`` (driven, outside the margin set) segment by segment,
    each segment costing one pass over the margin block.

    On a fixed partition the path of (alpha, mu) as alpha_c falls to 0 is a
    straight line, so its end is the solution of the margin system without c
    (:func:`_solve_partition`, the polish's own solve), and g along it is the
    linear interpolation between g now and g at the end. One pass computes g at
    the end from the cached columns (:func:`g_from_error_sum`, the exact g's own
    formula). If no margin coefficient leaves (0, C) and no error or reserve
    token changes the sign of g on the way, the end is the removal's result:
    alpha, mu and g are then final and exact, with no drive steps, polish or
    second pass. Otherwise the first event on the line is applied (as
    :func:`drive_events` applies it) and the next segment starts.

    A margin token ``c`` leaves the margin set first (``contract_col``, its cache
    column; -1 for an error token). Then ``esum`` is synced to the error set
    without c (:func:`error_sum_sync` with ``rebuild``; its result goes to
    ``out[SEG_SYNC]``). On DONE, ``c`` is wiped
    and the certificate's facts are in ``facts``, ``out[SEG_MARGIN:]``,
    ``sup_ids`` and ``sup_values`` (:func:`_finish_removal`); ``KSS`` holds the
    final margin Gram block and ``out[SEG_GRAM]`` the largest block written. Returns
    ``(status, nS, chi, mu, Qinv)``: DONE; FALLBACK when a case is left to
    :func:`drive_events` (a zero-length or near-tied event, an empty margin set,
    no free column, ``max_segments`` segments taken), from a consistent state
    with g accurate on every row; or NEED_RESOLVE (Q turned singular). ``out``
    receives the segments taken, the error-sum updates and the last token to
    leave and to enter the margin set (drive_events' loop seeds), ``out[SEG_PASSES]``
    the passes over the margin block and ``out[SEG_JUMPED]`` whether active-set
    steps finished the removal (1) or were tried and left it to the path (-1).

    When the first segment's end point has two or more violators, up to
    ``max_jumps`` active-set steps are tried from it (:func:`_try_jumps`); a
    converged one is applied (:func:`_commit_jump`) and is the result.
    """
    ccap = KC.shape[1]
    Qb = _bordered_work(Qinv, nS, ccap)
    if contract_col >= 0:  # c is a margin token: it leaves the margin set first
        nS = _contract(Qb, KC, XC, ac, soc, cos, contract_col, nS, hi)
    x = np.empty(ccap + 1)
    out[SEG_SYNC] = error_sum_sync(esum, member, KC, soc, cos, state, nS, chi, hi, rebuild)
    tol_a = 1e-13 * C  # the polish's at-bound tie
    gtol = 1e-13 * scale  # drive_events' smallest rate
    status = DONE
    while True:
        if (nS == 0 or out[SEG_EVENTS] >= max_segments
                or not _free_column_available(soc, state, nS, chi, ccap)):
            status = FALLBACK
            break
        out[SEG_EVENTS] += 1
        t_rem = alpha[c]
        _solve_partition(KC, Qb, soc, state, diag, esum, nS, chi, C, x, KSS)
        out[SEG_GRAM] = max(out[SEG_GRAM], nS)
        col_c = cos[c]
        for j in range(nS):
            ac[j] = x[j + 1]
        ac[col_c] = 0.0
        g_from_error_sum(KC, ac, soc, state, esum, diag, x[0], C, nS, chi, hi, g_end)
        # the first event on the line, as a fraction of the segment: a margin
        # coefficient reaching 0 or C ...
        best = 1.0
        kind = 2  # c leaves: the end is the result
        who = -1
        tie = False
        n_viol = 0  # tokens whose condition fails at the end point
        for j in range(nS):
            a0 = alpha[soc[j]]
            a1 = x[j + 1]
            if abs(a1) <= tol_a or abs(a1 - C) <= tol_a:
                tie = True  # lands on a bound: the polish's case, left to the drive
            elif a1 < 0.0 or a1 > C:
                n_viol += 1
                f = a0 / (a0 - a1) if a1 < 0.0 else (C - a0) / (a1 - a0)
                if f < best:
                    best = f
                    kind = 3 if a1 < 0.0 else 4
                    who = soc[j]
        # ... or an error / reserve token whose g changes sign (g is linear on it)
        rate_tol = gtol * t_rem
        for i in range(hi):
            st = state[i]
            gi = g[i]
            ge = g_end[i]
            if st == RESERVE:
                moving = gi - ge > rate_tol and ge < 0.0
            elif st == ERROR:
                moving = ge - gi > rate_tol and ge > 0.0
            else:
                moving = False
            if moving:
                n_viol += 1
                f = gi / (gi - ge)
                if f < best:
                    best = f
                    kind = 5
                    who = i
        if tie or best <= 0.0 or (kind != 2 and best >= 1.0):
            for j in range(nS):
                ac[j] = alpha[soc[j]]
            ac[col_c] = alpha[c]
            out[SEG_EVENTS] -= 1  # this segment is not taken
            status = FALLBACK
            break
        out[SEG_PASSES] += 1
        # one violator: a step would make the path's own move, at more cost
        if kind != 2 and out[SEG_EVENTS] == 1 and max_jumps > 0 and n_viol >= 2:
            room = min(ccap, nS + _JUMP_ROOM)  # the steps' margin sets stay below this
            tstate = np.empty(hi, dtype=state.dtype)
            tord = np.empty(room, dtype=np.int64)
            Qt = np.empty((room + 1, room + 1))
            xt = np.empty(room + 1)
            g_try = np.empty(hi)
            passes, nT, changes, chi = _try_jumps(
                KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, esum, Qb, nS, chi, hi, C,
                gamma, is_rbf, scale, c, x, g_end, max_jumps, tstate, tord, Qt, xt, g_try)
            g_try[c] = 0.0  # c's own entry (see g_end below)
            out[SEG_PASSES] += passes
            if nT > 0:
                status, nS, chi, mu = _commit_jump(
                    KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, Qb, esum, member, nS,
                    chi, hi, C, gamma, is_rbf, scale, c, tstate, tord, nT, xt, g_try, out, KSS)
                out[SEG_EVENTS] += changes  # with the segment: every set change and c's exit
                out[SEG_JUMPED] = 1
                break
            out[SEG_JUMPED] = -1  # tried: the path goes on from its first event
        if kind == 2:  # the end of the line: final alpha, mu and exact g
            for j in range(nS):
                alpha[soc[j]] = x[j + 1]
            mu = x[0]
            alpha[c] = 0.0
            for i in range(hi):
                g[i] = g_end[i]
            break
        # move to the event: alpha, mu and g of the non-margin rows linearly
        for j in range(nS):
            sj = soc[j]
            alpha[sj] += best * (x[j + 1] - alpha[sj])
            ac[j] = alpha[sj]
        mu += best * (x[0] - mu)
        alpha[c] = t_rem * (1.0 - best)
        ac[col_c] = alpha[c]
        for i in range(hi):
            if state[i] != MARGIN:
                g[i] += best * (g_end[i] - g[i])
        out[SEG_LAST_LEFT] = -1
        out[SEG_LAST_ENTERED] = -1
        if kind == 3 or kind == 4:
            nS, chi = _leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who,
                                      kind == 4, nS, chi, hi, C, out)
            out[SEG_LAST_LEFT] = who
        else:
            ok, chi = _join_with_sum(Qb, KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state,
                                     esum, member, who, nS, chi, hi, gamma, is_rbf, scale, out)
            if not ok:
                status = NEED_RESOLVE
                break
            nS += 1
            out[SEG_LAST_ENTERED] = who
    g_end[c] = 0.0  # the one entry that c's key makes (freed memory keeps no key data)
    if status == DONE:
        chi = _finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, slot_id, Qb, KSS, nS, chi, hi, mu, C, scale, c, out, facts,
                              sup_ids, sup_values)
    return status, nS, chi, mu, _bordered_out(Qb, nS)


@njit(cache=True)
def contract_margin(Qinv, KC, XC, ac, soc, cos, p, nS, hi):
    """:meth:`SVDDMemory._contract` compiled: returns ``(nS, Qinv)``."""
    Qb = Qinv.copy()
    nS = _contract(Qb, KC, XC, ac, soc, cos, p, nS, hi)
    if nS == 0:
        return 0, np.zeros((0, 0))
    return nS, Qb[: nS + 1, : nS + 1].copy()


@njit(cache=True, fastmath=_VEC)
def _solve_partition(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS):
    """``x = [mu, alpha_S]`` on the current partition (error tokens at C, every other
    non-margin token at 0), with two steps of iterative refinement; returns the
    number of error tokens. ``KSS[:nS, :nS]`` receives the margin Gram block
    (gathered once from the cache's margin rows; the refinement reads it there).

    The error tokens' share of the right-hand side is read from the (synced)
    error-column sum ``esum`` at the margin rows; the numpy reference sums their
    cached columns there instead.
    """
    nE = 0
    for col in range(nS, chi):
        sl = soc[col]
        if sl >= 0 and state[sl] == ERROR:
            nE += 1
    m = nS + 1
    rhs = np.empty(m)
    rhs[0] = 1.0 - C * nE
    for i in range(nS):
        si = soc[i]
        rhs[i + 1] = diag[si] - 2.0 * C * esum[si]
    _matvec_lead(Qinv, rhs, m, x, 1.0)
    _gather_margin_gram_into(KC, soc, nS, KSS)
    _refine(Qinv, KSS, rhs, x, nS)
    return nE


@njit(cache=True, fastmath=_VEC)
def _refine(Qinv, K, rhs, x, n):
    """Two steps of iterative refinement of ``x = Qinv rhs`` against
    ``Q = [[0, 1^T], [1, 2 K]]`` (``K`` the Gram block of the ``n`` margin tokens)."""
    m = n + 1
    res = np.empty(m)
    dx = np.empty(m)
    for _ in range(2):
        acc = 0.0
        for j in range(n):
            acc += x[j + 1]
        res[0] = rhs[0] - acc
        for i in range(n):
            r = rhs[i + 1] - x[0]
            for j in range(n):
                r -= K[i, j] * (2.0 * x[j + 1])
            res[i + 1] = r
        _matvec_lead(Qinv, res, m, dx, 1.0)
        for i in range(m):
            x[i] += dx[i]


@njit(cache=True)
def _gather_margin_gram_into(KC, soc, nS, out):
    """``out[:nS, :nS] = K_SS`` from the cache's margin rows (margin order)."""
    for i in range(nS):
        si = soc[i]
        for j in range(nS):
            out[i, j] = KC[si, j]


@njit(cache=True)
def gather_margin_gram(KC, soc, nS):
    """The margin Gram block ``K_SS`` as a dense array (rows and columns in margin order)."""
    K = np.empty((nS, nS))
    _gather_margin_gram_into(KC, soc, nS, K)
    return K


@njit(cache=True)
def solve_margin(KC, Qinv, soc, cos, state, diag, alpha, ac, esum, nS, chi, C, KSS):
    """alpha_S and mu on the current partition (:func:`_solve_partition`, which
    leaves ``K_SS`` in ``KSS``), then alpha of every cached column into ``ac``.

    Returns ``(mu, n_at_bound)``: how many margin coefficients landed within
    1e-13·C of 0 or C (the caller then moves them to that bound's set).
    """
    for col in range(nS, chi):
        sl = soc[col]
        if sl >= 0 and state[sl] == ERROR:
            alpha[sl] = C
    x = np.empty(nS + 1)
    _solve_partition(KC, Qinv, soc, state, diag, esum, nS, chi, C, x, KSS)
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


@njit(cache=True)
def kkt_residual(g, alpha, state, diag, mu, C, hi):
    """:meth:`SVDDMemory._kkt` compiled (same definition, one pass)."""
    return _kkt_pass(g, alpha, state, diag, mu, C, hi, -1, -1.0)[0]


@njit(cache=True)
def _kkt_pass(g, alpha, state, diag, mu, C, hi, skip, tie):
    """The KKT residual over the used slots but ``skip``, with the set sizes and
    the error and reserve tokens tied at ``|g| <= tie``, in one pass: returns
    ``(residual, margin, error, reserve, tied)``."""
    total = 0.0
    amin = 0.0
    amax = 0.0
    worst = 0.0
    nm = ne = nr = n_tied = 0
    for i in range(hi):
        if i == skip:
            continue
        a = alpha[i]
        total += a
        amin = min(amin, a)
        amax = max(amax, a)
        st = state[i]
        gi = g[i]
        if st == MARGIN:
            v = abs(gi)
            nm += 1
        elif st == ERROR:
            v = gi
            ne += 1
            n_tied += abs(gi) <= tie
        elif st == RESERVE:
            v = -gi
            nr += 1
            n_tied += abs(gi) <= tie
        else:
            v = 0.0 * gi
        size = max(2.0 * diag[i] + gi - mu + abs(mu), 1.0)
        if v > worst * size:  # a division only for a new worst row (size >= 1)
            worst = v / size
    return max(abs(total - 1.0), -amin, amax - C, worst), nm, ne, nr, n_tied


@njit(cache=True, fastmath=_VEC)
def bordered_health(Qinv, KSS, nS):
    """``(cond1, inverse residual)`` of ``Qinv`` given the margin Gram block
    ``KSS`` (see HealthMonitor.measure)."""
    m = nS + 1
    colmax = 0.0
    for j in range(nS):
        acc = 0.0
        for i in range(nS):
            acc += abs(KSS[i, j])
        colmax = max(colmax, acc)
    norm_q = max(float(nS), 1.0 + 2.0 * colmax)
    norm_qinv = 0.0
    for j in range(m):
        acc = 0.0
        for i in range(m):
            acc += abs(Qinv[i, j])
        norm_qinv = max(norm_qinv, acc)
    v = np.empty(m)
    vmax = 0.0
    for i in range(m):
        v[i] = math.cos(0.7 * i) + 0.5
        vmax = max(vmax, abs(v[i]))
    w = np.empty(m)
    _matvec_lead(Qinv, v, m, w, 1.0)
    acc = 0.0
    for j in range(nS):
        acc += w[j + 1]
    rmax = abs(acc - v[0])
    for i in range(nS):
        r = w[0] - v[i + 1]
        for j in range(nS):
            r += 2.0 * KSS[i, j] * w[j + 1]
        rmax = max(rmax, abs(r))
    return norm_q * norm_qinv, rmax / vmax


@njit(cache=True)
def tied_slots(g, state, hi, tie):
    """Error and reserve slots with ``|g| <= tie`` (tied with the margin)."""
    out = np.empty(hi, dtype=np.int64)
    n = 0
    for i in range(hi):
        st = state[i]
        if (st == ERROR or st == RESERVE) and abs(g[i]) <= tie:
            out[n] = i
            n += 1
    return out[:n]


@njit(cache=True)
def support_slots_by_id(alpha, slot_id, hi):
    """Slots with alpha > 0, in id order."""
    n = 0
    for i in range(hi):
        if alpha[i] > 0:
            n += 1
    slots = np.empty(n, dtype=np.int64)
    ids = np.empty(n, dtype=np.int64)
    n = 0
    for i in range(hi):
        if alpha[i] > 0:
            slots[n] = i
            ids[n] = slot_id[i]
            n += 1
    return slots[np.argsort(ids, kind="mergesort")]


@njit(cache=True)
def nearest_reserve(g, state, hi, out):
    """The ``len(out)`` reserve slots with the smallest g, ascending (ties: lower
    slot first), into ``out``; returns how many there are. One pass with an
    insertion into the short sorted list (``np.argpartition`` costs ~10× more)."""
    m = out.shape[0]
    vals = np.empty(m)
    n = 0
    for i in range(hi):
        if state[i] != RESERVE:
            continue
        gi = g[i]
        if n == m and not gi < vals[m - 1]:
            continue
        j = n if n < m else m - 1  # the slot the new entry starts from
        while j > 0 and vals[j - 1] > gi:
            if j < m:
                vals[j] = vals[j - 1]
                out[j] = out[j - 1]
            j -= 1
        vals[j] = gi
        out[j] = i
        if n < m:
            n += 1
    return n


@njit(cache=True)
def refresh_standby(KC, XC, ac, soc, cos, X, xn2, diag, alpha, g, state, nS, chi, hi, gamma,
                    is_rbf, k):
    """:meth:`SVDDMemory._refresh_standby` compiled: cache the columns of the ``k``
    reserve tokens with the smallest g, keep those of the next ``k``, free the
    other standby columns. Never evicts a standby column to make room.

    Returns ``(chi, theta, short)``: theta is the k-th smallest reserve g (inf
    when there are no more than k reserve tokens); ``short`` counts the picks
    left without a column for want of room (the caller grows the cache and
    calls again).
    """
    near = np.empty(2 * k, dtype=np.int64)
    n_near = nearest_reserve(g, state, hi, near)
    ccap = KC.shape[1]
    for col in range(nS, chi):
        s = soc[col]
        if s < 0 or state[s] != RESERVE:
            continue
        kept = False
        for j in range(n_near):
            if near[j] == s:
                kept = True
                break
        if not kept:
            chi = _free_col(KC, XC, ac, soc, cos, s, chi)
    short = 0
    for j in range(min(k, n_near)):
        s = near[j]
        if cos[s] >= 0:
            continue
        room = chi < ccap
        if not room:
            for col in range(nS, chi):
                if soc[col] < 0:
                    room = True
                    break
        if room:
            chi = _alloc_col(KC, XC, ac, soc, cos, X, xn2, diag, alpha, state, s, nS, chi, hi,
                             gamma, is_rbf)
        else:
            short += 1
    theta = g[near[k - 1]] if n_near > k else math.inf
    return chi, theta, short


@njit(cache=True)
def count_states(state, hi):
    """``(margin, error, reserve)`` counts over the used slots."""
    nm = ne = nr = 0
    for i in range(hi):
        st = state[i]
        nm += st == MARGIN
        ne += st == ERROR
        nr += st == RESERVE
    return nm, ne, nr


@njit(cache=True)
def certificate_facts(g, alpha, state, slot_id, KSS, nS, hi, tie, rel_shift, mu):
    """What a deletion certificate reads off the state, in one compiled call.

    Returns ``(margin, error, reserve, unique, ids, values)``: the set sizes
    (:func:`count_states`); ``unique`` is 1 or 0 from :func:`positive_definite`
    on the margin Gram block ``KSS`` when no error or reserve token is tied at
    ``|g| <= tie`` and -1 when some are (the caller then runs the general check
    with the keys);
    ``ids`` those of the tokens with alpha > 0 in id order
    (:func:`support_slots_by_id`) and ``values`` their alphas followed by ``mu``
    (what :meth:`SVDDMemory.state_digest` hashes). :meth:`SVDDMemory._sizes`,
    :meth:`~SVDDMemory.unique_optimum` and :meth:`~SVDDMemory.state_digest` are
    the references.
    """
    nm, ne, nr = count_states(state, hi)
    n_tied = 0
    for i in range(hi):
        st = state[i]
        if (st == ERROR or st == RESERVE) and abs(g[i]) <= tie:
            n_tied += 1
    support = support_slots_by_id(alpha, slot_id, hi)
    n = len(support)
    ids = np.empty(n, dtype=np.int64)
    values = np.empty(n + 1)
    for k in range(n):
        ids[k] = slot_id[support[k]]
        values[k] = alpha[support[k]]
    values[n] = mu
    if n_tied:
        unique = -1
    elif nS <= 1:
        unique = 1
    else:
        unique = 1 if positive_definite(KSS[:nS, :nS], rel_shift) else 0
    return nm, ne, nr, unique, ids, values


@njit(cache=True)
def wipe_slot_arrays(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member, state,
                     slot, chi, hi, esum_valid):
    """:meth:`SVDDMemory._wipe_slot`'s array work: take the token's column out of the
    error sum (when it is a member), free its cache column and zero every per-slot
    entry (key, value, kernel row, solver values).

    Returns ``(chi, esum_change)``: 1 when the column was subtracted from the sum,
    -1 when the sum must be rebuilt (no column, or the sum was not valid), 0 else.
    """
    change = 0
    if member[slot]:
        col = cos[slot]
        if col >= 0 and esum_valid:
            _add_column(KC, col, -1.0, hi, esum)
            change = 1
        else:
            change = -1
        member[slot] = False
    chi = _free_col(KC, XC, ac, soc, cos, slot, chi)
    for j in range(X.shape[1]):
        X[slot, j] = 0.0
    for j in range(V.shape[1]):
        V[slot, j] = 0.0
    for j in range(chi):  # columns past chi are free, and freed columns are zeroed
        KC[slot, j] = 0.0
    xn2[slot] = 0.0
    diag[slot] = 0.0
    alpha[slot] = 0.0
    g[slot] = 0.0
    esum[slot] = 0.0
    state[slot] = FREE
    return chi, change


__all__ = ["drive_events", "contract_margin", "solve_margin", "kkt_residual",
           "bordered_health", "tied_slots", "support_slots_by_id",
           "count_states", "certificate_facts", "wipe_slot_arrays", "gather_margin_gram", "DONE",
           "NEED_RESOLVE", "NEED_COLUMNS", "EMPTY_MARGIN", "FALLBACK", "remove_segments"]


# ------------------------------------------------------------ the error-column sum
# Error tokens all sit at alpha = C, so their share of g is C times the sum of
# their kernel columns. Keeping that sum (libsvm keeps the same for its bounded
# variables, "G_bar") lets an exact g read the margin block and one vector
# instead of every cached column. The sum follows the error set lazily: each
# sync compares the members it was built from with the current error tokens.


@njit(cache=True)
def error_sum_sync(esum, member, KC, soc, cos, state, nS, chi, hi, rebuild):
    """Bring ``esum`` (per slot: the sum of the error tokens' kernel values) up to
    the current error set; rebuild it from the cached columns when ``rebuild`` is
    set or a departed member has no column any more.

    ``member[s]`` marks the slots ``esum`` currently sums over. Returns the number
    of columns added or subtracted, or -1 after a rebuild from scratch.
    """
    if not rebuild:
        for s in range(hi):
            if member[s] and state[s] != ERROR and cos[s] < 0:
                rebuild = True  # its column is gone: cannot subtract it
                break
    n = 0
    if rebuild:  # start empty: every error column is then added below
        for i in range(hi):
            esum[i] = 0.0
            member[i] = False
    else:  # take the departed members out
        for s in range(hi):
            if member[s] and state[s] != ERROR:
                _add_column(KC, cos[s], -1.0, hi, esum)
                member[s] = False
                n += 1
    for col in range(nS, chi):
        s = soc[col]
        if s >= 0 and state[s] == ERROR and not member[s]:
            _add_column(KC, col, 1.0, hi, esum)
            member[s] = True
            n += 1
    return -1 if rebuild else n


@njit(cache=True, fastmath=_VEC)
def g_from_error_sum(KC, ac, soc, state, esum, diag, mu, C, nS, chi, hi, g):
    """g over used slots from the margin block and the (synced) error-column sum:
    :meth:`SVDDMemory._g_exact` reads every cached column instead.

    Any other cached column with alpha ≠ 0 (a driven token) and any error column
    whose alpha is not exactly C are added as corrections, so the result equals
    ``2 K_cached @ alpha_cached − diag + mu`` up to summation order.
    """
    two_c = 2.0 * C
    for i in range(hi):
        g[i] = two_c * esum[i] - diag[i] + mu
    w = np.empty(nS)
    for j in range(nS):
        w[j] = 2.0 * ac[j]
    _add_block_matvec(KC, w, nS, hi, g)
    for col in range(nS, chi):
        s = soc[col]
        if s < 0:
            continue
        extra = ac[col] - (C if state[s] == ERROR else 0.0)
        if extra != 0.0:
            _add_column(KC, col, 2.0 * extra, hi, g)


# ------------------------------------------------------------ uniqueness
@njit(cache=True)
def positive_definite(K, rel_shift):
    """True when the symmetric part of ``K`` minus ``rel_shift · trace(K) · I`` has a
    Cholesky factor (``np.linalg.cholesky`` succeeding is the reference)."""
    n = K.shape[0]
    tr = 0.0
    for i in range(n):
        tr += K[i, i]
    shift = rel_shift * tr
    L = np.zeros((n, n))
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

