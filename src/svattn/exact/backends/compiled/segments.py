"""Removal segment by segment (:func:`remove_segments`).

On a fixed partition the solution path is a straight line, so one margin solve
gives a segment's end and one pass over the margin block the exact g there. After
the first segment the path goes on on a working set, checked by one pass
(:mod:`svattn.exact.backends.compiled.working_set`). From :data:`JUMP_MIN_MARGIN`
margin tokens the working set is predicted ahead of any pass (:func:`line_ahead`):
the first segment's g estimated from the cache columns that move most on it, so that
the check alone, one pass, verifies a removal whose prediction holds.
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
    SEG_ESUM_UPDATES,
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
    WRITTEN_FRESH,
    WRITTEN_IN_PLACE,
    WRITTEN_IN_SPARE,
)
from svattn.exact.backends.compiled.columns import (
    add_column,
    copy_of_any,
    flat_exchange,
    free_column_available,
    join_with_sum,
    leave_with_sum,
    swap_cols,
)
from svattn.exact.backends.compiled.linalg import (
    bordered_health,
    gather_margin_gram_into,
    kss_append,
    kss_drop,
    positive_definite,
    solve_gathered,
    solve_partition,
)
from svattn.exact.backends.compiled.schur import (
    add_drop,
    fits_in_place,
    materialise,
    new_system,
    rhs_on,
    solve_from_z,
    solve_refined,
    sym_matvec,
    to_positions,
)
from svattn.exact.backends.compiled.schur import scrub as schur_scrub
from svattn.exact.backends.compiled.working_set import (
    WS_ROOM,
    commit_in_place,
    crossing_share,
    restart,
    start_system,
    unrefined_solve,
    working_set_path,
)
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE

# Below this many margin tokens the path alone removes a token: a pass over so narrow
# a block costs little next to the working set's copies of the inverse. Measured for
# the active-set steps this replaced (benchmarks/ab_jumps.py, results/ab_jumps.json):
# with 5-12 margin tokens (n = 4k) the path alone took 0.88-0.91x the time, with 21-30
# tokens 0.95-1.09x, and at 16k with 19-28 tokens 1.08-1.18x.
JUMP_MIN_MARGIN = 16
# The solution path pays one pass over the margin block per event. From the end
# point of the first segment, the path is instead followed on a working set of the
# tokens the removal can reach and its end checked by one pass computing every
# token's exact g (working_set.working_set_path); up to ``max_jumps`` checking
# passes are tried, and only an end that meets every KKT condition is applied to
# the memory, else the path goes on from its first event.


# From this many margin tokens a removal reports the health of the inverse it leaves by
# its final solve's probe residual alone (``cond1`` NaN: not measured), where the full
# measure reads the inverse and the Gram block once more (two |S|² passes, a third of
# a pass over the margin block at a thousand margin tokens); the health monitor takes
# a full measure every few removals and on any suspicion
# (:class:`~svattn.exact.operations.health.HealthMonitor`).
HEALTH_PROBE_FROM = 256
# The first segment hands the removed token's weight over when one margin token takes
# at least this share of it on the line and reaches C (a copy or near-copy of it: their
# kernel columns agree to ~1e-11, so no other g moves by more than that): the working
# set is then predicted from the second segment, where the path has bent
# (:func:`handover_line`).
HANDOVER_SHARE = 0.9
# The working set is predicted ahead of any pass (:func:`line_ahead`): every token's g at
# the first segment's end estimated from this many cache columns, those whose coefficient
# moves most on the line (``c``'s among them; a removal moves its neighbours' weights), so
# that one pass, the check, verifies the path's end (a miss costs one more pass, never a
# wrong answer).
AHEAD_COLUMNS = 32
# An unrefined first segment whose end leaves the box with no coefficient within this
# share of C of a bound skips its refinement: only its first event is used.
CLEAR_OF_BOUND = 1e-9


@njit(cache=True)
def line_ahead(KC, alpha, soc, cos, x, mu, g, c, nS, hi, g_ahead):
    """``g_ahead[:hi]``: every token's g at the first segment's end ``x`` estimated from
    :data:`AHEAD_COLUMNS` cache columns, those whose coefficient moves most on the line
    (``c``'s column, its weight going to 0, among the candidates): ``g`` plus their share
    of the move, ``O(n·AHEAD_COLUMNS)`` where the exact g is a pass (``n·|S|``)."""
    d = np.empty(nS + 1)
    for j in range(nS):
        d[j] = x[j + 1] - alpha[soc[j]]
    d[nS] = -alpha[c]
    k = min(AHEAD_COLUMNS, nS + 1)
    top = np.argsort(-np.abs(d))[:k]
    dmu = x[0] - mu
    for i in range(hi):
        g_ahead[i] = g[i] + dmu
    for t in range(k):
        q = top[t]
        add_column(KC, cos[c] if q == nS else q, 2.0 * d[q], hi, g_ahead)


@njit(cache=True)
def first_unrefined(Q0, m0, sy, KC, cos, diag, esum, nE, C, pslot, pq, pe, pact, nS, x, z0,
                    alpha, mu, c, p0row):
    """The first segment's end ``x`` as the inverse gives it from ``z0 = Q0 b`` (the
    refinement, :func:`~svattn.exact.backends.compiled.schur.solve_refined`, goes on from
    it where needed). Where ``c`` is a margin token (row ``p0row`` of ``Q0``, dropped) the
    right-hand side is the one the current point solves (its row's value is taken up by
    the drop's multiplier), so ``z0`` is that point, mu and the alphas by row: no read of
    ``Q0``; else one matrix-vector product with it."""
    ecap = sy[5].shape[0]
    bj = np.zeros(ecap)
    if p0row > 0:
        z0[0] = mu
        for j in range(nS):
            z0[pq[j]] = alpha[pslot[j]]
        z0[p0row] = alpha[c]
    else:
        no_err = np.empty(0, dtype=np.int64)
        b = np.empty(m0)
        rP = np.empty(nS + 1)
        rhs_on(KC, cos, diag, esum, no_err, 0, no_err, 0, nE, C, pslot, pq, pe, pact, nS, m0,
               b, bj, rP)
        sym_matvec(Q0, m0, b, z0)
    xb = np.empty(m0)
    xj = np.zeros(ecap)
    solve_from_z(z0, m0, bj, sy, xb, xj)
    to_positions(xb, xj, pq, pe, pact, nS, x)


@njit(cache=True)
def margin_event(x, alpha, soc, nS, C, tol_a):
    """The first margin coefficient to reach 0 or C on the line to ``x``: ``(best, kind,
    who, tie)`` (kind 2: none; 3 / 4: ``who`` leaves for 0 / C at share ``best``; ``tie``:
    a coefficient lands within ``tol_a`` of a bound)."""
    best = 1.0
    kind = 2
    who = -1
    tie = False
    for j in range(nS):
        a0 = alpha[soc[j]]
        a1 = x[j + 1]
        if abs(a1) <= tol_a or abs(a1 - C) <= tol_a:
            tie = True  # lands on a bound: the polish's case, left to the drive
        elif a1 < 0.0 or a1 > C:
            f = a0 / (a0 - a1) if a1 < 0.0 else (C - a0) / (a1 - a0)
            if f < best:
                best = f
                kind = 3 if a1 < 0.0 else 4
                who = soc[j]
    return best, kind, who, tie


@njit(cache=True)
def crossing_ahead(g, g_ahead, state, hi, c, rate_tol):
    """Whether an error or reserve token crosses on the line ``g`` → ``g_ahead``."""
    for i in range(hi):
        if i != c and crossing_share(state[i], g[i], g_ahead[i], rate_tol) < 1.0:
            return True
    return False


@njit(cache=True)
def jump(KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum, member, KSS, nS, chi,
         hi, C, mu, scale, gamma, is_rbf, c, x, rounds, facts, Qinv, m0, qrow_col, p0row, sy,
         z0, aug, gp, gp_end, ahead, out):
    """The rest of the path on a working set predicted from ``gp`` → ``gp_end``, checked by
    up to ``rounds`` passes (:func:`~svattn.exact.backends.compiled.working_set.
    working_set_path`), applied where checked (:func:`~svattn.exact.backends.compiled.
    working_set.commit_in_place`). Returns ``(nT, chi, mu, passes)``, ``nT`` -1 where no
    round held (nothing applied)."""
    ccap = KC.shape[1]
    room = min(ccap, nS + WS_ROOM)  # the tentative margin sets stay below this
    tstate = np.empty(hi, dtype=state.dtype)
    tord = np.empty(room, dtype=np.int64)
    xt = np.empty(room + 1)
    g_try = np.empty(hi)
    fresh = np.zeros(hi, dtype=np.bool_)
    err_in = np.empty(ccap, dtype=np.int64)
    err_out = np.empty(ccap, dtype=np.int64)
    passes, nT, changes, chi, n_max, n_in, n_out = working_set_path(
        KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum, KSS, nS, chi, hi,
        C, mu, scale, gamma, is_rbf, c, x, rounds, working_set_cap(nS, hi), room,
        tstate, tord, xt, g_try, fresh, err_in, err_out, facts, Qinv, m0, qrow_col,
        p0row, sy, z0, aug, gp, gp_end, ahead)
    g_try[c] = 0.0  # c's own entry (see g_end below)
    out[SEG_PASSES] += passes
    out[SEG_GRAM] = max(out[SEG_GRAM], n_max)
    if nT <= 0:
        out[SEG_JUMPED] = -1  # tried: the path goes on from its first event
        return -1, chi, mu, passes
    chi, mu = commit_in_place(
        KC, XC, ac, soc, cos, alpha, g, state, esum, member, nT, chi, hi, C, c,
        tstate, tord, xt, g_try, fresh, err_in, n_in, err_out, n_out, out)
    out[SEG_EVENTS] += changes  # with the segment: every set change and c's exit
    out[SEG_JUMPED] = 1
    return nT, chi, mu, passes


@njit(cache=True)
def working_set_cap(nS, hi):
    """How many tokens outside the margin set the working set may hold: the set's g
    costs ``|W|·|S|`` a segment, a pass ``n·|S|``."""
    return min(hi, nS // 2 + 64)


@njit(cache=True)
def handover_line(KC, ac, soc, cos, state, esum, diag, Qinv, m0, sy, z0, p0row, g, g_end, C,
                  nS, chi, hi, c, who, best, pslot, pq, pe, pact, g_mid, g_next):
    """The second segment's line where the first hands ``c``'s weight over to margin
    token ``who`` (it reaches C at share ``best`` of the first; :data:`HANDOVER_SHARE`):
    ``g_mid`` the g at that event (linear on the first line), ``g_next`` every token's g at
    the end of the second (``who`` in the error set, one pass). The second segment's
    solve is the working set's own: ``who``'s row of ``Qinv`` dropped in the capacitance
    system ``sy`` (which holds the start's: ``c``'s row ``p0row`` dropped), ``Qinv b``
    moved from the start's ``z0`` by its column (:func:`~svattn.exact.backends.compiled.
    working_set.unrefined_solve`, ``O(|S|·k)``); ``sy`` holds the start's system again on
    return. False, nothing computed, when ``who``'s drop fails its pivot."""
    j = cos[who]  # (the first segment's positions are the cache columns)
    if not add_drop(Qinv, m0, pq[j], KC, cos, diag, sy):
        return False
    pact[j] = False
    ecap = sy[5].shape[0]
    err_in = np.full(1, who, dtype=np.int64)
    no_err = np.empty(0, dtype=np.int64)
    x2 = np.empty(nS + 1)
    unrefined_solve(Qinv, m0, sy, z0, np.empty(m0), np.empty(m0), np.zeros(ecap),
                    np.zeros(ecap), KC, cos, diag, esum, err_in, 1, no_err, 0, C, pslot, pq,
                    pe, pact, cos, nS, x2)
    pact[j] = True
    if not start_system(Qinv, m0, p0row, KC, cos, diag, sy):  # (its drop held at the start)
        return False
    for q in range(nS):
        ac[q] = x2[q + 1]
    ac[j] = C  # (its column at C: its share of every g as an error token's)
    ac[cos[c]] = 0.0
    g_from_error_sum(KC, ac, soc, state, esum, diag, x2[0], C, nS, chi, hi, g_next)
    for i in range(hi):
        g_mid[i] = g[i] + best * (g_end[i] - g[i])
    return True


@njit(cache=True)
def finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member, state,
                    slot_id, Qres, KSS, nS, chi, hi, mu, C, scale, c, out, facts, sup_ids,
                    sup_values, pd_defer):
    """What a finished removal reports, computed where its arrays are in cache:
    the KKT residual, set sizes, ties and uniqueness, the support in id order
    with its alphas and mu (the digest's input), the health measure of the
    bordered inverse ``Qres`` it leaves; then ``c``'s array entries are wiped (it left the error
    sum at the start). Equal to :func:`kkt_residual`, :func:`certificate_facts`
    and :func:`bordered_health` (the references; from :data:`HEALTH_PROBE_FROM` margin
    tokens the health is the final solve's probe residual, already in
    ``facts[FACT_INV_RES]``, and ``cond1`` NaN). Returns chi.
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
    # the support: margin and error tokens (error tokens keep no cache column)
    n = 0
    slots = np.empty(nm + ne + 1, dtype=np.int64)
    for sl in range(hi):
        if sl != c and alpha[sl] > 0:
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
    if nS < HEALTH_PROBE_FROM:
        cond, res = bordered_health(Qres, KSS, nS)
        facts[FACT_COND] = cond
        facts[FACT_INV_RES] = res
    else:  # the final solve's probe residual (facts[FACT_INV_RES]); cond1 not measured
        facts[FACT_COND] = np.nan
    # (c's whole kernel row zeroed where nonzero, past chi too: numba caches this caller
    # with the callee inlined, so a change to the wipe needs a change here to be
    # recompiled)
    chi, _ = wipe_slot_arrays(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, c, chi, hi, True)
    return chi


@njit(cache=True)
def remove_segments(KC, XC, ac, soc, cos, X, V, xn2, diag, alpha, g, state, slot_id, Qinv, esum,
                    member, rebuild, nS, chi, hi, mu, C, gamma, is_rbf, c, contract_col,
                    max_segments, max_jumps, scale, g_end, out, facts, sup_ids, sup_values,
                    KSS, pd_defer, Qb, kss_in, spare, qflat):
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
    The memory's inverse ``Qinv`` is not written on the way: the first segment and the
    working set solve against it with the set's changes in a small capacitance system
    (:mod:`~svattn.exact.backends.compiled.schur`), and the inverse returned is written
    from it once, at the end. ``Qb`` ((ccap + 1)², zeros; the caller's, which zeroes it if this call
    raises) takes a work copy only where the segment loop goes on past the first
    segment (:func:`~svattn.exact.backends.compiled.working_set.restart`); zeroed again
    before returning. ``kss_in``: ``KSS`` holds the margin block already (the previous
    operation's, :mod:`svattn.exact.core.gram`), followed through ``c``'s exit; else the
    first segment gathers it. Where the inverse returned is written (``where``):
    over ``Qinv``'s own memory ``qflat`` (row-major, ``Qinv`` its first ``m0²`` floats,
    room past them; empty: not this) where
    :func:`~svattn.exact.backends.compiled.schur.fits_in_place` holds (or, from the
    work copy, where it fits), zeros after it
    (:data:`~svattn.exact.backends.compiled.codes.WRITTEN_IN_PLACE`: ``Qinv`` is then
    gone, and the caller counts it, ``SlotState.inverse_overwrites``); else into
    ``spare``, zeroed memory (a replaced inverse's, ``SlotState.qspare``) where it holds
    ``(nS + 1)²`` floats (``WRITTEN_IN_SPARE``); else a fresh array (``WRITTEN_FRESH``).
    Returns ``(status, nS, chi, mu, Qinv, where)`` (``Qinv`` empty unless fresh;
    the others are ``[:(nS + 1)²]`` of their memory, row-major): DONE; FALLBACK when a
    case is left to :func:`drive_events` (a zero-length or near-tied event, an empty margin set,
    no free column, ``max_segments`` segments taken), from a consistent state
    with g accurate on every row; or NEED_RESOLVE (Q turned singular). ``out``
    receives the segments taken, the error-sum updates and the last token to
    leave and to enter the margin set (drive_events' loop seeds), ``out[SEG_PASSES]``
    the passes over the margin block and ``out[SEG_JUMPED]`` whether the working
    set finished the removal (1) or was tried and left it to the path (-1).

    When the first segment has an event and ``max_jumps`` > 0, the rest of the path
    is followed on a working set and its end checked by a pass, up to ``max_jumps``
    checking passes (:func:`~svattn.exact.backends.compiled.working_set.working_set_path`),
    predicted from the second segment (one more pass, :func:`handover_line`) where the
    first hands ``c``'s weight over to one margin token; a checked end is applied
    (:func:`~svattn.exact.backends.compiled.working_set.commit_in_place`) and is the
    result. From :data:`JUMP_MIN_MARGIN` margin tokens the working set is first predicted
    ahead of the first segment's pass (:func:`line_ahead`; where the first segment has a
    margin event or its estimated line a crossing), its end checked by the same passes
    (``max_jumps`` in all); where it misses, the first segment's pass is taken as above.
    """
    ccap = KC.shape[1]
    qb_ready = False  # Qb holds the path's inverse (the segment loop's work copy)
    qb_ext = 0  # rows and columns of Qb in use so far (scrubbed at the end)
    n0, p0 = nS, contract_col  # Qinv's size, and c's position in it (the path's restart)
    m0 = n0 + 1
    kss_ok = kss_in and nS > 0  # KSS holds the current margin block (kept across events)
    if contract_col >= 0:  # c is a margin token: it leaves the margin set first
        if kss_ok:
            kss_drop(KSS, contract_col, nS)
        if nS > 1:  # (its cache column goes last; Qinv keeps its row: dropped below)
            swap_cols(KC, XC, ac, soc, cos, hi, contract_col, nS - 1)
        nS -= 1
        kss_ok = kss_ok and nS > 0
    # the margin set by position (schur's text): cache column j, row pq[j] of Qinv
    p0row = p0 + 1 if p0 >= 0 else -1
    pslot = np.empty(max(nS, 1), dtype=np.int64)
    pq = np.empty(max(nS, 1), dtype=np.int64)
    pe = np.full(max(nS, 1), -1, dtype=np.int64)
    pact = np.ones(max(nS, 1), dtype=np.bool_)
    qrow_col = np.full(m0, -1, dtype=np.int64)  # (c's row: -1, its values never read)
    aug = np.empty(ccap + 2, dtype=np.int64)  # the rows the inverse returned is written from
    aug[0] = 0
    for j in range(nS):
        pslot[j] = soc[j]
        pq[j] = nS + 1 if j == p0 else j + 1  # (the last token took c's place)
        qrow_col[pq[j]] = j
        aug[j + 1] = pq[j]
    sy = new_system(m0, 2 * WS_ROOM + 4, WS_ROOM + 1)
    z0 = np.zeros(m0)  # Qinv b of the start's right-hand side
    no_err = np.empty(0, dtype=np.int64)
    sys_ok = nS > 0 and start_system(Qinv, m0, p0row, KC, cos, diag, sy)
    x = np.empty(ccap + 1)
    out[SEG_SYNC] = error_sum_sync(esum, member, KC, soc, cos, state, X, diag, nS, chi, hi,
                                   gamma, is_rbf, rebuild)
    tol_a = 1e-13 * C  # the polish's at-bound tie
    gtol = 1e-13 * scale  # drive_events' smallest rate
    rounds = max_jumps  # the working set's checking passes left
    status = DONE
    while True:
        if (nS == 0 or out[SEG_EVENTS] >= max_segments
                or not free_column_available(soc, state, nS, chi, ccap)):
            status = FALLBACK
            break
        out[SEG_EVENTS] += 1
        t_rem = alpha[c]
        if not qb_ready and not sys_ok:  # (a lost pivot: the work copy's own solve)
            restart(Qb, Qinv, n0, p0)
            qb_ready = True
            qb_ext = max(qb_ext, n0 + 1)
        if not qb_ready:  # the first segment: against Qinv, c's row dropped
            if not kss_ok:
                gather_margin_gram_into(KC, soc, nS, KSS)
                kss_ok = True
            nE = 0
            for i in range(hi):
                if state[i] == ERROR:
                    nE += 1
            first_unrefined(Qinv, m0, sy, KC, cos, diag, esum, nE, C, pslot, pq, pe, pact, nS,
                            x, z0, alpha, mu, c, p0row)
            best, kind, who, tie = margin_event(x, alpha, soc, nS, C, CLEAR_OF_BOUND * C)
            handover = kind == 4 and x[cos[who] + 1] - alpha[who] >= HANDOVER_SHARE * t_rem
            refined = tie or handover
            if refined:  # (else only its first event is used, or the working set refines)
                facts[FACT_INV_RES] = solve_refined(Qinv, m0, sy, KSS, KC, cos, diag, esum,
                                                    no_err, 0, no_err, 0, nE, C, pslot, pq, pe,
                                                    pact, nS, x, z0, True)
            if rounds > 0 and nS >= JUMP_MIN_MARGIN and not handover:
                # the working set predicted ahead of the first pass: the check alone
                best, kind, who, tie = margin_event(x, alpha, soc, nS, C, tol_a)
                if not tie and best > 0.0:
                    line_ahead(KC, alpha, soc, cos, x, mu, g, c, nS, hi, g_end)
                    if kind != 2 or crossing_ahead(g, g_end, state, hi, c, gtol * t_rem):
                        nT, chi, mu, passes = jump(
                            KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum,
                            member, KSS, nS, chi, hi, C, mu, scale, gamma, is_rbf, c, x,
                            rounds, facts, Qinv, m0, qrow_col, p0row, sy, z0, aug, g, g_end,
                            True, out)
                        rounds -= passes
                        if nT > 0:
                            nS = nT
                            break
            if kind == 2 and not refined:  # the end may be the result: refined
                facts[FACT_INV_RES] = solve_refined(Qinv, m0, sy, KSS, KC, cos, diag, esum,
                                                    no_err, 0, no_err, 0, nE, C, pslot, pq, pe,
                                                    pact, nS, x, z0, True)
        elif kss_ok:
            facts[FACT_INV_RES] = solve_gathered(KC, Qb, soc, state, diag, esum, nS, chi, C, x,
                                                 KSS)
        else:
            facts[FACT_INV_RES] = solve_partition(KC, Qb, soc, state, diag, esum, nS, chi, C,
                                                  x, KSS)
            kss_ok = True
        out[SEG_GRAM] = max(out[SEG_GRAM], nS)
        col_c = cos[c]
        for j in range(nS):
            ac[j] = x[j + 1]
        ac[col_c] = 0.0
        g_from_error_sum(KC, ac, soc, state, esum, diag, x[0], C, nS, chi, hi, g_end)
        # the first event on the line, as a fraction of the segment: a margin
        # coefficient reaching 0 or C (kind 2: none, c leaves: the end is the result) ...
        best, kind, who, tie = margin_event(x, alpha, soc, nS, C, tol_a)
        # ... or an error / reserve token whose g changes sign (g is linear on it)
        rate_tol = gtol * t_rem
        for i in range(hi):
            f = crossing_share(state[i], g[i], g_end[i], rate_tol)
            # (a copy of a margin token has its sibling's g, 0: it never crosses;
            # tested only for a token that would come first, one row read each)
            if f < best and not copy_of_any(KC, cos, diag, i, soc, nS):
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
        # an event on the first segment: the path on a working set, checked by a pass;
        # predicted from the second segment where the first hands c's weight over to one
        # margin token (its line moves every other g by rounding and predicts nothing)
        if kind != 2 and out[SEG_EVENTS] == 1 and rounds > 0 and nS >= JUMP_MIN_MARGIN:
            gp, gp_end = g, g_end  # the line the working set is predicted from
            if (kind == 4 and not qb_ready and x[cos[who] + 1] - alpha[who]
                    >= HANDOVER_SHARE * t_rem):
                g_mid = np.empty(hi)
                g_next = np.empty(hi)
                if handover_line(KC, ac, soc, cos, state, esum, diag, Qinv, m0, sy, z0,
                                 p0row, g, g_end, C, nS, chi, hi, c, who, best, pslot, pq,
                                 pe, pact, g_mid, g_next):
                    out[SEG_PASSES] += 1
                    gp, gp_end = g_mid, g_next
            nT, chi, mu, _ = jump(KC, XC, ac, soc, cos, X, diag, alpha, g, g_end, state, esum,
                                  member, KSS, nS, chi, hi, C, mu, scale, gamma, is_rbf, c, x,
                                  rounds, facts, Qinv, m0, qrow_col, p0row, sy, z0, aug, gp,
                                  gp_end, False, out)
            if nT > 0:
                nS = nT
                break
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
        if not qb_ready:  # the segment loop goes on: its work copy of the inverse
            restart(Qb, Qinv, n0, p0)
            qb_ready = True
            qb_ext = max(qb_ext, n0 + 1)
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
            up = alpha[who] <= 0.0  # (from the reserve set)
            ok, chi = join_with_sum(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state,
                                     esum, member, who, nS, chi, hi, gamma, is_rbf, scale, out)
            if not ok:  # nearly in the span of the margin keys: the flat exchange first
                state[who] = RESERVE if up else ERROR  # (and out of the error sum)
                code, left, mu = flat_exchange(Qb, KC, ac, soc, cos, diag, alpha, g, state,
                                               who, up, nS, hi, C, scale, gtol, mu)
                if code == 2:  # it crossed its box: the other bound, and the error sum
                    state[who] = ERROR if up else RESERVE
                    if up:
                        add_column(KC, cos[who], 1.0, hi, esum)
                        member[who] = True
                        out[SEG_ESUM_UPDATES] += 1
                    continue
                if code == 1:  # its partner reached a bound and leaves, it joins
                    p, n_was = cos[left], nS
                    nS, chi = leave_with_sum(Qb, KC, XC, ac, soc, cos, alpha, state, esum,
                                              member, left, alpha[left] > 0.0, nS, chi, hi,
                                              C, out)
                    kss_drop(KSS, p, n_was)  # (nS >= 1 left: the exchange had a partner)
                    out[SEG_LAST_LEFT] = left
                    ok, chi = join_with_sum(Qb, KC, XC, ac, soc, cos, X, diag, alpha, g, state,
                                            esum, member, who, nS, chi, hi, gamma, is_rbf,
                                            scale, out)
            if not ok:
                status = NEED_RESOLVE
                break
            kss_append(KSS, KC, soc, nS)
            out[SEG_GRAM] = max(out[SEG_GRAM], nS + 1)
            nS += 1
            out[SEG_LAST_ENTERED] = who
    g_end[c] = 0.0  # the one entry that c's key makes (freed memory keeps no key data)
    # the inverse returned, written once: into the spare (memory in use already: no
    # fresh array faulted in and zeroed) where it is large enough
    m = nS + 1 if nS else 0
    if m and not qb_ready and not sys_ok:  # (no system: the work copy's rank-one drop)
        restart(Qb, Qinv, n0, p0)
        qb_ready = True
        qb_ext = max(qb_ext, n0 + 1)
    # over the old inverse where it fits (module text); else the spare; else a fresh array
    room = qflat.shape[0]
    if m and (qb_ready and m * m <= room or not qb_ready and fits_in_place(aug, m, m0, room)):
        where = WRITTEN_IN_PLACE
        Qres = qflat[: m * m].reshape((m, m))
        Qout = np.zeros((0, 0))
    elif m > 0 and spare.shape[0] >= m * m:
        where = WRITTEN_IN_SPARE
        Qres = spare[: m * m].reshape((m, m))
        Qout = np.zeros((0, 0))
    else:
        where = WRITTEN_FRESH
        Qout = np.zeros((m, m))
        Qres = Qout
    if m and qb_ready:  # the segment loop's work copy
        for i in range(m):
            for j in range(m):
                Qres[i, j] = Qb[i, j]
        if where == WRITTEN_IN_PLACE and m < m0:
            qflat[m * m:m0 * m0] = 0.0
    elif m:  # Qinv with the path's changes (c's row dropped, at least)
        in_place = where == WRITTEN_IN_PLACE
        materialise(Qinv, m0, sy, aug, m, qflat if in_place else Qres.reshape(m * m), in_place)
    if status == DONE:
        chi = finish_removal(X, V, KC, XC, ac, soc, cos, xn2, diag, alpha, g, esum, member,
                              state, slot_id, Qres, KSS, nS, chi, hi, mu, C, scale, c, out,
                              facts, sup_ids, sup_values, pd_defer)
    for i in range(qb_ext):  # the work copy held c's row and column: zeroed
        for j in range(qb_ext):
            Qb[i, j] = 0.0
    schur_scrub(sy, m0)
    z0.fill(0.0)
    return status, nS, chi, mu, Qout, where

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
