"""Single-pass checks and bookkeeping, compiled: KKT residual, certificate facts,
ties, standby choice, the error-column sum and the wipe of a removed slot.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import VEC
from svattn.exact.backends.compiled.columns import (
    add_block_matvec,
    add_column,
    alloc_col,
    free_col,
    kernel_column,
    swap_cols,
)
from svattn.exact.backends.compiled.linalg import positive_definite
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kktsets import ERROR, FREE, MARGIN, RESERVE


@njit(cache=True)
def kkt_residual(g, alpha, state, diag, mu, C, hi):
    """:meth:`SVDDMemory._kkt` compiled (same definition, one pass)."""
    return kkt_pass(g, alpha, state, diag, mu, C, hi, -1, -1.0)[0]


@njit(cache=True)
def kkt_pass(g, alpha, state, diag, mu, C, hi, skip, tie):
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
def refresh_standby(KC, XC, ac, soc, cos, X, diag, alpha, g, state, nS, chi, hi, gamma,
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
            chi = free_col(KC, XC, ac, soc, cos, s, chi)
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
            chi = alloc_col(KC, XC, ac, soc, cos, X, diag, alpha, state, s, nS, chi, hi,
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
            add_column(KC, col, -1.0, hi, esum)
            change = 1
        else:
            change = -1
        member[slot] = False
    chi = free_col(KC, XC, ac, soc, cos, slot, chi)
    for j in range(X.shape[1]):
        X[slot, j] = 0.0
    for j in range(V.shape[1]):
        V[slot, j] = 0.0
    for j in range(KC.shape[1]):  # the whole row: a row is scored against holes below
        if KC[slot, j] != 0.0:  # chi too (k(x, 0) there), which chi may since have dropped
            KC[slot, j] = 0.0  # (only where written: a write to a column never used
            # faults in its memory, tens of ms on the first removal after a fit)
    xn2[slot] = 0.0
    diag[slot] = 0.0
    alpha[slot] = 0.0
    g[slot] = 0.0
    esum[slot] = 0.0
    state[slot] = FREE
    return chi, change





# ------------------------------------------------------------ the error-column sum
# Error tokens all sit at alpha = C, so their share of g is C times the sum of
# their kernel columns. Keeping that sum (libsvm keeps the same for its bounded
# variables, "G_bar") lets an exact g read the margin block and one vector
# instead of every error column, and the error tokens keep no column: between
# operations the cache holds margin and standby columns only (issue #51). Within an
# operation a token that reaches C keeps the column it had until the operation
# ends (:func:`fold_error_columns`); each sync compares the members the sum was
# built from with the current error tokens and adds or subtracts one column per
# change, computed afresh (then zeroed) for a token that has none.


@njit(cache=True)
def _in_sync(member, state, hi):
    """Whether the error sum's members are exactly the error tokens (nothing for
    :func:`error_sum_sync` to do). A scan of its own: the same test inside the loop
    that holds the updates made a sync with nothing to do take 62 µs at 8,000 slots,
    where it takes 6 µs with this scan first (the call included)."""
    for s in range(hi):
        if member[s] != (state[s] == ERROR):
            return False
    return True


@njit(cache=True)
def _fresh_column_add(esum, X, diag, s, hi, gamma, is_rbf, sign, tmp):
    """``esum[:hi] += sign · K[:hi, s]`` from a column computed into ``tmp`` (hi, 1)
    as :func:`~.columns.kernel_column` computes a cached one; ``tmp`` is zeroed after
    (it held a function of the token's key)."""
    kernel_column(tmp, X, diag, s, 0, hi, gamma, is_rbf)
    for i in range(hi):
        esum[i] += sign * tmp[i, 0]
        tmp[i, 0] = 0.0


@njit(cache=True)
def error_sum_sync(esum, member, KC, soc, cos, state, X, diag, nS, chi, hi, gamma, is_rbf,
                   rebuild):
    """Bring ``esum`` (per slot: the sum of the error tokens' kernel values) up to
    the current error set; rebuilt from scratch when ``rebuild`` is set. A token
    without a cache column (every error token between operations) has its column
    computed afresh for the update and zeroed after.

    ``member[s]`` marks the slots ``esum`` currently sums over. Returns the number
    of columns added or subtracted, or -1 after a rebuild from scratch.
    """
    n = 0
    if not rebuild and _in_sync(member, state, hi):
        return 0  # (the usual case)
    tmp = np.zeros((0, 1))  # a scratch column, allocated on first need
    if rebuild:  # start empty: every error column is then added below
        for i in range(hi):
            esum[i] = 0.0
            member[i] = False
    else:  # take the departed members out
        for s in range(hi):
            if member[s] and state[s] != ERROR:
                if cos[s] >= 0:
                    add_column(KC, cos[s], -1.0, hi, esum)
                else:
                    if tmp.shape[0] < hi:
                        tmp = np.zeros((hi, 1))
                    _fresh_column_add(esum, X, diag, s, hi, gamma, is_rbf, -1.0, tmp)
                member[s] = False
                n += 1
    for col in range(nS, chi):
        s = soc[col]
        if s >= 0 and state[s] == ERROR and not member[s]:
            add_column(KC, col, 1.0, hi, esum)
            member[s] = True
            n += 1
    for s in range(hi):  # error tokens without a column (a rebuild, a restored state)
        if state[s] == ERROR and not member[s]:
            if tmp.shape[0] < hi:
                tmp = np.zeros((hi, 1))
            _fresh_column_add(esum, X, diag, s, hi, gamma, is_rbf, 1.0, tmp)
            member[s] = True
            n += 1
    return -1 if rebuild else n


@njit(cache=True)
def fold_error_columns(KC, XC, ac, soc, cos, state, member, nS, chi):
    """Free the cache column of every error token the (synced) error sum holds: an
    error token keeps no column between operations. Returns chi."""
    for col in range(nS, chi):
        s = soc[col]
        if s >= 0 and state[s] == ERROR and member[s]:
            chi = free_col(KC, XC, ac, soc, cos, s, chi)
    return chi


@njit(cache=True)
def compact_columns(KC, XC, ac, soc, cos, nS, chi, hi):
    """Move the cached columns past the margin block down into the holes below them, so
    that the used columns are ``[0, chi)`` without gaps (a moved column's old place is
    zeroed by the swap with the hole). Returns chi."""
    dst = nS
    for col in range(nS, chi):
        if soc[col] >= 0:
            if col != dst:
                swap_cols(KC, XC, ac, soc, cos, hi, dst, col)
                for i in range(KC.shape[0]):  # (the hole's old rows past hi: zero too)
                    KC[i, col] = 0.0
            dst += 1
    return dst


@njit(cache=True, fastmath=VEC)
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
    add_block_matvec(KC, w, nS, hi, g)
    for col in range(nS, chi):
        s = soc[col]
        if s < 0:
            continue
        extra = ac[col] - (C if state[s] == ERROR else 0.0)
        if extra != 0.0:
            add_column(KC, col, 2.0 * extra, hi, g)

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
