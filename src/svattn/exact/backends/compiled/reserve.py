"""Adds into the reserve set, compiled: score a new key against the cached columns and,
when it lands in the reserve set, store it — in one call (``docs/design.md`` §2, *Adds*
and *The streaming add*).

A row inside the description (``g >= 0`` up to the tie of
:func:`svattn.exact.core.cache.outside_description`) with no standby refresh due changes
nothing but its own slot, so the whole add is the kernel row against the cached
columns (margin, error and standby tokens), its g, its error-column sum and the
slot's writes: :func:`reserve_add` for one ``add`` (the Python bookkeeping around it
is :func:`svattn.exact.fastpath.store_reserve`), :func:`reserve_block` for a run of
an ``extend``'s rows, and :func:`store_row` for a driven row already scored. The
numpy references are :func:`svattn.exact.backends.reference.reserve_add`,
:func:`~svattn.exact.backends.reference.reserve_block` and
:func:`~svattn.exact.backends.reference.store_row`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from svattn.exact.backends.compiled.codes import VEC
from svattn.exact.backends.compiled.columns import exp_column
from svattn.exact.core.compiling import quick_load
from svattn.exact.core.kernels import LOG_MAX
from svattn.exact.core.kktsets import ERROR, RESERVE

# reserve_add's and reserve_block's status: stored; outside the description (driven in
# by the general path); a standby refresh due (reserve_add only: the general path
# refreshes); an exp-kernel overflow
STORED, OUTSIDE, STANDBY, OVERFLOW = 0, 1, 2, 3


@njit(cache=True, fastmath=VEC)
def _sqdist(x, B, k):
    """‖x − B[k]‖² from differences (as ``columns.row_sqdist``)."""
    acc = 0.0
    for j in range(x.shape[0]):
        t = x[j] - B[k, j]
        acc += t * t
    return acc


@njit(cache=True, fastmath=VEC)
def _dot(x, B, k):
    acc = 0.0
    for j in range(x.shape[0]):
        acc += x[j] * B[k, j]
    return acc


@njit(cache=True, fastmath=VEC)
def sq_norm(x):
    """‖x‖² of a 1-D array (inf on overflow, NaN on NaN; no warning either way)."""
    acc = 0.0
    for j in range(x.shape[0]):
        acc += x[j] * x[j]
    return acc


@njit(cache=True)
def reserve_row(x, XC, ac, chi, mu, gamma, is_rbf, row):
    """The kernel row of ``x`` against columns ``[0, chi)`` into ``row[:, 0]`` (a
    column, for the cache's vectorized exp); return (g, k(x, x), largest log kernel
    value) with g = 2 row·ac − k(x, x) + μ."""
    top = -math.inf
    if is_rbf:
        kxx = 1.0
        for c in range(chi):
            row[c, 0] = -gamma * _sqdist(x, XC, c)
    else:
        xx = 0.0
        for j in range(x.shape[0]):
            xx += x[j] * x[j]
        top = gamma * xx
        kxx = math.exp(min(top, LOG_MAX))
        for c in range(chi):
            row[c, 0] = gamma * _dot(x, XC, c)
            top = max(top, row[c, 0])
        if top >= LOG_MAX:
            return -math.inf, kxx, top
    exp_column(row, 0, chi)
    acc = 0.0
    for c in range(chi):
        acc += row[c, 0] * ac[c]
    return 2.0 * acc - kxx + mu, kxx, top


@njit(cache=True)
def error_share(x, X, state, member, cos, hi, gamma, is_rbf):
    """The kernel values of ``x`` against the tokens without a cache column that the
    error set or the error sum holds (every error token between operations):
    ``(g_part, es_part, top)`` — their sum over the error set (C times it is their
    share of g), over the sum's members (the new row's error sum) and the largest log
    kernel value. The values go through a scratch column, zeroed after."""
    m = 0
    for i in range(hi):
        if cos[i] < 0 and (state[i] == ERROR or member[i]):
            m += 1
    top = -math.inf
    if m == 0:
        return 0.0, 0.0, top
    buf = np.empty((m, 1))
    k = 0
    for i in range(hi):
        if cos[i] < 0 and (state[i] == ERROR or member[i]):
            buf[k, 0] = -gamma * _sqdist(x, X, i) if is_rbf else gamma * _dot(x, X, i)
            top = max(top, buf[k, 0])
            k += 1
    if not is_rbf and top >= LOG_MAX:
        buf.fill(0.0)
        return 0.0, 0.0, top
    exp_column(buf, 0, m)
    gp = 0.0
    es = 0.0
    k = 0
    for i in range(hi):
        if cos[i] < 0 and (state[i] == ERROR or member[i]):
            if state[i] == ERROR:
                gp += buf[k, 0]
            if member[i]:
                es += buf[k, 0]
            buf[k, 0] = 0.0
            k += 1
    return gp, es, top


@njit(cache=True)
def score_row(x, XC, ac, chi, mu, gamma, is_rbf, row, X, state, member, cos, hi, C):
    """:func:`reserve_row` with the share of the error tokens that keep no column
    (:func:`error_share`): ``(g, k(x, x), largest log kernel value, es_part)``."""
    gx, kxx, top = reserve_row(x, XC, ac, chi, mu, gamma, is_rbf, row)
    if not is_rbf and top >= LOG_MAX:
        return gx, kxx, top, 0.0
    gp, es, top2 = error_share(x, X, state, member, cos, hi, gamma, is_rbf)
    return gx + 2.0 * C * gp, kxx, max(top, top2), es


@njit(cache=True)
def _store_scored(x, v, X, V, xn2, diag, alpha, g, state, slot_id, KC, soc, esum,
                  esum_member, slot, tid, chi, gx, kxx, esum_valid, es_part, row):
    """Store the scored key ``x`` (its kernel row in ``row[:chi, 0]``, its g and k(x, x))
    as reserve token ``tid`` in the free ``slot``, with its error-column sum: over the
    row for the members with a column, plus ``es_part`` for those without
    (:func:`error_share`); return esum_valid after."""
    es = 0.0
    if esum_valid:
        es = es_part
        for c in range(chi):
            s = soc[c]
            if s >= 0 and esum_member[s]:
                es += row[c, 0]
    xx = 0.0
    for j in range(x.shape[0]):
        X[slot, j] = x[j]
        xx += x[j] * x[j]
    for j in range(v.shape[0]):
        V[slot, j] = v[j]
    xn2[slot] = xx
    diag[slot] = kxx
    alpha[slot] = 0.0
    g[slot] = gx
    state[slot] = RESERVE
    slot_id[slot] = tid
    esum[slot] = es
    for c in range(chi):
        KC[slot, c] = row[c, 0]
    return esum_valid


@njit(cache=True)
def _outside(gx, kxx, mu):
    """:func:`svattn.exact.core.cache.outside_description` of one scored row."""
    return gx < -1e-13 * max(2.0 * kxx + gx - mu + abs(mu), 1.0)


@njit(cache=True)
def reserve_add(x, v, X, V, xn2, diag, alpha, g, state, slot_id, KC, XC, ac, soc, cos,
                esum, esum_member, slot, tid, chi, hi, mu, C, gamma, is_rbf, esum_valid,
                standby_due, theta, row):
    """Score ``x`` (value ``v``, empty when values are the keys); if it lands in the
    reserve set with no standby refresh due (``standby_due``: the standby columns are
    kept and stale; else a g below ``theta`` calls for one), store it in the free
    ``slot`` as token ``tid`` and return (STORED, esum_valid after); otherwise write
    nothing and return the status (OUTSIDE, STANDBY, OVERFLOW)."""
    gx, kxx, top, es = score_row(x, XC, ac, chi, mu, gamma, is_rbf, row, X, state,
                                 esum_member, cos, hi, C)
    if not is_rbf and top >= LOG_MAX:
        return OVERFLOW, esum_valid
    if _outside(gx, kxx, mu):
        return OUTSIDE, esum_valid
    if standby_due or gx < theta:
        return STANDBY, esum_valid
    esum_valid = _store_scored(x, v, X, V, xn2, diag, alpha, g, state, slot_id, KC, soc,
                               esum, esum_member, slot, tid, chi, gx, kxx, esum_valid, es, row)
    return STORED, esum_valid


@njit(cache=True)
def store_row(x, v, X, V, xn2, diag, alpha, g, state, slot_id, KC, soc, cos, esum,
              esum_member, slot, tid, chi, hi, gx, kxx, esum_valid, gamma, is_rbf, row):
    """Store a key already scored (its kernel row in ``row[:chi, 0]``, its g and k(x, x))
    in the free ``slot`` as token ``tid``, in the reserve set (a driven add then
    drives it in); return esum_valid after."""
    _, es, _ = error_share(x, X, state, esum_member, cos, hi, gamma, is_rbf)
    return _store_scored(x, v, X, V, xn2, diag, alpha, g, state, slot_id, KC, soc, esum,
                         esum_member, slot, tid, chi, gx, kxx, esum_valid, es, row)


@njit(cache=True)
def reserve_block(K, Vb, X, V, xn2, diag, alpha, g, state, slot_id, KC, XC, ac, soc, cos,
                  esum, esum_member, slots, tids, chi, hi, mu, C, gamma, is_rbf, esum_valid,
                  row):
    """:func:`reserve_add` of the rows of ``K`` (values ``Vb``: (m, 0) when values are
    the keys) one after another, without the standby test (an ``extend`` refreshes
    the standby columns once, at its end), into ``slots`` as tokens ``tids``, until
    the first row that is not stored. A stored row changes nothing but its own slot,
    so the next row is scored against the same solution: this is repeated
    :func:`reserve_add`.

    Returns ``(stored, status, g, kxx, esum_valid)``: the rows stored; STORED when all
    were, else the status of row ``stored`` (OUTSIDE, OVERFLOW), whose kernel row is
    then left in ``row[:chi, 0]`` and whose g and k(x, x) are returned (the drive that
    adds it stores them as they are); and esum_valid after."""
    for i in range(slots.shape[0]):
        x = K[i]
        gx, kxx, top, es = score_row(x, XC, ac, chi, mu, gamma, is_rbf, row, X, state,
                                     esum_member, cos, hi, C)
        if not is_rbf and top >= LOG_MAX:
            return i, OVERFLOW, gx, kxx, esum_valid
        if _outside(gx, kxx, mu):
            return i, OUTSIDE, gx, kxx, esum_valid
        esum_valid = _store_scored(x, Vb[i], X, V, xn2, diag, alpha, g, state, slot_id, KC,
                                   soc, esum, esum_member, slots[i], tids[i], chi, gx, kxx,
                                   esum_valid, es, row)
    return slots.shape[0], STORED, 0.0, 0.0, esum_valid

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)
