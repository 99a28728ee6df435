"""A removal's path followed on a working set, checked by one pass over every token.

The solution path of a removal (:func:`svattn.exact.backends.compiled.segments.remove_segments`)
pays one pass over the margin block of the kernel cache (``n × |S|``) and a refined
margin solve per event: each segment's end point needs every token's g to find the
first event on it. Most tokens are nowhere near their boundary and the removal's
direction does not bring them there. From the first segment (one pass: every token's g
at the end of the line on the current partition) the tokens the removal can reach are
predicted — the margin set, and every token whose g moves towards zero on that line and
would reach it were the line :data:`WS_REACH` times longer (:func:`predict`) — and the
path is followed on them alone: a segment's margin solve is ``O(|S|·k)`` against the
memory's own inverse, held fixed, with the ``k`` set changes so far in a small
capacitance system (:mod:`~svattn.exact.backends.compiled.schur`; a joining token costs
one product with the inverse, a leaving one nothing), and the g of the working set at
its end comes from its kernel values against the margin set (``O(|W|·|S|)``,
:func:`g_on_rows`), never a pass. Nothing of size ``|S|²`` is written on the way: the
margin Gram block gains the joining tokens' rows beside it, cache columns do not move,
and a round that misses starts again from the start's system at no cost; the inverse
of the end is written once, by the caller
(:func:`~svattn.exact.backends.compiled.schur.materialise`).

Its end is checked by one pass computing every token's exact g
(:func:`~svattn.exact.backends.compiled.checks.g_from_error_sum`, the exact g's own
formula); convexity makes a point that meets every KKT condition the optimum, however
it was found. A token the pass finds violating its condition joins the working set and
the path is followed again from the start, with every token the checked end's g shows
heading for its boundary (:func:`predict_again`: the first segment's line can be a
near-null move, as when a removed token's weight goes to its copy; where that copy
reaches C on it, the prediction is the second segment's from the start), up to
``max_rounds`` checking passes; past
them, or on a tie, a singular system or a full cache, the caller goes on along the path
over all tokens from its first event — the slow reference this is held to
(``tests/exact/test_working_set.py``). Copies follow the path's rule: a copy of a
margin token never crosses (nor is it a miss: its g is its sibling's up to a
near-copy's offset), and when a margin token leaves for a bound its copy at the other
bound takes over at once (a zero-length event, not a tie). A checked end is applied by
:func:`commit_in_place`: the cache's columns are swapped into the margin order the path
left, ``O(n)`` work per set change. A support removal thus costs three passes or fewer
where the prediction holds: the first segment's, the check, and one more check after a
miss (after a handover to a copy: the first segment's, the second's and the check); one,
the check alone, where it is predicted ahead of the first segment's pass (``ahead``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.checks import g_from_error_sum
from svattn.exact.backends.compiled.codes import FACT_INV_RES, SEG_ESUM_UPDATES, VEC
from svattn.exact.backends.compiled.columns import (
    add_column,
    alloc_col,
    bordered_into,
    copy_of_any,
    error_sum_after,
    free_col,
    qb_drop,
    swap_cols,
)
from svattn.exact.backends.compiled.schur import (
    DROP,
    JOIN,
    add_drop,
    add_join,
    col_index,
    new_join,
    remove_col,
    solve_from_z,
    solve_refined,
    to_positions,
)
from svattn.exact.backends.compiled.schur import scrub as schur_scrub
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE

# A token whose g would reach zero were the first segment's line this many times
# longer is in the working set: the path bends at each event, so a token moving
# towards its boundary slower than the first segment suggests is still caught
# (a miss costs one more pass, never a wrong answer).
WS_REACH = 4.0
# After a miss, a token whose g would reach zero were the checked path this many times
# as long again joins the working set with the missed ones (:func:`predict_again`).
WS_REACH_AGAIN = 4.0
# A token whose |g| is within this share of the first segment's largest move of a g is
# in the working set whichever way its g moves (:func:`predict`).
WS_NEAR = 1e-2
# How many more margin tokens than now the path on the working set may hold.
WS_ROOM = 64


@njit(cache=True)
def crossing_share(st, gi, ge, rate_tol):
    """The share of a segment at which a reserve or error token whose g goes from ``gi``
    to ``ge`` crosses zero toward the margin set, or ``inf`` where it does not (margin
    tokens, and rates at rounding level)."""
    if st == RESERVE:
        moving = gi - ge > rate_tol and ge < 0.0
    elif st == ERROR:
        moving = ge - gi > rate_tol and ge > 0.0
    else:
        moving = False
    return gi / (gi - ge) if moving else np.inf

@njit(cache=True)
def unrefined_solve(Q0, m0, sy, z0, zb, xb, xj, bj, KC, cos, diag, esum, err_in, n_in, err_out,
                    n_out, C, pslot, pq, pe, pact, pof, nPos, xt):
    """``xt`` (by position) on the path's partition from the start's ``z0 = Q0 b``: the
    error set's changes move ``Q0 b`` by columns known already (a token of the start's
    margin set: a unit vector; a joined one: its ``Q0 u``), so a segment's solve costs
    ``O(|S|·k)``, no read of ``Q0`` (it only locates the segment's event; the end is
    refined, :func:`~svattn.exact.backends.compiled.schur.solve_refined`)."""
    Wt = sy[6]
    for i in range(m0):
        zb[i] = z0[i]
    for q in range(n_out):  # (a real error token that joined: a joined one)
        e = pe[pof[err_out[q]]]
        for i in range(m0):
            zb[i] += C * Wt[e, i]
    for q in range(n_in):
        j = pof[err_in[q]]
        if pe[j] < 0:
            zb[pq[j]] -= C
        else:
            e = pe[j]
            for i in range(m0):
                zb[i] -= C * Wt[e, i]
    for j in range(nPos):
        if pact[j] and pe[j] >= 0:
            s = pslot[j]
            ev = error_sum_after(KC, cos, esum, s, err_in, n_in, err_out, n_out)
            bj[pe[j]] = diag[s] - 2.0 * C * ev
    solve_from_z(zb, m0, bj, sy, xb, xj)
    to_positions(xb, xj, pq, pe, pact, nPos, xt)


@njit(cache=True, fastmath=VEC)
def g_on_rows(KWt, nT, nR, wrow, xe, esum, err_in, n_in, err_out, n_out, KC, cos, diag, C,
              ge):
    """``ge[r]``: the g of row token ``wrow[r]`` at the point ``xe`` of the path's
    partition, from its block ``KWt[:nT, r]`` (the kernel values against the
    path's positions) and the error set's changes: ``O(nR·nT)``, the part of
    :func:`g_from_error_sum` the working set needs (a margin token's entry is not 0
    here: the caller skips it)."""
    mu = xe[0]
    for r in range(nR):
        s = wrow[r]
        e = error_sum_after(KC, cos, esum, s, err_in, n_in, err_out, n_out)
        ge[r] = 2.0 * C * e - diag[s] + mu
    for j in range(nT):
        a2 = 2.0 * xe[j + 1]
        if a2 == 0.0:
            continue
        for r in range(nR):
            ge[r] += a2 * KWt[j, r]


@njit(cache=True)
def predict(g, g_end, state, hi, c, cap, out):
    """The working set's tokens outside the margin set, into ``out`` (in slot order):
    every error or reserve token whose g moves towards zero on the first segment and
    would reach it within :data:`WS_REACH` segments, the ``cap`` nearest (in segments)
    where more would; and every one whose g is within :data:`WS_NEAR` of the line's
    largest move from zero, whichever way it moves (a near-copy of a margin token, g
    ~1e-9 where the path moves g by ~1e-3: its g follows its sibling's 0 plus an offset
    the bends of the path turn either way). Returns how many."""
    f = np.empty(hi)
    n = 0
    span = 0.0
    for i in range(hi):
        if i != c and (state[i] == RESERVE or state[i] == ERROR):
            span = max(span, abs(g_end[i] - g[i]))
    near = WS_NEAR * span
    for i in range(hi):
        st = state[i]
        if i == c or (st != RESERVE and st != ERROR):
            continue
        d = g_end[i] - g[i]
        gi = g[i]
        if abs(gi) <= near:  # (ranked by |g| among the predicted: 0 to WS_REACH)
            f[n] = WS_REACH * abs(gi) / near
            out[n] = i
            n += 1
            continue
        if st == RESERVE:
            if d >= 0.0:
                continue
            fi = gi / -d if gi > 0.0 else 0.0
        else:
            if d <= 0.0:
                continue
            fi = -gi / d if gi < 0.0 else 0.0
        if fi <= WS_REACH:
            f[n] = fi
            out[n] = i
            n += 1
    if n > cap:
        keep = np.sort(out[:n][np.argsort(f[:n])[:cap]])
        n = cap
        out[:n] = keep
    return n


@njit(cache=True)
def predict_again(g, g_try, state, tstate, hi, c, pred, nP, cap):
    """After a miss: add to ``pred[:nP]`` every error or reserve token the checked end
    left in its set whose g moved towards zero from the start to that end and would
    reach it were the path :data:`WS_REACH_AGAIN` times as long again (the end's g saw
    the path bend at its events; the first segment's line did not: near-copies make that
    line a near-null move), up to ``cap`` tokens in all. Returns the new count."""
    inp = np.zeros(hi, dtype=np.bool_)
    for q in range(nP):
        inp[pred[q]] = True
    for i in range(hi):
        st = tstate[i]
        if nP >= cap:
            break
        if i == c or inp[i] or st != state[i] or (st != RESERVE and st != ERROR):
            continue
        d = g_try[i] - g[i]
        ge = g_try[i]
        if (st == RESERVE and d < 0.0 and ge <= WS_REACH_AGAIN * -d) or (
                st == ERROR and d > 0.0 and -ge <= WS_REACH_AGAIN * d):
            pred[nP] = i
            nP += 1
    return nP


@njit(cache=True)
def _act_remove(act, aof, nA, s):
    """Take slot ``s`` off the list ``act[:nA]`` of margin slots (``aof``: its place)."""
    i = aof[s]
    last = act[nA - 1]
    act[i] = last
    aof[last] = i
    aof[s] = -1
    return nA - 1


@njit(cache=True)
def path_on_rows(KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum, KSS, nS, chi,
                 hi, C, mu, scale, gamma, is_rbf, c, x, pred, nP, tstate, xt, KWt, wrow,
                 err_in, err_out, fresh, col_budget, facts, Q0, m0, qrow_col, sy, pslot, pq,
                 pe, pact, z0, ahead):
    """One round: the path from the current point to ``c``'s exit, its events found on
    the working set (the margin set and the tokens ``pred[:nP]``), the margin systems
    solved against the fixed inverse ``Q0`` with the set's changes in the system ``sy``
    (:mod:`~svattn.exact.backends.compiled.schur`; on entry: the start's, ``c`` dropped
    when it was a margin token; ``z0``: ``Q0 b`` of the start's right-hand side).

    Positions (``pslot``, ``pq``, ``pe``, ``pact``; the schur module's text): the first
    ``nS`` are the margin order ``soc[:nS]`` (``pq`` set by the caller), then each token
    that joins. ``ahead``: ``g_end`` is not the first segment's exact g (a line predicted
    ahead of its pass): the first segment is solved on the rows too. Returns
    ``(ok, nT, nPos, changes, chi, n_max, n_in, n_out)``: ``ok`` when
    the end was reached (``nT`` margin tokens over ``nPos`` positions, their solution
    ``xt`` by position, refined; the states ``tstate``; the error set's changes
    ``err_in[:n_in]`` and ``err_out[:n_out]``), False on a tie, a singular Q, a full
    cache, a spent column budget (``col_budget`` columns computed for entering tokens,
    marked in ``fresh``) or no room left. ``n_max``: the rows of ``KSS`` written; the
    final solve's probe residual goes to ``facts[FACT_INV_RES]``."""
    ccap = KC.shape[1]
    room = pslot.shape[0]
    ecap = sy[5].shape[0]
    tol_a = 1e-13 * C
    nE = 0  # (the error tokens: most keep no cache column, so counted by slot)
    for i in range(hi):
        if state[i] == ERROR:
            nE += 1
    nT = nS
    nPos = nS
    n_max = nS
    pof = np.full(hi, -1, dtype=np.int64)
    act = np.empty(room, dtype=np.int64)  # the margin slots (copy tests)
    aof = np.full(hi, -1, dtype=np.int64)
    xc = np.empty(room + 1)  # the current point of the path, by position
    for j in range(nS):
        s = soc[j]
        pslot[j] = s
        pe[j] = -1
        pact[j] = True
        pof[s] = j
        act[j] = s
        aof[s] = j
        xc[j + 1] = alpha[s]
    xc[0] = mu
    for i in range(hi):
        tstate[i] = state[i]
    rcap = wrow.shape[0]
    rowof = np.full(hi, -1, dtype=np.int64)
    gw = np.empty(rcap)  # the row tokens' g at the current point
    gwe = np.empty(rcap)  # and at the segment's end
    nR = nP
    for r in range(nR):
        s = pred[r]
        wrow[r] = s
        rowof[s] = r
        gw[r] = g[s]
        gwe[r] = g_end[s]
    for j in range(nS):  # (position j is cache column j)
        for r in range(nR):
            KWt[j, r] = KC[wrow[r], j]
    for i in range(nS + 1):
        xt[i] = x[i]  # the first segment's end
    zb = np.empty(m0)
    xb = np.empty(m0)
    xj = np.zeros(ecap)
    bj = np.zeros(ecap)
    t_rem = alpha[c]
    n_in = 0
    n_out = 0
    changes = 0
    n_cols = 0
    first = not ahead
    left = np.full(1, -1, dtype=np.int64)  # the token the last event took off the margin
    while True:
        if not first:
            unrefined_solve(Q0, m0, sy, z0, zb, xb, xj, bj, KC, cos, diag, esum, err_in, n_in,
                            err_out, n_out, C, pslot, pq, pe, pact, pof, nPos, xt)
            g_on_rows(KWt, nPos, nR, wrow, xt, esum, err_in, n_in, err_out, n_out, KC, cos,
                      diag, C, gwe)
        first = False
        best = 1.0
        kind = 2  # c leaves: the end is the result
        who = -1
        for j in range(nPos):
            if not pact[j]:
                continue
            a0 = xc[j + 1]
            a1 = xt[j + 1]
            if abs(a1) <= tol_a or abs(a1 - C) <= tol_a:
                return False, nT, nPos, changes, chi, n_max, n_in, n_out  # a tie
            if a1 < 0.0 or a1 > C:
                f = a0 / (a0 - a1) if a1 < 0.0 else (C - a0) / (a1 - a0)
                if f < best:
                    best = f
                    kind = 3 if a1 < 0.0 else 4
                    who = j
        rate_tol = 1e-13 * scale * t_rem
        swap = False
        for r in range(nR):
            s = wrow[r]
            f = crossing_share(tstate[s], gw[r], gwe[r], rate_tol)
            takes_over = f < np.inf and copy_of_any(KC, cos, diag, s, left, 1)
            if takes_over:
                f = 0.0  # the group's next member takes over from the copy that left
            # (a copy of a margin token has its sibling's g, 0: it never crosses)
            if (f < best or takes_over and kind != 5) and not copy_of_any(
                    KC, cos, diag, s, act, nT):
                best = f
                kind = 5
                who = r
                swap = takes_over
        if (best <= 0.0 and not (kind == 5 and swap)) or (kind != 2 and best >= 1.0):
            return False, nT, nPos, changes, chi, n_max, n_in, n_out
        if kind == 2:
            break
        # move to the event along the line
        for j in range(nPos + 1):
            xc[j] += best * (xt[j] - xc[j])
        t_rem *= 1.0 - best
        for r in range(nR):
            if tstate[wrow[r]] != MARGIN:
                gw[r] += best * (gwe[r] - gw[r])
        changes += 1
        if kind != 5:  # position `who` leaves, to the error set (4) or reserve
            s = pslot[who]
            to_error = kind == 4
            if nT == 1:
                return False, nT, nPos, changes, chi, n_max, n_in, n_out
            if rowof[s] < 0:  # its kernel values against the positions: K_SS's row
                if nR >= rcap:
                    return False, nT, nPos, changes, chi, n_max, n_in, n_out
                rowof[s] = nR
                wrow[nR] = s
                for j in range(nPos):
                    KWt[j, nR] = KSS[who, j]
                nR += 1
            gw[rowof[s]] = 0.0  # (it was on the margin)
            if pe[who] < 0:
                ok = add_drop(Q0, m0, pq[who], KC, cos, diag, sy)
            else:
                ok = remove_col(JOIN, pe[who], m0, sy, scale)
            if not ok:
                return False, nT, nPos, changes, chi, n_max, n_in, n_out
            pact[who] = False
            xc[who + 1] = 0.0
            nT = _act_remove(act, aof, nT, s)
            tstate[s] = ERROR if to_error else RESERVE
            left[0] = s
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
        else:  # row token `wrow[who]` reaches g = 0 and joins
            s = wrow[who]
            was_error = tstate[s] == ERROR
            j = pof[s]
            if j >= 0:  # a position it held before: back into the system
                if pe[j] < 0:
                    ok = remove_col(DROP, pq[j], m0, sy, scale)
                else:
                    ok = add_join(Q0, m0, pe[j], KC, cos, diag, sy, scale)
                if not ok:
                    return False, nT, nPos, changes, chi, n_max, n_in, n_out
            else:
                if nPos >= room:
                    return False, nT, nPos, changes, chi, n_max, n_in, n_out
                if cos[s] < 0:
                    n_cols += 1
                    free = chi < ccap
                    for col in range(nS, chi):
                        if soc[col] < 0:
                            free = True
                            break
                    if not free or n_cols > col_budget:  # never evict for a guess
                        return False, nT, nPos, changes, chi, n_max, n_in, n_out
                    chi = alloc_col(KC, XC, ac, soc, cos, X, diag, alpha, state, s, nS, chi,
                                    hi, gamma, is_rbf)
                    fresh[s] = True
                e = new_join(Q0, m0, s, qrow_col, KC, sy)
                if e < 0 or not add_join(Q0, m0, e, KC, cos, diag, sy, scale):
                    return False, nT, nPos, changes, chi, n_max, n_in, n_out
                j = nPos
                nPos += 1
                n_max = max(n_max, nPos)
                pslot[j] = s
                pq[j] = -1
                pe[j] = e
                pof[s] = j
                cs = cos[s]
                for i in range(j + 1):
                    KSS[j, i] = KC[s, cos[pslot[i]]]
                for i in range(j):
                    KSS[i, j] = KC[pslot[i], cs]
                for r in range(nR):
                    KWt[j, r] = KC[wrow[r], cs]
            if was_error:
                if state[s] == ERROR:
                    err_out[n_out] = s
                    n_out += 1
                else:
                    for z in range(n_in):
                        if err_in[z] == s:
                            n_in -= 1
                            err_in[z] = err_in[n_in]
                            break
            pact[j] = True
            act[nT] = s
            aof[s] = nT
            nT += 1
            xc[j + 1] = C if was_error else 0.0
            tstate[s] = MARGIN
            left[0] = -1
            gw[who] = 0.0
    # the end: refined (a segment before it only located its event)
    facts[FACT_INV_RES] = solve_refined(Q0, m0, sy, KSS, KC, cos, diag, esum, err_in, n_in,
                                        err_out, n_out, nE, C, pslot, pq, pe, pact, nPos, xt,
                                        zb, True)  # (xt: the last unrefined solve's)
    for j in range(nPos):
        if pact[j]:
            a = xt[j + 1]
            if a <= tol_a or a >= C - tol_a:
                return False, nT, nPos, changes, chi, n_max, n_in, n_out
    return True, nT, nPos, changes, chi, n_max, n_in, n_out


@njit(cache=True)
def restart(Qb, Qinv, n0, p0):
    """``Qb``'s leading block: the memory's inverse ``Qinv`` of ``n0`` margin tokens
    (which a removal writes over only at its end), less margin position ``p0`` when
    the removed token was one (a rank-one drop,
    :func:`~svattn.exact.backends.compiled.columns.qb_drop`): the work
    copy the segment loop and the event loop go on with where the working set is not
    taken, or fails."""
    bordered_into(Qinv, n0, Qb)
    if p0 >= 0 and n0 > 1:
        qb_drop(Qb, p0, n0)


@njit(cache=True)
def start_system(Q0, m0, p0row, KC, cos, diag, sy):
    """The system of the path's start: empty, or ``c``'s row ``p0row`` of ``Q0`` dropped."""
    schur_scrub(sy, m0)
    if p0row > 0:
        return add_drop(Q0, m0, p0row, KC, cos, diag, sy)
    return True


@njit(cache=True)
def final_order(pslot, pq, pe, pact, nPos, nT, sy, KSS, xt, tord, xf, aug):
    """The margin order of a checked end: the positions below ``nT`` in the set keep their
    place, the holes take the set's positions from ``nT`` on (the cache's columns then
    move for those alone, :func:`commit_in_place`); ``tord[:nT]`` its slots, ``xf`` its
    solution, ``aug`` each row's row of the augmented system (for
    :func:`~svattn.exact.backends.compiled.schur.materialise`), and ``KSS``'s block
    rearranged to it (rows, then columns: ``O(|S|)`` per hole)."""
    fpos = np.empty(nT, dtype=np.int64)
    src = nT
    for i in range(nT):
        if i < nPos and pact[i]:
            fpos[i] = i
            continue
        while not pact[src]:
            src += 1
        fpos[i] = src
        src += 1
    for i in range(nT):
        p = fpos[i]
        if p != i:
            for j in range(nPos):
                KSS[i, j] = KSS[p, j]
    for i in range(nT):
        p = fpos[i]
        if p != i:
            for r in range(nT):
                KSS[r, i] = KSS[r, p]
    xf[0] = xt[0]
    aug[0] = 0
    for i in range(nT):
        p = fpos[i]
        tord[i] = pslot[p]
        xf[i + 1] = xt[p + 1]
        aug[i + 1] = pq[p] if pe[p] < 0 else -1 - col_index(sy, JOIN, pe[p])


@njit(cache=True)
def working_set_path(KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum, KSS, nS,
                     chi, hi, C, mu, scale, gamma, is_rbf, c, x, max_rounds, cap, room, tstate,
                     tord, xf, g_try, fresh, err_in, err_out, facts, Q0, m0, qrow_col, p0row,
                     sy, z0, aug, gp, gp_end, ahead):
    """Follow the removal of ``c`` (driven, outside the margin set of ``nS`` tokens)
    from the current point (``alpha``, ``mu``, ``g``) on a working set predicted from
    the line ``gp`` → ``gp_end`` (:func:`predict`; at most ``cap`` tokens outside the
    margin set): the first segment's, its end ``x`` on the current partition and every
    token's g there ``g_end``, or the second's where the first hands ``c``'s weight over
    to a copy (:func:`~svattn.exact.backends.compiled.segments.handover_line`), or a line
    predicted ahead of any pass (``ahead``, :func:`~svattn.exact.backends.compiled.
    segments.line_ahead`: the first segment's g then comes from the rows); then
    check the end by one pass (see the module's text). The margin systems are solved against the
    memory's inverse ``Q0`` (``m0`` rows; not written here) with the path's set changes in
    the capacitance system ``sy`` (:mod:`~svattn.exact.backends.compiled.schur`), which
    holds the start's on entry (``c``'s row ``p0row`` dropped, -1: none) and ``z0`` its
    ``Q0 b``; ``qrow_col``: the cache column of each row's token.

    Returns ``(passes, nT, changes, chi, n_max, n_in, n_out)``: ``nT`` >= 1 when the
    checked end meets every KKT condition — ``tord[:nT]`` is its margin order, ``xf`` its
    solution, ``aug`` the rows :func:`~svattn.exact.backends.compiled.schur.materialise`
    writes its inverse from (``sy`` holds the end's system), ``KSS`` its Gram block,
    ``g_try`` the exact g, ``tstate`` the states, ``err_in[:n_in]`` / ``err_out[:n_out]``
    the tokens the error set gains and loses, ``fresh`` the tokens given a cache column:
    what :func:`commit_in_place` applies —; -1 when no round did within ``max_rounds``
    passes or one met a tie, a singular Q, a full cache or no room (``room`` positions):
    ``sy`` then holds the start's system again and ``KSS`` its block (rows from ``nS`` on
    written). ``facts[FACT_INV_RES]``: the final solve's probe residual. ``changes``: the
    set changes of the result; ``n_max``: the rows of ``KSS`` written. Only cache columns
    of entering tokens are written to the memory (a column in a hole or past ``chi``,
    never an eviction; ``fresh``).
    """
    ccap = KC.shape[1]
    tie = 1e-12 * scale
    col_budget = max(2, nS // max(X.shape[1], 1))  # a column costs n·d, a pass n·|S|
    pred = np.empty(hi, dtype=np.int64)  # the working set outside the margin set
    nP = predict(gp, gp_end, state, hi, c, cap, pred)
    pslot = np.empty(room, dtype=np.int64)
    pq = np.empty(room, dtype=np.int64)
    pe = np.empty(room, dtype=np.int64)
    pact = np.zeros(room, dtype=np.bool_)
    for j in range(nS):
        pq[j] = j + 1
    if p0row > 0 and p0row <= nS:  # (contracted: the last token took c's place)
        pq[p0row - 1] = nS + 1
    xt = np.empty(room + 1)
    passes = 0
    n_max = nS
    while True:  # (the rows: predicted, missed and leaving tokens; sized to the round)
        wrow = np.empty(nP + 2 * WS_ROOM, dtype=np.int64)
        KWt = np.empty((room, nP + 2 * WS_ROOM))
        ok, nT, nPos, changes, chi, n_round, n_in, n_out = path_on_rows(
            KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum, KSS, nS, chi, hi,
            C, mu, scale, gamma, is_rbf, c, x, pred, nP, tstate, xt, KWt, wrow, err_in,
            err_out, fresh, col_budget, facts, Q0, m0, qrow_col, sy, pslot, pq, pe, pact, z0,
            ahead)
        n_max = max(n_max, n_round)
        if not ok:
            break
        # the check: every token's exact g at the end, one pass
        ac_try = np.zeros(ccap)
        for col in range(chi):
            sl = soc[col]
            ac_try[col] = C if sl >= 0 and tstate[sl] == ERROR else 0.0
        for j in range(nPos):
            if pact[j]:
                ac_try[cos[pslot[j]]] = xt[j + 1]
        ac_try[cos[c]] = 0.0
        g_from_error_sum(KC, ac_try, soc, state, esum, diag, xt[0], C, nS, chi, hi, g_try)
        passes += 1
        act = np.empty(nT, dtype=np.int64)
        q = 0
        for j in range(nPos):
            if pact[j]:
                act[q] = pslot[j]
                q += 1
        n_miss = 0
        failed = False
        for r in range(hi):
            st = tstate[r]
            if r == c or (st != RESERVE and st != ERROR):
                continue
            gr = g_try[r]
            off = (st == RESERVE and gr < 0.0) or (st == ERROR and gr > 0.0)
            if (off or abs(gr) <= tie) and copy_of_any(KC, cos, diag, r, act, nT):
                continue  # a copy of a margin token: its sibling's g, it stays (the path's rule)
            if abs(gr) <= tie:
                failed = True
                break
            if off:
                if nP >= cap + WS_ROOM:
                    failed = True  # (many misses: the prediction did not hold)
                    break
                pred[nP] = r
                nP += 1
                n_miss += 1
        if failed:
            break
        if n_miss == 0:
            final_order(pslot, pq, pe, pact, nPos, nT, sy, KSS, xt, tord, xf, aug)
            return passes, nT, changes, chi, n_max, n_in, n_out
        if passes >= max_rounds:
            break
        nP = predict_again(g, g_try, state, tstate, hi, c, pred, nP, cap + WS_ROOM)
        pred[:nP] = np.sort(pred[:nP])  # (slot order: the rows' gathers run down a column)
        if not start_system(Q0, m0, p0row, KC, cos, diag, sy):  # the next round starts
            break  # where this one did
    start_system(Q0, m0, p0row, KC, cos, diag, sy)
    return passes, -1, 0, chi, n_max, 0, 0


@njit(cache=True)
def commit_in_place(KC, XC, ac, soc, cos, alpha, g, state, esum, member, nT, chi, hi, C, c,
                    tstate, tord, xt, g_try, fresh, err_in, n_in, err_out, n_out, out):
    """Apply a checked end of :func:`working_set_path` to the memory: the error sum
    follows the error set (one column added or subtracted per change, counted in
    ``out[SEG_ESUM_UPDATES]``), the cache's columns are swapped into the margin order
    ``tord[:nT]`` (the order ``Qb`` and ``KSS`` hold already), a token that left for the
    reserve set, or was given a column and stays there, gives its column up, and
    alpha, the states, the per-column alphas and g take the end's values. Returns
    ``(chi, mu)``."""
    for q in range(n_in):
        s = err_in[q]
        add_column(KC, cos[s], 1.0, hi, esum)
        member[s] = True
        out[SEG_ESUM_UPDATES] += 1
    for q in range(n_out):
        s = err_out[q]
        add_column(KC, cos[s], -1.0, hi, esum)
        member[s] = False
        out[SEG_ESUM_UPDATES] += 1
    for j in range(nT):
        p = cos[tord[j]]
        if p != j:
            swap_cols(KC, XC, ac, soc, cos, hi, j, p)
    for i in range(hi):
        if i == c:
            continue
        ts = tstate[i]
        changed = ts != state[i]
        if changed:
            state[i] = ts
            if ts == ERROR:
                alpha[i] = C
            elif ts == RESERVE:
                alpha[i] = 0.0
        if ts == RESERVE and (fresh[i] or changed) and cos[i] >= 0:
            chi = free_col(KC, XC, ac, soc, cos, i, chi)
    for j in range(nT):
        alpha[tord[j]] = xt[j + 1]
    alpha[c] = 0.0
    for col in range(chi):
        sl = soc[col]
        ac[col] = alpha[sl] if sl >= 0 else 0.0
    for i in range(hi):
        g[i] = g_try[i]
    return chi, xt[0]


quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
