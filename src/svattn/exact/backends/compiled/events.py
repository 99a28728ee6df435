"""The removal and addition drive as one compiled event loop (:func:`drive_events`).

It takes the same steps, in the same order, as the numpy reference
(:func:`svattn.exact.backends.reference.drive`), event by event.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import (
    DONE,
    EMPTY_MARGIN,
    EVENTS,
    ILL_BORDER,
    LAST_ENTERED,
    LAST_LEFT,
    NEED_COLUMNS,
    NEED_RESOLVE,
    RATE_TOL,
    ZERO_STEPS,
)
from svattn.exact.backends.compiled.columns import (
    add_block_matvec,
    bordered_out,
    bordered_work,
    copy_of_any,
    expand,
    flat_exchange,
    free_column_available,
    is_copy,
    join_margin,
    leave_margin,
    matvec_lead,
)
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE


@njit(cache=True)
def drive_events(KC, XC, ac, soc, cos, X, diag, alpha, g, state, Qinv,
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
    Qb = bordered_work(Qinv, nS, ccap)
    s = float(direction)
    gtol = 1e-13 * scale
    rho = np.empty(hi)
    beta = np.empty(ccap + 1)
    u = np.empty(ccap + 1)
    t_m = np.empty(ccap)
    wS = np.empty(ccap)
    skipped = np.empty(hi, dtype=np.int64)  # entry candidates passed over in one event
    sgn_kept = np.empty(hi)
    status = DONE
    while True:
        if not free_column_available(soc, state, nS, chi, ccap):
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
        matvec_lead(Qb, u, m, beta, -1.0)
        # rho_i = d g_i / dt: 2 (K_iS beta_S + k_ic) + beta_mu, times the direction
        b0 = s * beta[0]
        for i in range(hi):
            rho[i] = 2.0 * s * k_c[i] + b0
        for j in range(nS):
            wS[j] = 2.0 * s * beta[j + 1]
        add_block_matvec(KC, wS, nS, hi, rho)
        # candidate steps (t >= 0 is |d alpha_c|): c itself
        who = -1
        if direction > 0:
            best_t = C - alpha[c]
            kind = 1  # c_error
            if rho[c] > RATE_TOL * scale:
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
            t_m[j] = math.inf if ar <= RATE_TOL else tj / ar
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
        n_skip = 0
        while True:
            ibest = -1
            rbest = -math.inf
            for i in range(hi):  # branch-light: the sign test is unpredictable
                ok = rho[i] * sgn[i] > gtol
                ratio = g[i] / rho[i] if ok else -math.inf
                if ratio > rbest:
                    rbest = ratio
                    ibest = i
            if ibest < 0:
                break
            if ibest == ll and rbest >= 0.0:
                pass  # no zero-length re-entry for the token that just left
            elif not (copy_of_any(KC, cos, diag, ibest, soc, nS)
                      or (direction > 0 and is_copy(diag, k_c, ibest, c))):
                break
            # ... nor an entry of a copy of a margin token (its g is its sibling's, 0,
            # along the whole path) or, on an add, of the driven token (its g is c's:
            # c's own event takes the group): the group keeps one free member
            # (docs/design.md, duplicates). Take the best of the others.
            skipped[n_skip] = ibest
            n_skip += 1
            sgn_kept[ibest] = sgn[ibest]
            sgn[ibest] = 0.0
        for q in range(n_skip):
            sgn[skipped[q]] = sgn_kept[skipped[q]]
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
            if copy_of_any(KC, cos, diag, c, soc, nS):
                # c reaches g = 0 beside a copy of it on the margin (a near-copy a
                # rounding-level g kept outside): the group's budget is one, so
                # the batch re-solve (which merges copies) takes it
                status = NEED_RESOLVE
                break
            g[c] = 0.0
            state[c] = MARGIN
            ac[cos[c]] = alpha[c]
            code = expand(Qb, KC, XC, ac, soc, cos, diag, c, nS, hi, scale)
            if code == 0:
                status = NEED_RESOLVE
                break
            if code == 2:  # an ill-conditioned border: the finish refactorizes
                loop[ILL_BORDER] = 1
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
            nS, chi = leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, who, kind == 4, nS,
                                    chi, hi, C)
            sgn[who] = 1.0 if kind == 4 else -1.0
            loop[LAST_LEFT] = who
        else:
            ok, chi = join_margin(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state, who,
                                   nS, chi, hi, gamma, is_rbf, scale)
            if not ok:  # nearly in the span of the margin keys: the flat exchange first
                up = sgn[who] < 0.0
                state[who] = RESERVE if up else ERROR
                code, left, mu = flat_exchange(Qb, KC, ac, soc, cos, diag, alpha, g, state,
                                               who, up, nS, hi, C, scale, gtol, mu)
                if code == 2:  # it crossed its box: the other bound
                    state[who] = ERROR if up else RESERVE
                    sgn[who] = -sgn[who]
                    continue
                if code == 1:  # its partner reached a bound and leaves, it joins
                    to_error = alpha[left] > 0.0
                    nS, chi = leave_margin(Qb, KC, XC, ac, soc, cos, alpha, state, left,
                                            to_error, nS, chi, hi, C)
                    sgn[left] = 1.0 if to_error else -1.0
                    loop[LAST_LEFT] = left
                    ok, chi = join_margin(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state,
                                           who, nS, chi, hi, gamma, is_rbf, scale)
            if not ok:
                status = NEED_RESOLVE
                break
            if ok == 2:
                loop[ILL_BORDER] = 1
            nS += 1
            sgn[who] = 0.0
            loop[LAST_ENTERED] = who
    return status, nS, chi, mu, bordered_out(Qb, nS)

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
