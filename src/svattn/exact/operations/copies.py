"""Copies of a key share one coefficient budget (``docs/design.md``, "Copies").

Keys the kernel cannot tell apart (``K_ii + K_jj − 2 K_ij <= 1e-13 (K_ii + K_jj)``; rbf:
``K_ij >= 1 − 1e-13``) have the same column of ``K`` and the same ``g``, so the SVDD dual
fixes only the sum of their coefficients: every split of a group's weight within the
bounds is an optimum. The memory keeps at most one member of a group free (the margin
set then stays positive definite) and the others at a bound: the batch paths spread a
group's weight in id order, the first members at ``C``, one remainder, the rest 0
(:func:`spread`; :func:`svattn.exact.operations.batch.spread_copies`,
:func:`svattn.exact.operations.solver.resolve_by_gram`).

Removing one of several copies then needs no solve when the others have room for its
weight (:func:`give_to_copies`): the group's sum, hence every ``g``, ``mu`` and the
decision function, is unchanged, and the weight is spread again over the members left.

Near-copies pass the same test yet are not interchangeable: the kernel distance is
quadratic in ``‖x − y‖``, ``g_x − g_y`` linear in it (keys 1e-7 apart, gamma 0.5:
``2 − 2K ≈ 1e-14``, g apart by ~6e-8 ≫ tol). Exchanging weight between two members moves
the objective at the rate ``g_x − g_y`` with a curvature ``~2(2 − 2K)`` too small to
stop it inside the box, so at the optimum of the unmerged problem a group still holds
one free member at most, and which member sits where is fixed by each member's own
``g``: lowest ``g`` at ``C`` (``g <= 0``), the free one, highest at 0 (``g >= 0``). So
every split orders the members by their own ``g`` (:func:`split_order`; id order where
the group's ``g`` agree to rounding, as exact copies' do), and after a re-solve
:func:`split_by_own_g` moves the groups whose split disagrees with their ``g``; the
caller's polish then solves the margin system on the members' own columns.
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.protocol import Backend
from svattn.exact.core.cache import (
    SINGULAR_SCHUR,
    border_size,
    expand,
    first_bound,
    free_col,
)
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.core.kktsets import DRIVEN, ERROR, MARGIN, RESERVE
from svattn.exact.core.state import SlotState, scrub

# a pair is a copy when its kernel distance is at most this share of K_ii + K_jj
COPY_SHARE = 1e-13


def spread(weight: float, m: int, C: float) -> np.ndarray:
    """A group's ``weight`` over ``m`` members in order: ``C`` each while at least ``C``
    is left, then the remainder, then 0 (one free member at most).

    Examples
    --------
    >>> spread(2.5, 4, 1.0).tolist()
    [1.0, 1.0, 0.5, 0.0]
    """
    out = np.zeros(m)
    for i in range(m):
        if weight <= COPY_SHARE * C:
            break
        out[i] = C if weight >= C * (1 - COPY_SHARE) else weight
        weight -= out[i]
    return out


def split_order(ids: np.ndarray, g: np.ndarray, tie: float) -> np.ndarray:
    """Order of a group's members for :func:`spread`: ascending own ``g`` (the first
    go to ``C``, where ``g <= 0`` holds), id order among ties; id order throughout where
    the group's ``g`` agree to within ``tie`` (exact copies: any split is optimal).

    Examples
    --------
    >>> import numpy as np
    >>> split_order(np.array([3, 5, 7]), np.array([2e-8, -6e-8, 2e-8]), 1e-12).tolist()
    [1, 0, 2]
    >>> split_order(np.array([3, 5]), np.array([1e-15, 0.0]), 1e-12).tolist()
    [0, 1]
    """
    if not len(g) or float(g.max() - g.min()) <= tie:
        return np.argsort(ids, kind="stable")
    return np.lexsort((ids, g))


def kernel_copies(ss: SlotState, slot: int) -> np.ndarray:
    """The live slots other than ``slot`` whose keys the kernel cannot tell from
    ``slot``'s, in id order: one pass over ``slot``'s cache column (or its kernel row)."""
    live = ss.live_slots()
    col = int(ss.col_of_slot[slot])
    if col >= 0:
        kv = ss.KC[live, col]
    else:
        keys = ss.X[live]  # (a copy of keys: scrubbed)
        try:
            kv = kernel_matrix(ss.X[slot][None, :], keys, ss.kernel, ss.gamma_value)[0]
        finally:
            scrub(keys)
    dd = ss.diag[live] + ss.diag[slot]
    sib = live[(dd - 2.0 * kv <= COPY_SHARE * dd) & (live != slot)]
    return sib[np.argsort(ss.slot_id[sib], kind="stable")]


def give_to_copies(ss: SlotState, be: Backend, slot: int) -> int | None:
    """Hand support token ``slot``'s weight to its copies, when they have room for it:
    the group's weight is spread again over the members left (:func:`spread`, id
    order), so nothing else moves, and ``slot`` is left out of every set (DRIVEN, for
    the caller to wipe). Returns the tokens that changed set (with ``slot``'s exit),
    or None, changing nothing, where ``slot`` has no copy with room (the caller then
    removes it along the solution path). The caller's finish re-solves the margin
    system on the new partition and checks the KKT conditions on an exact ``g``."""
    a = float(ss.alpha[slot])
    if a <= 0.0:
        return None
    sib = kernel_copies(ss, slot)
    if not len(sib) or float(np.sum(ss.C - ss.alpha[sib])) < a * (1 - COPY_SHARE):
        return None
    new = np.empty(len(sib))  # (the members' g: the drives' running values suffice)
    new[split_order(ss.slot_id[sib], ss.g[sib], _tie(ss, sib))] = spread(
        a + float(ss.alpha[sib].sum()), len(sib), ss.C)
    _leave_margin(ss, be, np.concatenate([[slot], sib]))
    ss.state[slot] = DRIVEN  # (the caller wipes it)
    return 1 + _assign(ss, be, sib, new)


# ``g`` differences (units of the group's size, :func:`g_size`) below which a group's
# split is immaterial: rounding (~450 ulps). Exact copies' g agree to the last bits;
# near-copies' differ by 1e-13 to 1e-11 under a wide kernel, under tol, and the split
# they fix matters there (0.01·tol before: two keys 3e-6 apart, their g 9.8e-13 apart,
# split in id order).
SPLIT_TIE = 1e-13


def g_size(ss: SlotState, slots: np.ndarray) -> np.ndarray:
    """The size of each of ``slots``' g (the terms it is made of), as the expansion
    judges a Schur complement (:func:`~svattn.exact.core.cache.border_size`):
    ``min(scale, max(1, K_ii))``. Under a kernel whose diagonal varies (``exp``, scale
    1e14) the scale made a tie of 10 and a violating floor of 10 (relative 1e-13): a
    group of near-copies whose g differ by 1e-7 was split in id order."""
    return np.minimum(ss.scale, np.maximum(1.0, ss.diag[slots]))


def _tie(ss: SlotState, members: np.ndarray) -> float:
    """``g`` differences below which a group's split is immaterial (:data:`SPLIT_TIE`
    times its largest :func:`g_size`)."""
    return SPLIT_TIE * float(g_size(ss, members).max(initial=1.0))


def _leave_margin(ss: SlotState, be: Backend, group: np.ndarray) -> None:
    """Every member of ``group`` on the margin leaves it (descending columns: a
    contraction moves only the last margin column), so a new free member joins a
    margin set that holds none of its copies."""
    on_margin = group[(ss.state[group] == MARGIN) & (ss.col_of_slot[group] < ss.nS)]
    for s in sorted(on_margin.tolist(), key=lambda t: -int(ss.col_of_slot[t])):
        be.contract(ss, int(ss.col_of_slot[s]))
        ss.state[s] = ERROR if ss.alpha[s] > 0.5 * ss.C else RESERVE


def _assign(ss: SlotState, be: Backend, members: np.ndarray, new: np.ndarray) -> int:
    """Give ``members`` (none on the margin) the coefficients ``new`` and the sets they
    imply, the free one joining the margin; return how many changed set."""
    changed = 0
    for s, w in zip(members.tolist(), new.tolist(), strict=True):
        st = ERROR if w >= ss.C else (RESERVE if w <= 0.0 else MARGIN)
        changed += int(ss.state[s] != st)
        ss.alpha[s] = w
        ss.state[s] = st
        if st == RESERVE:
            free_col(ss, s)
            continue
        if ss.col_of_slot[s] < 0:
            be.alloc_col(ss, s)
        if st == MARGIN:
            ss.g[s] = 0.0
            expand(ss, s)
    ss.sync_ac()
    ss.standby_stale = True
    return changed


def margin_copy_groups(ss: SlotState) -> list[np.ndarray]:
    """The groups of copies (:data:`COPY_SHARE`) that hold a margin token, each as its
    live slots: one pass over the margin block of the cache. A group without a free
    member has every member at ``C`` or at 0 (its split is then the only one)."""
    live = ss.live_slots()
    if not ss.nS or len(live) < 2:
        return []
    dl = ss.diag[live]
    seen = np.zeros(ss.hi, dtype=bool)
    groups = []
    step = max(1, (1 << 20) // len(live))  # (temporaries of ~1M entries)
    for b in range(0, ss.nS, step):
        S = ss.slot_of_col[b: min(ss.nS, b + step)]
        dd = dl[:, None] + ss.diag[S][None, :]
        hit = dd - 2.0 * ss.KC[live, b: b + len(S)] <= COPY_SHARE * dd
        for j in np.flatnonzero(np.count_nonzero(hit, axis=0) > 1).tolist():
            members = live[hit[:, j] & ~seen[live]]
            seen[members] = True
            if len(members) > 1:
                groups.append(members)
    return groups


def split_by_own_g(ss: SlotState, be: Backend) -> bool:
    """Re-split every group of copies holding a margin token in the order of its
    members' own ``g`` (:func:`split_order`; ``ss.g`` exact): where a member at ``C``
    has a larger ``g`` than one below ``C``, or one above 0 than one at 0, the group's
    weight is spread again. True when a group changed (the caller then polishes: the
    new free member's column is not the old one's, by ``O(‖x − y‖)``). Where no group
    moved, a bound token nearly in the span of the margin keys on the wrong side makes
    its flat exchange (:func:`exchange_near_span`): a copy of a margin combination."""
    changed = False
    for members in margin_copy_groups(ss):
        changed |= _resplit(ss, be, members)
    return changed or exchange_near_span(ss, be, EXCHANGE_FLOOR)


def violating_copies(ss: SlotState, floor: float) -> list[np.ndarray]:
    """The groups of copies in which a token at a bound violates its condition by more
    than ``floor`` (relative: times its :func:`g_size`; ``ss.g``) while a copy of it is on
    the margin, each as
    its live slots: ``O(nS)`` per violating token (its row of the margin block) and one
    pass over a column per group found.

    The drives let no copy of a margin token (nor, on an add, of the driven token) join
    the margin, since in exact arithmetic its g is its sibling's; a near-copy's own g,
    ~1e-11 off its sibling's, then crosses 0 unseen and leaves the split out of order
    under ``tol`` (two keys 6.7e-9 apart, rows 6e-11 apart: a multiplier of 2e-11 with
    the wrong sign, 4.9e-12 below the optimum's dual objective)."""
    if not ss.nS:
        return []
    hi = ss.hi
    st, g = ss.state[:hi], ss.g[:hi]
    fl = floor * g_size(ss, np.arange(hi))
    bad = np.flatnonzero(((st == RESERVE) & (g < -fl)) | ((st == ERROR) & (g > fl)))
    S = ss.slot_of_col[: ss.nS]
    seen = np.zeros(hi, dtype=bool)
    groups = []
    for v in bad.tolist():
        if seen[v]:
            continue
        dd = ss.diag[S] + ss.diag[v]
        on_margin = S[dd - 2.0 * ss.KC[v, : ss.nS] <= COPY_SHARE * dd]
        if len(on_margin):
            head = int(on_margin[0])
            members = np.concatenate([[head], kernel_copies(ss, head)])
            seen[members] = True
            groups.append(members)
    return groups


def split_violating_copies(ss: SlotState, be: Backend, floor: float) -> bool:
    """Re-split the groups :func:`violating_copies` finds in the order of their members'
    own ``g`` (``ss.g``, which must be exact: a drive's running g on an ill-conditioned
    margin block is off by more than the offsets that order near-copies). True when a
    group changed (the caller then polishes on an exact g)."""
    changed = False
    for members in violating_copies(ss, floor):
        changed |= _resplit(ss, be, members)
    return changed


def resplit_violating(ss: SlotState, be: Backend, kkt: float, floor: float) -> bool:
    """After an operation whose KKT residual ``kkt`` (relative) is above ``floor``:
    :func:`split_violating_copies` at ``floor`` (relative), on an exact g (recomputed first
    where ``ss.g`` is a drive's running g and the running g shows such a group), then
    :func:`exchange_near_span` (a bound token the expansion refuses, on the wrong side).
    True when a group changed (the caller then polishes on an exact g)."""
    if not (kkt > floor and (violating_copies(ss, floor)
                             or near_span_violators(ss, floor))):
        return False
    if not ss.g_valid:
        ss.g[: ss.hi] = be.g_exact(ss)
        ss.g_valid = True
    return (split_violating_copies(ss, be, floor)
            or exchange_near_span(ss, be, floor))


# Where a bound token's Schur complement against the margin set is at most
# ``SINGULAR_SCHUR·size`` the expansion refuses it (Q would turn singular): the token is
# nearly in the span of the margin keys, and the move that lets it in is a flat exchange
# with that combination (:func:`exchange_near_span`). At most this many per call, each
# for a bound token violating its condition by more than EXCHANGE_FLOOR (relative, as
# the KKT residual; rounding: ``solver.ROUNDING_KKT``).
NEAR_SPAN_EXCHANGES = 16
EXCHANGE_FLOOR = 1e-13


def near_span_violators(ss: SlotState, floor: float) -> list[tuple[int, np.ndarray, float]]:
    """The bound tokens that violate their condition by more than ``floor`` (relative,
    ``ss.g``) and that the expansion refuses (Schur complement ``s`` against the margin
    set at most :data:`~svattn.exact.core.cache.SINGULAR_SCHUR`·size), worst first, at
    most :data:`NEAR_SPAN_EXCHANGES`: each as ``(slot, Q⁻¹u, s)`` with
    ``u = (1, 2K_Sv)``. ``O(nS²)`` per violator."""
    nS, hi = ss.nS, ss.hi
    if not nS:
        return []
    st, g, d = ss.state[:hi], ss.g[:hi], ss.diag[:hi]
    size = np.maximum(2.0 * d + g - ss.mu + abs(ss.mu), 1.0)
    viol = np.where(st == RESERVE, -g, np.where(st == ERROR, g, -np.inf)) / size
    bad = np.flatnonzero(viol > floor)
    out = []
    for v in bad[np.argsort(-viol[bad], kind="stable")][:NEAR_SPAN_EXCHANGES].tolist():
        u = np.empty(nS + 1)
        u[0] = 1.0
        u[1:] = 2.0 * ss.KC[v, :nS]
        w = ss.Qinv @ u
        schur = 2.0 * float(d[v]) - float(u @ w)
        if schur <= SINGULAR_SCHUR * border_size(ss, v):
            out.append((v, w, schur))
    return out


def exchange_near_span(ss: SlotState, be: Backend, floor: float) -> bool:
    """The flat exchanges of bound tokens the expansion refuses (``docs/design.md`` §3,
    "Near-copies between the copy test and the singularity bound"); ``ss.g`` exact.

    A reserve token with ``g < 0`` or an error token with ``g > 0`` beyond ``floor``
    whose Schur complement ``s = 2K_vv − uᵀQ⁻¹u`` against the margin set is at most
    :data:`~svattn.exact.core.cache.SINGULAR_SCHUR`·size cannot join the margin: its
    key is within ``√s`` of the affine span of the margin keys, a copy of a combination
    of them to the expansion. Its weight moves along the direction that keeps every
    margin g at 0 and Σα = 1 — ``α_v += t``, ``(μ, α_S) −= t·Q⁻¹u`` — on which the
    objective falls at the rate ``|g_v|`` with curvature ``s`` only, as far as the first
    bound: that margin token (the near-copy v exchanged weight with) leaves the margin
    and v joins it, or v reaches its other bound. Where ``g_v`` would reach 0 first
    (``|g_v| < s·t``, at most ``SINGULAR_SCHUR·size·C``) v stays. After each exchange
    the margin system is solved and g recomputed; at most :data:`NEAR_SPAN_EXCHANGES`.
    True when one was made (the caller polishes)."""
    made = False
    for _ in range(NEAR_SPAN_EXCHANGES):
        if not any(_exchange(ss, be, v, w, s) for v, w, s in near_span_violators(ss, floor)):
            return made
        made = True
        be.solve_margin(ss)
        ss.g[: ss.hi] = be.g_exact(ss)
        ss.g_valid = True
    return made


def _exchange(ss: SlotState, be: Backend, v: int, w: np.ndarray, schur: float) -> bool:
    """One flat exchange of bound token ``v`` (``w = Q⁻¹u``, ``schur`` its complement;
    :func:`exchange_near_span`); False where it has no room or ``g_v`` meets 0 first."""
    S = ss.slot_of_col[: ss.nS]
    up = ss.state[v] == RESERVE  # alpha_v grows (g_v < 0) or falls (g_v > 0)
    dS = -w[1:] if up else w[1:]
    p, t = first_bound(ss.alpha[S], dS, ss.C)
    if not t > 0.0 or (schur > 0.0 and abs(float(ss.g[v])) < schur * t):
        return False
    ss.alpha[S] += t * dS
    ss.mu -= (t if up else -t) * float(w[0])
    if p >= 0:  # the margin token p reached its bound: it leaves, v joins
        slot = int(S[p])
        at_c = bool(dS[p] > 0)
        ss.alpha[slot] = ss.C if at_c else 0.0
        be.contract(ss, p)
        ss.state[slot] = ERROR if at_c else RESERVE
        if not at_c:
            free_col(ss, slot)
        ss.alpha[v] = t if up else ss.C - t
        ss.state[v] = MARGIN
        if ss.col_of_slot[v] < 0:
            be.alloc_col(ss, v)
        ss.g[v] = 0.0
        expand(ss, v)
    else:  # v crossed its box: the other bound
        ss.alpha[v] = ss.C if up else 0.0
        ss.state[v] = ERROR if up else RESERVE
        if not up:
            free_col(ss, v)
    ss.sync_ac()
    ss.standby_stale = True
    return True


def _resplit(ss: SlotState, be: Backend, members: np.ndarray) -> bool:
    """Spread ``members``' weight again in the order of their own ``g``; True when a
    member changed set."""
    new = np.empty(len(members))
    new[split_order(ss.slot_id[members], ss.g[members], _tie(ss, members))] = spread(
        float(ss.alpha[members].sum()), len(members), ss.C)
    now = np.where(ss.alpha[members] >= ss.C, 2, ss.alpha[members] > 0.0)
    if np.array_equal(now, np.where(new >= ss.C, 2, new > 0.0)):
        return False  # the same members at C, free and at 0: the polish keeps it
    _leave_margin(ss, be, members)
    _assign(ss, be, members, new)
    return True


__all__ = ["COPY_SHARE", "EXCHANGE_FLOOR", "NEAR_SPAN_EXCHANGES", "SPLIT_TIE",
           "exchange_near_span", "g_size", "give_to_copies", "kernel_copies", "margin_copy_groups",
           "near_span_violators", "resplit_violating", "split_by_own_g", "split_order",
           "split_violating_copies", "spread", "violating_copies"]
