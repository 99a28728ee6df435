"""Removal segment by segment (:func:`remove_segments`) and its active-set steps.

On a fixed partition the solution path is a straight line, so one margin solve
gives a segment's end and one pass over the margin block the exact g there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.checks import (
    error_sum_sync,
    g_from_error_sum,
    kkt_pass,
    wipe_slot_arrays,
)
from svattn.exact.backends.compiled.codes import (
    DONE,
    FACT_COND,
    FACT_INV_RES,
    FACT_KKT,
    FALLBACK,
    NEED_RESOLVE,
    SEG_ERROR,
    SEG_EVENTS,
    SEG_GRAM,
    SEG_JUMPED,
    SEG_LAST_ENTERED,
    SEG_LAST_LEFT,
    SEG_MARGIN,
    SEG_PASSES,
    SEG_RESERVE,
    SEG_SUPPORT,
    SEG_SYNC,
    SEG_UNIQUE,
)
from svattn.exact.backends.compiled.columns import (
    alloc_col,
    bordered_into,
    bordered_out,
    contract,
    copy_of_any,
    free_column_available,
    join_with_sum,
    leave_with_sum,
    matvec_lead,
    qb_append,
    qb_drop,
)
from svattn.exact.backends.compiled.linalg import (
    bordered_health,
    kss_append,
    kss_drop,
    positive_definite,
    refine,
    solve_gathered,
    solve_partition,
)
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE

# ------------------------------------------------------------ active-set jumps
JUMP_ROOM = 16  # how many more margin tokens than now a step may hold
JUMP_COLUMNS = 2  # kernel columns the steps of one removal may compute
# Below this many margin tokens no step is tried: a pass over so narrow a block costs
# little next to a step's copies, and steps rarely converge there. Twins in one
# process, steps allowed vs. not (benchmarks/ab_jumps.py, results/ab_jumps.json): with
# 5-12 margin tokens (n = 4k) the path alone took 0.88-0.91x the time, with 21-30
# tokens 0.95-1.09x, and at 16k with 19-28 tokens 1.08-1.18x (steps pay off there).
JUMP_MIN_MARGIN = 16
# The solution path applies one event per pass over the margin block. From the
# end point of the first segment, a primal-dual active-set step instead moves
# every token that violates its condition there at once, and is checked by a
# pass computing the exact g of the result; convexity makes any point that
# meets every KKT condition the optimum, however it was found. Up to
# ``max_jumps`` such steps are tried on a tentative copy (the bordered inverse
# and margin order edited without moving cache columns); only a converged one
# is applied to the memory, else the path goes on from its first event.


@njit(cache=True)
def t_contract(Qt, tord, p, nT):
    """Drop position ``p`` from the tentative margin order and bordered inverse
    (``contract`` without moving cache columns); return the new size."""
    if nT == 1:
        return 0
    t = tord[p]
    tord[p] = tord[nT - 1]
    tord[nT - 1] = t
    return qb_drop(Qt, p, nT)


@njit(cache=True)
def t_expand(Qt, tord, KC, cos, diag, k, nT, scale):
    """Append token ``k`` (its column cached) to the tentative margin order and
    bordered inverse (``expand`` without moving cache columns); False when the
    set is empty or Q would turn singular."""
    if nT == 0:
        return False
    u = np.empty(nT + 1)
    u[0] = 1.0
    for j in range(nT):
        u[j + 1] = 2.0 * KC[tord[j], cos[k]]
    if not qb_append(Qt, u, nT, diag[k], scale):
        return False
    tord[nT] = k
    return True


@njit(cache=True)
def t_solve(Qt, tord, nT, KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, xt, KTT):
    """``xt = [mu, alpha_T]`` on the tentative partition, with two steps of
    iterative refinement against its Gram block ``KTT[:nT, :nT]`` (kept by
    :func:`try_jumps` through the steps' exits and entries: the values a gather
    ``KC[tord[i], cos[tord[j]]]`` reads, without its scattered reads, 3 ms a step at
    781 margin tokens).

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
    matvec_lead(Qt, rhs, m, xt, 1.0)
    refine(Qt, KTT, rhs, xt, nT)


@njit(cache=True)
def try_jumps(KC, XC, ac, soc, cos, X, diag, alpha, state, esum, Qb, nS, chi, hi, C,
               gamma, is_rbf, scale, c, x, g_end, max_jumps, tstate, tord, Qt, xt, g_try, KSS):
    """Active-set steps from the end point ``(x, g_end)`` of the current partition
    without ``c`` (see above). Returns ``(passes, nT, changes, chi)``: ``nT`` >= 1 when a step
    converged (tentative margin order ``tord[:nT]``, solution ``xt``, exact g
    ``g_try``, states ``tstate``), -1 when none did within ``max_jumps`` passes
    or one met a tie, a singular Q or a full cache. Only cache columns of
    entering reserve tokens are written to the memory (a column in a hole or
    past ``chi``, never an eviction). ``KSS`` holds the current margin block: the
    tentative Gram block starts as its copy.
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
    KTT = np.empty((room, room))  # the tentative Gram block (tord's order)
    for i in range(nS):
        for j in range(nS):
            KTT[i, j] = KSS[i, j]
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
                if copy_of_any(KC, cos, diag, r, tord, nT):
                    continue  # a copy of a token on the margin: tied with it, stays
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
        if new_columns > JUMP_COLUMNS:
            return passes, -1, changes, chi
        changes += n_leave + n_enter
        # move them: leaving tokens (descending positions keep the rest in place)
        for q in range(n_leave - 1, -1, -1):
            p = leave[q]
            s = tord[p]
            to_error = xt[p + 1] > C
            kss_drop(KTT, p, nT)  # (t_contract's swap of p and the last position)
            nT = t_contract(Qt, tord, p, nT)
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
                chi = alloc_col(KC, XC, ac, soc, cos, X, diag, alpha, state, s, nS, chi,
                                 hi, gamma, is_rbf)
            if not t_expand(Qt, tord, KC, cos, diag, s, nT, scale):
                return passes, -1, changes, chi
            cs = cos[s]
            for j in range(nT + 1):
                KTT[nT, j] = KC[s, cos[tord[j]]]
            for i in range(nT):
                KTT[i, nT] = KC[tord[i], cs]
            nT += 1
            tstate[s] = MARGIN
        t_solve(Qt, tord, nT, KC, cos, diag, esum, err_in, n_in, err_out, n_out, nE, C, xt,
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
def finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member, state,
                    slot_id, Qb, KSS, nS, chi, hi, mu, C, scale, c, out, facts, sup_ids,
                    sup_values, pd_defer):
    """What a finished removal reports, computed where its arrays are in cache:
    the KKT residual, set sizes, ties and uniqueness, the support in id order
    with its alphas and mu (the digest's input), the health measure of the
    bordered inverse; then ``c``'s array entries are wiped (it left the error
    sum at the start). Equal to :func:`kkt_residual`, :func:`certificate_facts`
    and :func:`bordered_health` (the references). Returns chi.
    """
    # c is skipped: wiped below (alpha 0, no set)
    facts[FACT_KKT], nm, ne, nr, n_tied = kkt_pass(g, alpha, state, diag, mu, C, hi, c,
                                                   1e-9 * scale)
    out[SEG_MARGIN] = nm
    out[SEG_ERROR] = ne
    out[SEG_RESERVE] = nr
    if n_tied:
        out[SEG_UNIQUE] = -1  # the caller runs the general check with the keys
    elif nS <= 1:
        out[SEG_UNIQUE] = 1
    elif nS >= pd_defer:
        out[SEG_UNIQUE] = -2  # the caller's kept factor decides (svattn.exact.core.gram)
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
    # (c's whole kernel row zeroed, past chi too: numba caches this caller with the
    # callee inlined, so a change to the wipe needs a change here to be recompiled)
    chi, _ = wipe_slot_arrays(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, c, chi, hi, True)
    return chi


@njit(cache=True)
def commit_jump(KC, XC, ac, soc, cos, X, diag, alpha, g, state, Qb, esum, member, nS, chi,
                 hi, C, gamma, is_rbf, scale, c, tstate, tord, nT, xt, g_try, out, KSS):
    """Apply a converged active-set step to the memory: margin exits and entries
    through the helpers the path uses (in that order), with the margin Gram block
    ``KSS`` (current on entry) following them, then the step's alpha, mu and exact g.
    Returns ``(status, nS, chi, mu)``."""
    n_leave = 0
    leavers = np.empty(nS, dtype=np.int64)
    for j in range(nS):
        if tstate[soc[j]] != MARGIN:
            leavers[n_leave] = soc[j]
            n_leave += 1
    for q in range(n_leave):
        who = leavers[q]
        p, n_was = cos[who], nS
        nS, chi = leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who,
                                  tstate[who] == ERROR, nS, chi, hi, C, out)
        kss_drop(KSS, p, n_was)  # (the moves a gather would read)
    for i in range(nT):
        who = tord[i]
        if state[who] == MARGIN:
            continue
        ok, chi = join_with_sum(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state, esum,
                                 member, who, nS, chi, hi, gamma, is_rbf, scale, out)
        if not ok:
            return NEED_RESOLVE, nS, chi, xt[0]
        kss_append(KSS, KC, soc, nS)
        out[SEG_GRAM] = max(out[SEG_GRAM], nS + 1)
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
    return DONE, nS, chi, mu


@njit(cache=True)
def remove_segments(KC, XC, ac, soc, cos, X, V, xn2, diag, alpha, g, state, slot_id, Qinv, esum,
                    member, rebuild, nS, chi, hi, mu, C, gamma, is_rbf, c, contract_col,
                    max_segments, max_jumps, scale, g_end, out, facts, sup_ids, sup_values,
                    KSS, pd_defer, Qb, kss_in, qb_in):
    """Remove token ``c`` (driven, outside the margin set) segment by segment,
    each segment costing one pass over the margin block.

    On a fixed partition the path of (alpha, mu) as alpha_c falls to 0 is a
    straight line, so its end is the solution of the margin system without c
    (:func:`solve_partition`, the polish's own solve), and g along it is the
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
    ``sup_ids`` and ``sup_values`` (:func:`finish_removal`); ``KSS`` holds the
    final margin Gram block and ``out[SEG_GRAM]`` the largest block written. With
    ``pd_defer`` margin tokens or more the
    uniqueness test is left to the caller's kept factor (``out[SEG_UNIQUE]`` -2).
    ``Qb`` ((ccap + 1)², the caller's, which zeroes it if this call raises) is the
    work copy of the bordered inverse; its used block is zeroed before returning.
    ``kss_in``: ``KSS`` holds the margin block already (the previous operation's,
    :mod:`svattn.exact.core.gram`), followed through ``c``'s exit; else the first segment
    gathers it. ``qb_in``: ``Qb``'s leading block is ``Qinv`` already (the last
    removal's result); on return it is the inverse returned, every other entry zero.
    Returns
    ``(status, nS, chi, mu, Qinv)``: DONE; FALLBACK when a case is left to
    :func:`drive_events` (a zero-length or near-tied event, an empty margin set,
    no free column, ``max_segments`` segments taken), from a consistent state
    with g accurate on every row; or NEED_RESOLVE (Q turned singular). ``out``
    receives the segments taken, the error-sum updates and the last token to
    leave and to enter the margin set (drive_events' loop seeds), ``out[SEG_PASSES]``
    the passes over the margin block and ``out[SEG_JUMPED]`` whether active-set
    steps finished the removal (1) or were tried and left it to the path (-1).

    When the first segment's end point has two or more violators, up to
    ``max_jumps`` active-set steps are tried from it (:func:`try_jumps`); a
    converged one is applied (:func:`commit_jump`) and is the result.
    """
    ccap = KC.shape[1]
    if not qb_in:
        bordered_into(Qinv, nS, Qb)
    qb_ext = nS + 1  # rows and columns of Qb in use so far (scrubbed at the end)
    kss_ok = kss_in and nS > 0  # KSS holds the current margin block (kept across events)
    if contract_col >= 0:  # c is a margin token: it leaves the margin set first
        if kss_ok:
            kss_drop(KSS, contract_col, nS)
        nS = contract(Qb, KC, XC, ac, soc, cos, contract_col, nS, hi)
        kss_ok = kss_ok and nS > 0
    x = np.empty(ccap + 1)
    out[SEG_SYNC] = error_sum_sync(esum, member, KC, soc, cos, state, nS, chi, hi, rebuild)
    tol_a = 1e-13 * C  # the polish's at-bound tie
    gtol = 1e-13 * scale  # drive_events' smallest rate
    status = DONE
    while True:
        if (nS == 0 or out[SEG_EVENTS] >= max_segments
                or not free_column_available(soc, state, nS, chi, ccap)):
            status = FALLBACK
            break
        out[SEG_EVENTS] += 1
        t_rem = alpha[c]
        if kss_ok:
            solve_gathered(KC, Qb, soc, state, diag, esum, nS, chi, C, x, KSS)
        else:
            solve_partition(KC, Qb, soc, state, diag, esum, nS, chi, C, x, KSS)
            kss_ok = True
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
            if moving and copy_of_any(KC, cos, diag, i, soc, nS):
                moving = False  # a copy of a margin token: its g is its sibling's, 0
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
        if (kind != 2 and out[SEG_EVENTS] == 1 and max_jumps > 0 and n_viol >= 2
                and nS >= JUMP_MIN_MARGIN):
            room = min(ccap, nS + JUMP_ROOM)  # the steps' margin sets stay below this
            tstate = np.empty(hi, dtype=state.dtype)
            tord = np.empty(room, dtype=np.int64)
            Qt = np.empty((room + 1, room + 1))
            xt = np.empty(room + 1)
            g_try = np.empty(hi)
            passes, nT, changes, chi = try_jumps(
                KC, XC, ac, soc, cos, X, diag, alpha, state, esum, Qb, nS, chi, hi, C,
                gamma, is_rbf, scale, c, x, g_end, max_jumps, tstate, tord, Qt, xt, g_try, KSS)
            g_try[c] = 0.0  # c's own entry (see g_end below)
            out[SEG_PASSES] += passes
            if nT > 0:
                status, nS, chi, mu = commit_jump(
                    KC, XC, ac, soc, cos, X, diag, alpha, g, state, Qb, esum, member, nS,
                    chi, hi, C, gamma, is_rbf, scale, c, tstate, tord, nT, xt, g_try, out, KSS)
                qb_ext = max(qb_ext, min(nS + 2, ccap + 1))  # (+1: a join that failed)
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
            p, n_was = cos[who], nS
            nS, chi = leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum, member, who,
                                      kind == 4, nS, chi, hi, C, out)
            if nS > 0:
                kss_drop(KSS, p, n_was)
            else:
                kss_ok = False
            out[SEG_LAST_LEFT] = who
        else:
            qb_ext = max(qb_ext, min(nS + 2, ccap + 1))  # (its row, even if it fails)
            ok, chi = join_with_sum(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state,
                                     esum, member, who, nS, chi, hi, gamma, is_rbf, scale, out)
            if not ok:
                status = NEED_RESOLVE
                break
            kss_append(KSS, KC, soc, nS)
            out[SEG_GRAM] = max(out[SEG_GRAM], nS + 1)
            nS += 1
            out[SEG_LAST_ENTERED] = who
    g_end[c] = 0.0  # the one entry that c's key makes (freed memory keeps no key data)
    if status == DONE:
        chi = finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, slot_id, Qb, KSS, nS, chi, hi, mu, C, scale, c, out, facts,
                              sup_ids, sup_values, pd_defer)
    Qout = bordered_out(Qb, nS)
    m = nS + 1 if nS else 0  # Qb keeps the inverse returned (the next removal's start)
    for i in range(qb_ext):  # the rest held c's row and column: zeroed
        for j in range(m if i < m else 0, qb_ext):
            Qb[i, j] = 0.0
    return status, nS, chi, mu, Qout

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
