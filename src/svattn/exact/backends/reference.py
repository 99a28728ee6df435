"""The numpy reference backend of the exact solver: obviously-correct, one array call per step.

Every function here has a namesake in :mod:`svattn.exact.backends.compiled` that takes the
same :class:`~svattn.exact.core.state.SlotState` and leaves it in the same state, up to
summation order (BLAS against loops): ``tests/exact/test_backends.py`` runs both
side by side. A memory picks one at construction (``SVDDMemory(backend=...)``).
The algorithm that calls them is :mod:`svattn.exact.operations.solver`; ``docs/design.md``
§1-2 has the math.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from svattn.exact.core.cache import (
    expand,
    flat_exchange,
    free_col,
    mu_move,
    outside_description,
    swap_cols,
)
from svattn.exact.core.kernels import (
    KernelOverflowError,
    gram_matrix,
    kernel_diag,
    kernel_matrix,
    sq_distances,
)
from svattn.exact.core.kktsets import DRIVEN, ERROR, FREE, MARGIN, RESERVE
from svattn.exact.core.outcome import RemovalOutcome
from svattn.exact.core.state import NeedResolve, SlotState, scrub

NAME = "reference"

# per state: the sign that turns g into a KKT violation (margin handled apart)
_KKT_SIGN = np.array([0.0, -1.0, 0.0, 1.0, 0.0])


# ---------------------------------------------------------------- cache columns
def alloc_col(ss: SlotState, slot: int) -> int:
    """Cache the kernel column of ``slot`` over every used slot (outside the margin
    block): in a hole, past the used columns, in place of a standby column, or in
    a grown cache. Returns the column."""
    holes = np.flatnonzero(ss.slot_of_col[ss.nS : ss.chi] < 0)
    soc = ss.slot_of_col[ss.nS : ss.chi]
    standby = np.flatnonzero((soc >= 0) & (ss.state[soc] == RESERVE))
    if len(holes):
        col = ss.nS + int(holes[0])
    elif ss.chi < ss.ccap or not len(standby):
        if ss.chi == ss.ccap:
            ss.grow_cols()
        col = ss.chi
        ss.chi += 1
    else:
        col = ss.nS + int(standby[0])
        ss.col_of_slot[ss.slot_of_col[col]] = -1
    kernel_column_into(ss, slot, ss.KC[: ss.hi, col])  # a contiguous view: in place
    ss.XC[col] = ss.X[slot]
    ss.slot_of_col[col] = slot
    ss.col_of_slot[slot] = col
    ss.ac[col] = ss.alpha[slot]
    return col


def kernel_column_into(ss: SlotState, slot: int, column: np.ndarray) -> None:
    """``column[:hi] = K[:hi, slot]`` as a cached column holds it (its own entry the
    diagonal); the temporary of the distances is scrubbed."""
    x = ss.X[slot]
    hi = ss.hi
    if ss.is_rbf:  # from differences, never ‖x‖² + ‖y‖² − 2x·y (docs/design.md §1)
        d2 = sq_distances(ss.X[:hi], x[None, :])
        column[:] = d2[:, 0]
        scrub(d2)
        column *= -ss.gamma_value
    else:
        column[:] = ss.X[:hi] @ x
        column *= ss.gamma_value
    np.exp(column, out=column)
    column[slot] = ss.diag[slot]


def sync_error_sum(ss: SlotState) -> None:
    """Bring the error sum (per slot: the sum of the error tokens' kernel values) up to
    the error set: a departed member's column subtracted, a new error token's added —
    computed afresh, then scrubbed, for a token without a cache column (every error
    token between operations); summed afresh where it is not valid."""
    hi = ss.hi
    st = ss.state[:hi]
    member = ss.esum_member[:hi]
    esum = ss.esum[:hi]
    tmp = np.zeros(hi)
    try:
        if ss.error_sum_rebuild_due:
            esum[:] = 0.0
            member[:] = False
            ss.esum_updates = 0
        for s in np.flatnonzero(member & (st != ERROR)).tolist():
            _add_column(ss, s, -1.0, tmp)
            member[s] = False
        for s in np.flatnonzero(~member & (st == ERROR)).tolist():
            _add_column(ss, s, 1.0, tmp)
            member[s] = True
    finally:
        scrub(tmp)
    ss.esum_valid = True


def _add_column(ss: SlotState, s: int, sign: float, tmp: np.ndarray) -> None:
    """``esum += sign · K[:, s]``: its cached column, or one computed into ``tmp``."""
    col = int(ss.col_of_slot[s])
    if col >= 0:
        ss.esum[: ss.hi] += sign * ss.KC[: ss.hi, col]
    else:
        kernel_column_into(ss, s, tmp)
        ss.esum[: ss.hi] += sign * tmp
    ss.esum_updates += 1


def settle_error_columns(ss: SlotState) -> None:
    """:func:`svattn.exact.backends.compiled.settle_error_columns` in numpy: the error sum
    synced, every error token's column freed, the used columns without holes, the
    cache shrunk where mostly empty."""
    if ss.dim is None or ss.warm or ss.n == 0:
        return
    sync_error_sum(ss)
    for col in range(ss.nS, ss.chi):
        s = int(ss.slot_of_col[col])
        if s >= 0 and ss.state[s] == ERROR and ss.esum_member[s]:
            free_col(ss, s)
    dst = ss.nS
    for col in range(ss.nS, ss.chi):
        if ss.slot_of_col[col] >= 0:
            if col != dst:
                swap_cols(ss, dst, col)
                ss.KC[:, col] = 0.0
            dst += 1
    ss.chi = dst
    ss.shrink_cols()


def nearest_reserve(ss: SlotState, m: int) -> np.ndarray:
    """The ``m`` reserve slots with the smallest g, ascending (ties: lower slot first)."""
    reserve = np.flatnonzero(ss.state[: ss.hi] == RESERVE)
    return reserve[np.argsort(ss.g[reserve], kind="stable")[:m]]


def ready_for_removals(ss: SlotState) -> None:
    """Nothing: this backend keeps nothing between operations (see the protocol)."""


def refresh_standby(ss: SlotState) -> None:
    """Cache the kernel columns of the ``standby`` reserve tokens nearest the
    boundary (smallest g) and free those of other reserve tokens.

    A removal brings reserve tokens into the margin set, and each needs its
    kernel column: one pass over every key, the largest single cost of a
    removal at n = 4k. The tokens that enter are almost always among the
    nearest few (at 16, nine in ten of the entries in ``bench_exact``'s
    redundant stream), so keeping their columns moves that pass from the
    removal to the adds before it. Columns are exact kernel values like every
    other cached column; a removed token's row is wiped from them as from the
    rest, and eviction (:func:`alloc_col`) only ever drops a standby column.
    """
    ss.standby_stale = False
    # g as the operations left it (accurate to rounding; a choice of columns
    # needs no exact g). Hysteresis: the columns of the next k nearest stay
    # (ranks near the k-th swap after most operations).
    k = ss.standby
    near = nearest_reserve(ss, 2 * k)
    pick = near[:k]
    ss.standby_theta = float(ss.g[pick[-1]]) if len(near) > k else math.inf
    for col in range(ss.nS, ss.chi):
        s = int(ss.slot_of_col[col])
        if s >= 0 and ss.state[s] == RESERVE and s not in near:
            free_col(ss, s)
    for s in pick.tolist():
        if ss.col_of_slot[s] < 0:
            if ss.chi == ss.ccap and (ss.slot_of_col[ss.nS : ss.chi] >= 0).all():
                ss.grow_cols()  # never evict a pick
            alloc_col(ss, s)


def wipe_slot_arrays(ss: SlotState, slot: int) -> int:
    """Overwrite every array entry derived from ``slot``'s token (its column leaves the
    error sum while it exists). Returns +1 when the sum was updated, -1 when it
    must be rebuilt, 0 when the token was not in it."""
    change = 0
    if ss.esum_member[slot]:
        col = int(ss.col_of_slot[slot])
        if col >= 0 and ss.esum_valid:
            ss.esum[: ss.hi] -= ss.KC[: ss.hi, col]
            change = 1
        else:
            change = -1
        ss.esum_member[slot] = False
    free_col(ss, slot)
    for a in (ss.X, ss.V, ss.KC, ss.xn2, ss.diag, ss.alpha, ss.g, ss.esum):
        a[slot] = 0.0
    ss.state[slot] = FREE
    return change


# ------------------------------------------------------------ bordered system
def contract(ss: SlotState, p: int) -> None:
    """Remove the margin token in column ``p`` from the margin set (keeps its column)."""
    last = ss.nS - 1
    if last == 0:
        ss.nS = 0
        ss.Qinv = np.zeros((0, 0))
        return
    Q = ss.Qinv
    if p != last:  # move it to the end of the block, permuting Qinv alike
        swap_cols(ss, p, last)
        perm = np.arange(last + 2)
        perm[[p + 1, last + 1]] = perm[[last + 1, p + 1]]
        Q = Q[np.ix_(perm, perm)]  # a copy (the memory's own Qinv is the caller's)
    piv = Q[last + 1, last + 1]
    outer = np.outer(Q[: last + 1, last + 1], Q[last + 1, : last + 1])
    outer /= piv
    new = Q[: last + 1, : last + 1] - outer
    scrub(outer)  # temporaries holding the leaving token's row: freed zeroed
    if Q is not ss.Qinv:
        scrub(Q)
    ss.Qinv = new
    ss.nS = last


def solve_margin(ss: SlotState) -> int | None:
    """Solve alpha_S, mu on the partition (error tokens at C). Returns how many margin
    coefficients sit on a bound, or None when not counted (the caller checks)."""
    nS = ss.nS
    E = ss.slots_in({ERROR})  # (most keep no column: their share is the error sum)
    ss.alpha[E] = ss.C
    if nS:
        S = ss.slot_of_col[:nS]
        rhs = np.empty(nS + 1)
        rhs[0] = 1.0 - ss.C * len(E)
        # the error tokens' share at the margin rows, K[S, E] summed: read off the
        # margin columns' error rows (K is symmetric), not the kept error sum
        KE, KSS = ss.KC[E, :nS], ss.KC[S, :nS]  # (copies of kernel values: scrubbed)
        try:
            rhs[1:] = ss.diag[S] - 2.0 * ss.C * KE.sum(axis=0)
            x = ss.Qinv @ rhs
            for _ in range(2):  # iterative refinement
                res = rhs.copy()
                res[0] -= x[1:].sum()
                res[1:] -= x[0] + 2.0 * (KSS @ x[1:])
                x += ss.Qinv @ res
        finally:
            scrub(KE)
            scrub(KSS)
        ss.mu = float(x[0])
        ss.alpha[S] = x[1:]
    ss.sync_ac()
    return None


def margin_gram(ss: SlotState) -> np.ndarray:
    """``K_SS`` in margin order (a gather from the cache's margin rows)."""
    return np.ascontiguousarray(ss.KC[ss.slot_of_col[: ss.nS], : ss.nS])


def margin_health(ss: SlotState, KSS: np.ndarray) -> tuple[float, float]:
    """``(cond1, inverse residual)`` of ``Qinv`` given ``K_SS``: the 1-norm condition
    estimate ``‖Q‖₁ ‖Qinv‖₁`` and ``‖Q (Qinv v) − v‖∞ / ‖v‖∞`` for a fixed probe."""
    nS, Qinv = ss.nS, ss.Qinv
    norm_q = max(float(nS), 1.0 + 2.0 * float(np.abs(KSS).sum(axis=0).max()))
    norm_qinv = float(np.abs(Qinv).sum(axis=0).max())
    v = np.cos(0.7 * np.arange(nS + 1)) + 0.5
    w = Qinv @ v
    r = np.empty(nS + 1)
    r[0] = w[1:].sum() - v[0]
    r[1:] = w[0] + 2.0 * (KSS @ w[1:]) - v[1:]
    return norm_q * norm_qinv, float(np.max(np.abs(r)) / np.max(np.abs(v)))


# ------------------------------------------------------------------- checks
def g_exact(ss: SlotState) -> np.ndarray:
    """g over all used slots (not the drive's running updates), reading the state only:
    every cached column by its alpha, and the error tokens (at C; most keep no column)
    by their kernel columns — the cached one, else computed from the keys — never by
    the kept error sum that the compiled g reads (``O(n·|E|·d)``: the reference)."""
    hi, chi = ss.hi, ss.chi
    w = ss.ac[:chi].copy()
    soc = ss.slot_of_col[:chi]
    owned = soc >= 0
    w[owned & (ss.state[np.where(owned, soc, 0)] == ERROR)] = 0.0  # (counted below)
    g = 2.0 * (ss.KC[:hi, :chi] @ w) - ss.diag[:hi]
    E = np.flatnonzero(ss.state[:hi] == ERROR)
    if len(E):
        share = np.zeros(hi)
        tmp = np.zeros(hi)
        try:
            for s in E.tolist():
                col = int(ss.col_of_slot[s])
                if col >= 0:
                    share += ss.KC[:hi, col]
                else:
                    kernel_column_into(ss, s, tmp)
                    share += tmp
        finally:
            scrub(tmp)
        g += 2.0 * ss.C * share
    g += ss.mu
    g[ss.state[:hi] == FREE] = 0.0  # (a freed row is never read: both backends give 0)
    return g


def kkt(ss: SlotState, g: np.ndarray) -> float:
    """Largest violation of the KKT conditions and constraints given ``g`` (relative)."""
    st = ss.state[: ss.hi]
    a = ss.alpha[: ss.hi]  # free slots hold alpha = 0
    viol = max(abs(float(a.sum()) - 1.0), -float(a.min(initial=0.0)),
               float(a.max(initial=0.0)) - ss.C)
    # signed violation per set: |g| on the margin, g on error, −g on reserve
    sign = _KKT_SIGN[st]
    gv = g * sign
    gv[st == MARGIN] = np.abs(g[st == MARGIN])
    # relative to the size of the terms that make up g_i (all kernel values
    # are positive): K_ii + 2 (K alpha)_i + |mu| = 2 K_ii + g_i − mu + |mu|
    d = ss.diag[: ss.hi]
    size = np.maximum(2.0 * d + g - ss.mu + abs(ss.mu), 1.0)
    return max(viol, float((gv / size).max(initial=0.0)))


def tied_slots(ss: SlotState, g: np.ndarray, tie: float) -> np.ndarray:
    """Error and reserve slots with ``|g| <= tie`` (tied with the margin)."""
    st = ss.state[: ss.hi]
    return np.flatnonzero((np.abs(g) <= tie) & ((st == ERROR) | (st == RESERVE)))


def positive_definite(K: np.ndarray, rel_shift: float) -> bool:
    """True when ``sym(K) − rel_shift · trace · I`` has a Cholesky factor."""
    K = 0.5 * (K + K.T)
    shift = rel_shift * float(np.trace(K))
    try:
        np.linalg.cholesky(K - shift * np.eye(len(K)))
    except np.linalg.LinAlgError:
        return False
    return True


def tied_positive_definite(ss: SlotState, tied: np.ndarray) -> bool:
    """:func:`tied_block_test` by :func:`positive_definite`."""
    return tied_block_test(ss, tied, positive_definite)


def tied_block_test(ss: SlotState, tied: np.ndarray, block_test: Callable) -> bool:
    """``block_test`` (``1e-10``) on the kernel block of the margin set and ``tied``,
    computed from the keys (the general uniqueness test beside tied tokens; the compiled
    backend passes its own factorization); the keys' copy and the block zeroed after."""
    keys = ss.X[np.concatenate([ss.margin_slots(), tied])]
    K = None
    try:
        K = gram_matrix(keys, ss.kernel, ss.gamma_value)
        return bool(block_test(K, 1e-10))
    finally:
        scrub(keys)
        if K is not None:
            scrub(K)


def count_states(ss: SlotState) -> tuple[int, int, int]:
    """``(margin, error, reserve)`` set sizes."""
    counts = np.bincount(ss.state[: ss.hi], minlength=DRIVEN + 1)
    return int(counts[MARGIN]), int(counts[ERROR]), int(counts[RESERVE])


def support_slots_by_id(ss: SlotState) -> np.ndarray:
    """Support slots (alpha > 0; every live slot in warm-up) in id order."""
    s = ss.support_slots()
    return s[np.argsort(ss.slot_id[s], kind="stable")]


def certificate_facts(ss: SlotState, g: np.ndarray, tie: float
                      ) -> tuple[int, int, int, int, np.ndarray, np.ndarray]:
    """``(margin, error, reserve, unique, ids, values)`` after an operation: set sizes;
    uniqueness (1 / 0, or -1: the caller runs the full check); the support's ids in
    id order and their alphas followed by mu (the digest's inputs)."""
    nm, ne, nr = count_states(ss)
    slots = support_slots_by_id(ss)
    return nm, ne, nr, -1, ss.slot_id[slots], np.append(ss.alpha[slots], ss.mu)


# -------------------------------------------------------------------- drives
def _copy_of_margin(ss: SlotState, i: int) -> bool:
    """Whether slot ``i`` is a copy of a margin token other than itself: keys the kernel
    cannot tell apart, ``K_ii + K_jj − 2 K_ij <= 1e-13 (K_ii + K_jj)``
    (:mod:`svattn.exact.operations.copies`; the compiled ``columns.copy_of_any``)."""
    S = ss.slot_of_col[: ss.nS]
    dd = ss.diag[S] + ss.diag[i]
    return bool(np.any((dd - 2.0 * ss.KC[i, : ss.nS] <= 1e-13 * dd) & (S != i)))


def _is_copy(ss: SlotState, k_c: np.ndarray, i: int, c: int) -> bool:
    """Whether slot ``i`` is a copy of slot ``c`` (``k_c``: ``c``'s kernel column)."""
    dd = ss.diag[i] + ss.diag[c]
    return i != c and dd - 2.0 * k_c[i] <= 1e-13 * dd


def drive(ss: SlotState, c: int, direction: int, seed: np.ndarray | None = None) -> int:
    """Move alpha_c up (+1, until g_c = 0 or alpha_c = C) or down to 0 (−1), one
    numpy array call per step (``seed`` is unused: the reference removes by events)."""
    C = ss.C
    s = float(direction)  # the direction, as a float
    rate_tol = 1e-13
    scale = ss.scale
    gtol = 1e-13 * scale
    events = zero_steps = 0
    last_left = last_entered = -1
    max_events = 20 * ss.n + 200
    ss.g_valid = False
    hi = ss.hi
    a, g = ss.alpha, ss.g
    # c's kernel column, contiguous for the whole drive
    k_c = ss.KC[:hi, int(ss.col_of_slot[c])].copy()
    sk2 = (2.0 * s) * k_c  # direction-signed, for rho below
    try:
        rho = np.empty(hi)
        ratio = np.empty(hi)
        bad = np.empty(hi, dtype=bool)
        ratio_buf = np.empty(hi)
        # +1 on error tokens (they enter the margin when g rises to 0), −1 on
        # reserve tokens (when g falls to 0), 0 elsewhere; kept in step with events
        st0 = ss.state[:hi]
        sgn = (st0 == ERROR).astype(np.float64) - (st0 == RESERVE)
        # one errstate for the loop: 0/0 and x/0 in the ratio tests are expected
        with np.errstate(divide="ignore", invalid="ignore"):
            while True:
                events += 1
                if events > max_events or zero_steps > 2 * ss.nS + 20:
                    raise NeedResolve
                nS = ss.nS
                if nS == 0:
                    done, who = mu_move(ss, c, direction, alloc_col)
                    if done:
                        return events
                    sgn[who] = 0.0
                    last_entered = who
                    continue
                S = ss.slot_of_col[:nS]
                u = np.empty(nS + 1)
                u[0] = 1.0
                u[1:] = 2.0 * k_c[S]
                beta = -(ss.Qinv @ u)
                # rho_i = d g_i / dt for every token (0 on the margin), with t = |d alpha_c|:
                # 2 (K_iS beta_S + k_ic) + beta_mu, times the direction
                np.add(ss.KC[:hi, :nS] @ ((2.0 * s) * beta[1:]), sk2, out=rho)
                rho += s * beta[0]
                # --- candidate steps (t >= 0 is |d alpha_c|)
                if direction > 0:
                    best_t, kind, who = C - a[c], "c_error", -1
                    if rho[c] > rate_tol * scale:
                        t = max(-g[c], 0.0) / rho[c]
                        if t <= best_t:
                            best_t, kind = t, "c_margin"
                else:
                    best_t, kind, who = a[c], "c_out", -1
                # a margin coefficient moving down reaches 0, one moving up reaches C
                r = beta[1:] * s
                aS = a[S]
                down = r < 0
                t_m = np.where(down, aS, C - aS)
                np.maximum(t_m, 0.0, out=t_m)
                absr = np.abs(r)
                t_m /= absr
                t_m[absr <= rate_tol] = np.inf
                if last_entered >= 0:  # no zero-length exit for the token that just entered
                    p = int(ss.col_of_slot[last_entered])
                    if 0 <= p < nS and t_m[p] == 0.0:
                        t_m[p] = np.inf
                j = int(np.argmin(t_m))
                if t_m[j] < best_t:
                    best_t, who = float(t_m[j]), int(S[j])
                    kind = "m_reserve" if down[j] else "m_error"
                # an error token moves towards g = 0 when rho > 0, a reserve one when
                # rho < 0; it gets there at t = −g/rho, i.e. the largest ratio g/rho <= 0
                rho[S] = 0.0
                np.divide(g[:hi], rho, out=ratio)
                np.multiply(rho, sgn, out=ratio_buf)
                np.less_equal(ratio_buf, gtol, out=bad)
                ratio[bad] = -np.inf
                if last_left >= 0 and ratio[last_left] >= 0.0:
                    ratio[last_left] = -np.inf
                i = int(np.argmax(ratio))
                # nor does a copy of a margin token enter (its g is its sibling's, 0,
                # along the whole path) or, on an add, a copy of c (its g is c's: c's
                # own event takes the group): a group keeps one free member
                # (docs/design.md, duplicates). The best of the others is taken.
                while ratio[i] > -np.inf and (
                        _copy_of_margin(ss, i) or direction > 0 and _is_copy(ss, k_c, i, c)):
                    ratio[i] = -np.inf
                    i = int(np.argmax(ratio))
                t_i = max(-float(ratio[i]), 0.0)
                if t_i < best_t:
                    best_t, kind, who = t_i, "enter", i
                if not math.isfinite(best_t):
                    raise NeedResolve
                t = best_t
                zero_steps = zero_steps + 1 if t == 0.0 else 0
                # --- move everything linearly
                a[c] += s * t
                a[S] += r * t
                ss.ac[:nS] = a[S]
                ss.mu += beta[0] * s * t
                rho *= t
                g[:hi] += rho
                last_left = last_entered = -1
                # --- apply the event
                if kind == "c_margin":
                    if _copy_of_margin(ss, c):
                        # c reaches g = 0 beside a copy of it on the margin (a near-copy
                        # a rounding-level g kept outside): the group's budget is one,
                        # so the batch re-solve (which merges copies) takes it
                        raise NeedResolve
                    g[c] = 0.0
                    ss.state[c] = MARGIN
                    ss.ac[ss.col_of_slot[c]] = a[c]
                    expand(ss, c)
                    return events
                if kind == "c_error":
                    a[c] = C
                    ss.state[c] = ERROR
                    return events
                if kind == "c_out":
                    a[c] = 0.0
                    return events
                if kind == "m_reserve":
                    a[who] = 0.0
                    contract(ss, int(ss.col_of_slot[who]))
                    ss.state[who] = RESERVE
                    sgn[who] = -1.0
                    free_col(ss, who)
                    last_left = who
                elif kind == "m_error":
                    a[who] = C
                    contract(ss, int(ss.col_of_slot[who]))
                    ss.state[who] = ERROR
                    ss.ac[ss.col_of_slot[who]] = C
                    sgn[who] = 1.0
                    last_left = who
                else:  # an error or reserve token reaches g = 0 and joins the margin
                    g[who] = 0.0
                    if ss.col_of_slot[who] < 0:  # a standby token has its column
                        alloc_col(ss, who)
                    try:
                        expand(ss, who)
                    except NeedResolve:  # nearly in the span of the margin keys
                        left = flat_exchange(ss, who, sgn[who] < 0, gtol)
                        if left == -1:  # it crossed its box: the other bound
                            ss.state[who] = ERROR if a[who] > 0 else RESERVE
                            sgn[who] = -sgn[who]
                            continue
                        if left is None:
                            raise
                        # its partner reached a bound and leaves, it joins
                        contract(ss, int(ss.col_of_slot[left]))
                        ss.state[left] = ERROR if a[left] > 0 else RESERVE
                        sgn[left] = 1.0 if a[left] > 0 else -1.0
                        if a[left] <= 0:
                            free_col(ss, left)
                        last_left = left
                        expand(ss, who)
                    ss.state[who] = MARGIN
                    sgn[who] = 0.0
                    last_entered = who
    finally:  # a removed token's kernel column must not stay in freed memory
        scrub(k_c)
        scrub(sk2)


def remove_by_segments(ss: SlotState, c: int, *, contract_first: bool) -> RemovalOutcome:
    """The reference removes by events alone: contract a margin token, then hand the
    whole removal to :func:`drive` (a ``"fallback"`` outcome with no seed)."""
    if contract_first:
        contract(ss, int(ss.col_of_slot[c]))
    return RemovalOutcome("fallback")


# ---------------------------------------------------------------- the streaming add
def reserve_add(ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int, tid: int) -> bool:
    """Score one key (value ``v``) against the cached columns; if it lands in the reserve
    set with no standby refresh due, store it in the free ``slot`` as token ``tid``
    (arrays only: the caller keeps the id map, hashes and counts) and return True;
    otherwise write nothing and return False (the general add path takes it)."""
    status, diag, row, g = _score_reserve(ss, x)
    try:
        if status != "stored":
            return False
        if ss.standby and (ss.standby_stale or float(g[0]) < ss.standby_theta):
            return False
        _store_reserve_row(ss, x, v, slot, tid, diag, row, g)
        return True
    finally:
        if row is not None:
            scrub(row)  # kernel values of the key: only the cache keeps them


def reserve_block(ss: SlotState, k: np.ndarray, v: np.ndarray | None, slots: np.ndarray,
                  tids: np.ndarray) -> tuple[int, str, np.ndarray | None, float, float]:
    """Store the rows of ``k`` (values ``v``) one after another as :func:`reserve_add`
    does, without its standby test (an ``extend`` refreshes the standby columns once,
    at its end), in ``slots`` as tokens ``tids``, until the first row that does not
    land in the reserve set. A stored row changes nothing but its own slot, so each
    row is scored against the same solution.

    Returns ``(stored, status, row, g, kxx)``: the rows stored; ``"stored"`` when all
    were, else the status of row ``stored``: ``"outside"`` (with its kernel row against
    the cached columns, its g and k(x, x), which the drive that adds it stores) or
    ``"overflow"`` (the general path raises the exp kernel's error)."""
    for i in range(len(slots)):
        status, diag, row, g = _score_reserve(ss, k[i])
        if status != "stored":
            return i, status, row, float(g[0]) if g is not None else 0.0, float(diag[0])
        _store_reserve_row(ss, k[i], None if v is None else v[i], int(slots[i]), int(tids[i]),
                           diag, row, g)
        scrub(row)  # kernel values of the key: only the cache keeps them
    return len(slots), "stored", None, 0.0, 0.0


def store_row(ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int, tid: int,
              diag: float, row: np.ndarray, g: float) -> None:
    """Store a key already scored (``row``: its kernel row against the cached columns,
    its g and k(x, x) ``diag``) in the free ``slot`` as reserve token ``tid``, arrays
    only, as :func:`reserve_add` stores it (a driven add then drives it in)."""
    _store_reserve_row(ss, x, v, slot, tid, np.array([diag]), row, np.array([g]))


def _score_reserve(ss: SlotState, x: np.ndarray
                   ) -> tuple[str, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """One key's kernel diagonal, kernel row against the cached columns and g, and
    whether it lands in the reserve set (``"stored"``), ``"outside"`` the description,
    or overflows the exp kernel (``"overflow"``: no row)."""
    xs = x[None, :]
    try:
        diag = kernel_diag(xs, ss.kernel, ss.gamma_value)
        row = kernel_matrix(xs, ss.XC[: ss.chi], ss.kernel, ss.gamma_value)[0]
    except KernelOverflowError:
        return "overflow", np.zeros(1), None, None
    try:
        share, _ = _error_share(ss, x)
    except KernelOverflowError:
        scrub(row)
        return "overflow", np.zeros(1), None, None
    g = 2.0 * (row @ ss.ac[: ss.chi]) + 2.0 * ss.C * share - diag + ss.mu
    return ("outside" if outside_description(ss, diag, g)[0] else "stored"), diag, row, g


def _uncached_errors(ss: SlotState) -> np.ndarray:
    """Slots without a cache column in the error set or the error sum's members."""
    hi = ss.hi
    return np.flatnonzero(((ss.state[:hi] == ERROR) | ss.esum_member[:hi])
                          & (ss.col_of_slot[:hi] < 0))


def _error_share(ss: SlotState, x: np.ndarray) -> tuple[float, float]:
    """``x``'s kernel values against the error tokens without a column: their sum over
    the error set and over the error sum's members (the key copies scrubbed)."""
    E = _uncached_errors(ss)
    if not len(E):
        return 0.0, 0.0
    keys = ss.X[E]
    try:
        k = kernel_matrix(x[None, :], keys, ss.kernel, ss.gamma_value)[0]
    finally:
        scrub(keys)
    share = float(k[ss.state[E] == ERROR].sum())
    member = float(k[ss.esum_member[E]].sum())
    scrub(k)
    return share, member


def _store_reserve_row(ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int,
                       tid: int, diag: np.ndarray, row: np.ndarray, g: np.ndarray) -> None:
    """Write a scored key into the free ``slot`` as reserve token ``tid`` (arrays only),
    with its error-column sum over the row (as ``solver.esum_rows``)."""
    chi = ss.chi
    esum = 0.0
    if ss.esum_valid:
        cols = ss.col_of_slot[np.flatnonzero(ss.esum_member[: ss.hi])]
        cols = cols[cols >= 0]
        esum = float(row[cols].sum()) + _error_share(ss, x)[1]
    ss.X[slot] = x
    if v is not None:
        ss.V[slot] = v
    ss.xn2[slot] = float(x @ x)
    ss.diag[slot], ss.alpha[slot], ss.g[slot] = diag[0], 0.0, g[0]
    ss.state[slot], ss.slot_id[slot], ss.esum[slot] = RESERVE, tid, esum
    ss.KC[slot, :chi] = row


__all__ = ["NAME", "alloc_col", "certificate_facts", "contract", "count_states", "drive",
           "g_exact", "kkt", "margin_gram", "margin_health", "nearest_reserve",
           "positive_definite", "ready_for_removals", "refresh_standby", "remove_by_segments",
           "reserve_add", "reserve_block", "settle_error_columns", "solve_margin", "store_row",
           "support_slots_by_id", "tied_positive_definite", "tied_slots", "wipe_slot_arrays"]
