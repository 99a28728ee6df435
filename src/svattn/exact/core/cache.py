"""Numpy primitives on the kernel cache and the bordered inverse, shared by both backends.

These steps are rare or cheap (a margin expansion, a column move, a move of
``mu`` alone), so one numpy version serves the reference and the compiled
backend alike; the backends differ in the hot loops (see ``docs/design.md`` §6).
Each function takes the :class:`~svattn.exact.core.state.SlotState` and edits it in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.core.state import NeedResolve, SlotState, scrub

# The expansion's singularity bound: a token whose Schur complement against the margin set
# is at most this share of its size (:func:`border_size`; the scale in ``compiled.schur``'s
# capacitance joins) does not join it (Q would turn singular; both backends: ``expand``
# here, ``compiled.columns``). Such a token is nearly in the span of the margin keys;
# its weight moves by a flat exchange instead (``operations.copies.exchange_near_span``;
# docs/design.md §3).
SINGULAR_SCHUR = 1e-10
# A token that joins with a Schur complement at most this share of its size
# (:func:`border_size`) borders the inverse ill-conditioned: Q⁻¹'s new row is ~1/s, and
# a later downdate (its near-copy partner leaving) is off inv(Q) by far more than
# rounding (6e-5, the running g 2.2e-7 off the exact g: issue #51). The expansion sets
# ``SlotState.ill_border`` (both backends: ``compiled.columns``), and so does an add or a
# removal that begins on a margin set holding such a border (:func:`ill_margin`); the
# operation's finish then refactorizes and judges an exact g (``solver.finish_op``), as
# it does where the margin set it ends on holds one (a joining token's own complement
# does not bound its partner's against the grown set).
ILL_SCHUR = 1e-4


def border_size(s: SlotState, k: int) -> float:
    """The size against which token ``k``'s Schur complement is judged (the terms
    ``g_k`` is made of): ``min(scale, max(1, K_kk))``. Under a kernel whose diagonal
    varies (``exp``) the scale (the largest diagonal, up to 1e14) hid complements
    of 1e3 beside a token whose own diagonal is 10."""
    return min(s.scale, max(1.0, float(s.diag[k])))


def outside_description(ss: SlotState, diag: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Which scored rows lie outside the description (g below zero beyond a rounding-level
    tie, relative to the terms g is made of, as the KKT residual measures it: a tie
    scaled by the largest diagonal in the memory let an exp-kernel outlier at 1e18 hide
    rows at g = -1)."""
    return g < -1e-13 * np.maximum(2.0 * diag + g - ss.mu + abs(ss.mu), 1.0)


def free_col(s: SlotState, slot: int) -> None:
    """Drop ``slot``'s cache column (zeroed); a margin token's only after contraction."""
    col = int(s.col_of_slot[slot])
    if col < 0:
        return
    assert col >= s.nS, "a margin token's column is freed only after contraction"
    s.KC[:, col] = 0.0
    s.XC[col] = 0.0
    s.slot_of_col[col] = -1
    s.col_of_slot[slot] = -1
    s.ac[col] = 0.0
    while s.chi > 0 and s.slot_of_col[s.chi - 1] < 0:
        s.chi -= 1


def swap_cols(s: SlotState, p: int, q: int) -> None:
    """Exchange two cache columns (contents and bookkeeping)."""
    if p == q:
        return
    hi = s.hi
    # through one scrubbed scratch each: a fancy-indexed copy (``XC[[q, p]]``) would free
    # the two tokens' keys and kernel columns unzeroed (found by a residue scan)
    _swap(s.KC[:hi, p], s.KC[:hi, q])
    _swap(s.XC[p], s.XC[q])
    s.ac[[p, q]] = s.ac[[q, p]]
    soc = s.slot_of_col
    soc[[p, q]] = soc[[q, p]]
    for col in (p, q):
        if soc[col] >= 0:
            s.col_of_slot[soc[col]] = col


def _swap(a: np.ndarray, b: np.ndarray) -> None:
    """Exchange the contents of two disjoint views, the scratch scrubbed."""
    t = a.copy()
    try:
        a[...] = b
        b[...] = t
    finally:
        scrub(t)


def expand(s: SlotState, k: int) -> None:
    """Add token ``k`` (which has a cache column) to the margin set (a border expansion)."""
    nS = s.nS
    col_k = int(s.col_of_slot[k])
    if nS == 0:
        s.Qinv = np.array([[-2.0 * s.diag[k], 1.0], [1.0, 0.0]])
    else:
        u = np.empty(nS + 1)
        u[0] = 1.0
        u[1:] = 2.0 * s.KC[s.slot_of_col[:nS], col_k]
        w = s.Qinv @ u
        schur = 2.0 * s.diag[k] - float(u @ w)
        size = border_size(s, k)
        if schur <= SINGULAR_SCHUR * size:
            # a (near) copy of margin keys: Q would be singular. Neither jitter
            # (another problem) nor skipping (a corrupt inverse): re-solve.
            raise NeedResolve
        if schur <= ILL_SCHUR * size:
            s.ill_border = True
        Qn = np.empty((nS + 2, nS + 2))
        Qn[: nS + 1, : nS + 1] = s.Qinv + np.outer(w, w) / schur
        Qn[: nS + 1, nS + 1] = -w / schur
        Qn[nS + 1, : nS + 1] = -w / schur
        Qn[nS + 1, nS + 1] = 1.0 / schur
        s.Qinv = Qn
    swap_cols(s, col_k, nS)
    s.nS = nS + 1


def ill_margin(s: SlotState) -> bool:
    """Whether the margin set holds a token whose Schur complement against the others
    is at most :data:`ILL_SCHUR` times its :func:`border_size` (a near-copy pair on the
    margin): the bordered inverse's diagonal entry of margin token ``j`` is
    ``1/s_j``, so one pass over it, ``O(|S|)``. The running g drifts with every
    update of such an inverse, not only at the border that made it: an add that
    downdated a margin with a pair ``2 − 2K = 1.5e-10`` apart left it 3.5e-10 off."""
    nS = s.nS
    if nS < 2 or s.Qinv.shape[0] != nS + 1:
        return False
    S = s.slot_of_col[:nS]
    size = np.minimum(s.scale, np.maximum(1.0, s.diag[S]))
    return bool((np.diagonal(s.Qinv)[1:] * size).max() * ILL_SCHUR >= 1.0)


def first_bound(aS: np.ndarray, dS: np.ndarray, C: float) -> tuple[int, float]:
    """How far the margin weights ``aS`` can move along ``dS`` per unit step before one
    reaches 0 or ``C``, capped at ``C`` (the moving bound token's whole box): ``(p, t)``
    with ``p`` the margin column that reaches its bound first, or ``(-1, C)`` where none
    does within the box. A step already at a bound gives ``t = 0``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t_each = np.where(dS < 0, -aS / dS, np.where(dS > 0, (C - aS) / dS, np.inf))
    p = int(np.argmin(t_each)) if len(t_each) else -1
    if p < 0 or not t_each[p] < C:
        return -1, C
    return p, max(float(t_each[p]), 0.0)


def flat_exchange(s: SlotState, v: int, up: bool, gtol: float) -> int | None:
    """Bound token ``v`` (with a cache column) reaches ``g = 0`` on the path and would
    join the margin set: None where its Schur complement ``s`` is above
    :data:`SINGULAR_SCHUR`·``min(scale, max(1, K_vv))`` (the caller expands; where the expansion
    refuses it, it re-solves). The exchange ignores the curvature ``s`` and leaves
    ``g_v`` at ``±s·t`` (``t <= C``): against ``K_vv``, the size of ``g_v``'s terms, not
    the scale (the largest diagonal), or under a kernel whose diagonal varies (``exp``)
    a token with a complement of ~1e3 beside a scale of 7e14 made a far-off state
    (KKT 0.02, the oracle's partition missed). Else ``v`` is nearly in the span
    of the margin keys (``docs/design.md`` §3, near-copies): its weight moves first by
    the flat exchange with that combination — ``α_v`` up (``up``: from the reserve
    set) or down by ``t``, ``(μ, α_S)`` by ``∓t·Q⁻¹u``, the g of every other row by
    ``±t·(2K_iv − 2K_iS w_S − w_μ)`` — as far as the first bound. Returns the margin
    slot that reached its bound (its alpha set there; the caller contracts it, then
    expands ``v``), or -1 where ``v`` reached its other bound first (its alpha set; the
    caller moves it to that set). Raises :class:`NeedResolve` where a bound token's g
    would cross 0 (beyond ``gtol``) on the way: the exchange is not the path there."""
    nS, hi, C = s.nS, s.hi, s.C
    S = s.slot_of_col[:nS]
    col_v = int(s.col_of_slot[v])
    u = np.empty(nS + 1)
    u[0] = 1.0
    u[1:] = 2.0 * s.KC[S, col_v]
    w = s.Qinv @ u
    if 2.0 * s.diag[v] - float(u @ w) > SINGULAR_SCHUR * border_size(s, v):
        return None
    sgn = 1.0 if up else -1.0
    dS = -sgn * w[1:]
    p, t = first_bound(s.alpha[S], dS, C)
    rate = 2.0 * s.KC[:hi, col_v] - 2.0 * (s.KC[:hi, :nS] @ w[1:]) - w[0]
    g_new = s.g[:hi] + (sgn * t) * rate
    st = s.state[:hi]
    cross = ((st == RESERVE) & (g_new < -gtol)) | ((st == ERROR) & (g_new > gtol))
    cross[v] = False
    if cross.any():
        raise NeedResolve
    off = st != MARGIN
    s.g[:hi][off] = g_new[off]
    s.g[v] = 0.0
    s.alpha[S] += t * dS
    s.mu -= sgn * t * float(w[0])
    if p < 0:
        s.alpha[v] = C if up else 0.0
        s.sync_ac()
        return -1
    s.alpha[v] = t if up else C - t
    left = int(S[p])
    s.alpha[left] = C if dS[p] > 0 else 0.0
    s.sync_ac()
    return left


def refactorize(s: SlotState, *, count: bool = True) -> None:
    """Rebuild ``Qinv`` from the cached margin block (``count``: an event worth counting)."""
    nS = s.nS
    if nS == 0:
        s.Qinv = np.zeros((0, 0))
        return
    S = s.slot_of_col[:nS]
    Q = np.zeros((nS + 1, nS + 1))
    Q[0, 1:] = 1.0
    Q[1:, 0] = 1.0
    KSS = s.KC[S, :nS]  # (it and Q hold kernel values: scrubbed)
    try:
        np.add(KSS, KSS.T, out=Q[1:, 1:])
        s.Qinv = np.linalg.inv(Q)
    finally:
        scrub(KSS)
        scrub(Q)
    s.n_refactorizations += int(count)


def mu_move(s: SlotState, c: int, direction: int,
            alloc_col: Callable[[SlotState, int], int]) -> tuple[bool, int]:
    """Empty margin set: only mu moves. Return (drive done, token that joined).

    ``alloc_col`` is the backend's column allocation (a joining token may need its
    column: error tokens keep none).
    """
    hi = s.hi
    st = s.state[:hi]
    g = s.g[:hi]
    if direction > 0:
        errs = np.flatnonzero(st == ERROR)
        t_c = max(-g[c], 0.0)
        t_e, who = math.inf, -1
        if len(errs):
            k = int(np.argmax(g[errs]))
            who, t_e = int(errs[k]), max(-float(g[errs[k]]), 0.0)
        if t_c <= t_e:
            s.mu += t_c
            g += t_c
            g[c] = 0.0
            if s.alpha[c] > 0:
                s.state[c] = MARGIN
                expand(s, c)
            else:
                s.state[c] = RESERVE
                free_col(s, c)
            return True, c
        s.mu += t_e
        g += t_e
    else:
        res = np.flatnonzero(st == RESERVE)
        if len(res) == 0:
            raise NeedResolve
        k = int(np.argmin(g[res]))
        who, t = int(res[k]), max(float(g[res[k]]), 0.0)
        s.mu -= t
        g -= t
    if s.col_of_slot[who] < 0:  # a reserve token, or an error token (they keep none)
        alloc_col(s, who)
    g[who] = 0.0
    s.state[who] = MARGIN
    expand(s, who)
    return False, who


def adopt_rows(ss: SlotState, live: np.ndarray, slots: np.ndarray, rows: np.ndarray,
               pos: np.ndarray, m: int) -> bool:
    """Make a batch solve's kernel columns the memory's (empty) cache where their buffer
    has its shape: every slot live in order (``live`` is ``0..hi-1``, the slot table
    no wider) and room for the columns needed. Its rows (``rows[pos[j]] =
    K[:, slots[j]]``, C order: the Fortran-ordered cache transposed; ``m`` rows in use)
    are permuted in place into ``slots``' order and the rest zeroed, and the buffer is
    the cache from then on (the caller hands it over). A fit then keeps one n×|S|
    array, not two, and copies none (a second array's first writes were ~20 % of a 4k
    fit). The values are :func:`write_columns`' exactly. Returns False, changing
    nothing, where the shapes do not allow it."""
    na, hi = len(slots), ss.hi
    if (rows.ndim != 2 or rows.shape[1] != ss.cap or ss.cap != hi or len(live) != hi
            or not np.array_equal(live, np.arange(hi))
            or rows.shape[0] < na + ss.standby or not rows.flags.c_contiguous):
        return False
    permute_rows(rows, pos, m)
    ss.adopt_cols(rows.T)
    index_columns(ss, slots)
    return True


def permute_rows(rows: np.ndarray, pos: np.ndarray, m: int) -> None:
    """``rows[j] <- rows[pos[j]]`` for ``j < len(pos)`` (distinct positions below
    ``m``) in place, one row of scratch (scrubbed); rows ``len(pos)..m-1`` zeroed."""
    na = len(pos)
    src = np.empty(m, dtype=np.int64)  # target j takes the row at src[j]
    src[:na] = pos
    taken = np.zeros(m, dtype=bool)
    taken[pos] = True
    src[na:] = np.flatnonzero(~taken)
    done = src == np.arange(m)
    tmp = np.empty(rows.shape[1])
    try:
        for start in np.flatnonzero(~done).tolist():
            if done[start]:
                continue
            tmp[:] = rows[start]
            j = start
            while True:  # one cycle of the permutation
                done[j] = True
                s = int(src[j])
                if s == start:
                    rows[j] = tmp
                    break
                rows[j] = rows[s]
                j = s
    finally:
        tmp.fill(0.0)
    rows[na:m] = 0.0


def write_columns(ss: SlotState, live: np.ndarray, slots: np.ndarray, rows: np.ndarray,
                  pos: np.ndarray) -> None:
    """Fill the empty kernel cache (``chi = 0``) with the columns of ``slots``, in order,
    from ``rows`` (``rows[pos[j], i] = k(x_live[i], x_slots[j])``): what
    :func:`svattn.exact.backends.reference.alloc_col` computes for each, written at once (one
    column at a time: no temporary copy of the block)."""
    na, hi = len(slots), ss.hi
    KC = ss.KC
    dense = len(live) == hi and np.array_equal(live, np.arange(hi))
    if not dense:
        KC[:hi, :na] = 0.0
    for j in range(na):
        if dense:
            KC[:hi, j] = rows[pos[j]]
        else:
            KC[live, j] = rows[pos[j]]
    index_columns(ss, slots)


def index_columns(ss: SlotState, slots: np.ndarray) -> None:
    """The cache's first ``len(slots)`` columns, their kernel values in place, become
    ``slots``' columns: each token's own entry (its diagonal), the cached keys and
    alphas and both maps between slots and columns."""
    na = len(slots)
    take_rows(ss.X[: ss.hi], slots, ss.XC[:na])  # (slots past hi: none live)
    ss.KC[slots, np.arange(na)] = ss.diag[slots]
    ss.slot_of_col[:na] = slots
    ss.col_of_slot[slots] = np.arange(na)
    ss.ac[:na] = ss.alpha[slots]
    ss.chi = na


def take_rows(src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = src[rows]`` with no temporary copy of the rows: ``np.take`` in
    ``mode="clip"`` writes straight into ``out``, where its default ``"raise"`` fills a
    buffered copy of ``out`` and frees it unzeroed (a copy of every key taken, left in
    freed memory after the token's removal). "clip" would clamp an index out of range,
    a negative one included, to a wrong row without a word: each is refused first.

    Raises
    ------
    IndexError
        An index below 0 or past ``src``'s rows (nothing written).
    """
    if len(rows) and not 0 <= int(rows.min()) <= int(rows.max()) < src.shape[0]:
        raise IndexError(f"rows {int(rows.min())}..{int(rows.max())} out of range for "
                         f"{src.shape[0]} rows")
    np.take(src, rows, axis=0, out=out, mode="clip")


__all__ = ["ILL_SCHUR", "SINGULAR_SCHUR", "adopt_rows", "border_size", "expand", "first_bound",
           "flat_exchange", "free_col", "ill_margin", "index_columns", "mu_move", "permute_rows",
           "refactorize", "swap_cols", "take_rows", "write_columns"]
