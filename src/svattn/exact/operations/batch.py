"""The memory's own batch solver: SMO followed by an exact active-set finish.

:class:`~svattn.exact.memory.SVDDMemory` calls this when it first becomes
feasible (``n = warmup_threshold(C)``) and as a fallback when an incremental
step meets a degeneracy it will not guess through. It is deliberately a
different algorithm from the oracle in :mod:`svattn.exact.oracle` (which
starts from an interior-point QP), so the two can check each other.

Each token has its own upper bound ``U_i`` (``C`` normally; ``m·C`` for a group
of ``m`` numerically identical keys merged into one, which the memory then
spreads back over the group's members).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svattn.exact.operations.kernel_columns import KernelColumns


@dataclass(frozen=True)
class BatchSolution:
    """Exact optimum of the SVDD dual on a fixed token set."""

    alpha: np.ndarray
    mu: float
    margin: np.ndarray  # the free indices of the final solve (alpha may sit at a bound)
    error: np.ndarray  # indices with alpha = U
    reserve: np.ndarray  # indices with alpha = 0
    Qinv: np.ndarray | None = None  # the bordered inverse on ``margin`` (when computed)
    # the sum of the error tokens' kernel columns over every token (when computed: the
    # memory's error sum, so that no error column is kept; issue #51)
    esum: np.ndarray | None = None


def smo(K: np.ndarray, diag: np.ndarray, U: np.ndarray, *, gap_tol: float,
        max_iter: int) -> np.ndarray:
    """Sequential minimal optimisation with second-order working-set selection.

    Pairs are picked as in libsvm (Fan, Chen & Lin 2005, WSS 2): the index
    that most wants to grow, and the partner that gives the largest decrease
    of the objective. Stops when the maximal KKT gap is below ``gap_tol``.
    """
    a = _fill(U)  # a feasible start: the largest bounds filled first
    grad = 2.0 * (K @ a) - diag
    tau = 1e-12 * max(1.0, float(diag.max()))
    for _ in range(max_iter):
        can_down = a > 0
        gi = np.where(a < U, grad, np.inf)
        i = int(np.argmin(gi))
        gap = float(np.max(np.where(can_down, grad, -np.inf)) - gi[i])
        if gap <= gap_tol:
            break
        b = grad - grad[i]
        eta = np.maximum(diag[i] + diag - 2.0 * K[i], tau)
        # b · (b / eta): b² alone overflows for exp-kernel gradients of ~e^150
        score = np.where(can_down & (b > 0), b * (b / eta), -np.inf)
        j = int(np.argmax(score))
        step = min(b[j] / (2.0 * eta[j]), U[i] - a[i], a[j])
        a[i] += step
        a[j] -= step
        grad += (2.0 * step) * (K[i] - K[j])
    return a


def _bordered_solve(K, diag, U, S, E) -> tuple[np.ndarray, float]:
    """alpha_S and mu from g_S = 0 and sum(alpha) = 1 with alpha_E = U_E.

    Solved equilibrated: with ``D = diag(t, 1/sqrt(K_ii))`` the block ``D Q D`` holds the
    feature-space cosines ``K_ij / sqrt(K_ii K_jj)`` and a border of the same order, so
    LU pivots stay meaningful when the diagonals span many orders of magnitude (the exp
    kernel: K_ii = exp(gamma‖x‖²) from e^10 to e^300 in one memory); the unscaled system
    then gave garbage and the active-set moves cycled.
    """
    m = len(S)
    Q = np.empty((m + 1, m + 1))
    Q[0, 0] = 0.0
    Q[0, 1:] = 1.0
    Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K[np.ix_(S, S)]
    rhs = np.empty(m + 1)
    rhs[0] = 1.0 - U[E].sum()
    rhs[1:] = diag[S] - 2.0 * (K[np.ix_(S, E)] @ U[E])
    d = np.empty(m + 1)
    d[1:] = 1.0 / np.sqrt(diag[S])
    d[0] = 1.0 / float(np.max(d[1:]))  # the border row on the scale of the scaled block
    Qs = d[:, None] * Q * d[None, :]
    z = np.linalg.solve(Qs, d * rhs)
    x = d * z
    for _ in range(2):  # iterative refinement, residuals in the original units
        x += d * np.linalg.solve(Qs, d * (rhs - Q @ x))
    return x[1:], float(x[0])


def active_set_finish(K: np.ndarray, diag: np.ndarray, U: np.ndarray, alpha0: np.ndarray, *,
                      tol: float, max_iter: int) -> BatchSolution:
    """Exact optimum from an approximate one: a primal active-set method.

    The working set holds the tokens at a bound (``alpha = 0``: reserve, ``= U``:
    error); the others are the margin set. Each iteration solves the bordered KKT
    system on the margin set. If that point is within the bounds, the bound with
    the worst multiplier (a reserve token with ``g < 0``, an error token with
    ``g > 0``) is released, or the point is optimal when there is none. If not,
    the iterate moves towards it only as far as the bounds allow and the first
    bound met joins the working set. Iterates stay feasible and the objective
    never rises, so unlike flipping single violators between infeasible partitions
    (which cycled on exp-kernel diagonals spanning e^10 .. e^300) it terminates
    (Nocedal & Wright, *Numerical Optimization*, Algorithm 16.3).

    A point whose worst multiplier is within ``tol`` but above rounding
    (:func:`rounding_floor`) is not yet the optimum: near-copies of keys (kernel
    distances ~1e-12) put whole partitions within ``tol`` of one another, and a vertex
    there can be 1e-12 below the optimum's objective with every multiplier under
    ``tol``. The moves go on until the multipliers are at rounding, for at most
    :func:`refine_moves` more, and stop where a partition repeats (rounding then
    decides the releases); the solution with the smallest worst multiplier is returned.
    """
    n = K.shape[0]
    floor, best, seen, moves_left = rounding_floor(n), None, set(), refine_moves(n)
    edge = 1e-9 * U
    alpha = np.clip(alpha0, 0.0, U)
    if not abs(alpha.sum() - 1.0) <= 1e-12:  # a feasible start: fill the largest bounds
        alpha = _fill(U)
    state = np.where(alpha >= U - edge, 2, np.where(alpha <= edge, 0, 1))  # 0 R, 1 S, 2 E
    alpha[state == 2] = U[state == 2]
    alpha[state == 0] = 0.0
    for _ in range(max_iter):
        S = np.flatnonzero(state == 1)
        E = np.flatnonzero(state == 2)
        R = np.flatnonzero(state == 0)
        if len(S) == 0:
            if abs(U[E].sum() - 1.0) > 1e-12:  # sum(alpha) = 1 needs a free token
                grad = 2.0 * (K @ alpha) - diag
                cand = np.flatnonzero(state != 1)
                state[cand[np.argmin(np.abs(grad[cand] - np.median(grad)))]] = 1
                continue
            target = alpha.copy()
            grad = 2.0 * (K @ target) - diag
            mu = float(np.min(-grad[E]))  # the empty-margin convention
        else:
            target = np.zeros(n)
            target[E] = U[E]
            target[S], mu = _bordered_solve(K, diag, U, S, E)
            out = (target[S] < -edge[S]) | (target[S] > U[S] + edge[S])
            if out.any():  # step towards it until the first bound
                d = target[S] - alpha[S]
                with np.errstate(divide="ignore", invalid="ignore"):
                    t_lo = np.where(d < 0, -alpha[S] / d, np.inf)
                    t_hi = np.where(d > 0, (U[S] - alpha[S]) / d, np.inf)
                t_each = np.minimum(t_lo, t_hi)
                k = int(np.argmin(t_each))
                t = float(np.clip(t_each[k], 0.0, 1.0))
                alpha[S] += t * d
                who = int(S[k])
                hit_low = t_lo[k] <= t_hi[k]
                state[who] = 0 if hit_low else 2
                alpha[who] = 0.0 if hit_low else U[who]
                continue
            np.clip(target, 0.0, U, out=target)
            grad = 2.0 * (K @ target) - diag
        alpha = target
        g = grad + mu
        # multipliers of the bounds, relative to the size of g's terms (K > 0 entrywise)
        size = np.maximum(2.0 * diag + g - mu + abs(mu), 1.0)
        viol = np.zeros(n)
        viol[E] = np.maximum(g[E], 0.0) / size[E]
        viol[R] = np.maximum(-g[R], 0.0) / size[R]
        worst = int(np.argmax(viol))
        if viol[worst] <= tol:
            if best is None or viol[worst] < best[0]:
                best = (float(viol[worst]), BatchSolution(alpha.copy(), mu, S, E, R))
            key = state.tobytes()
            if viol[worst] <= floor or key in seen or moves_left <= 0:
                return best[1]
            seen.add(key)
        if best is not None:
            moves_left -= 1
        state[worst] = 1  # release the bound whose multiplier is wrong
    if best is not None:
        return best[1]
    raise RuntimeError(
        f"active-set finish did not converge in {max_iter} moves (n={n}); "
        "the problem is probably degenerate (near-duplicate keys)"
    )


def rounding_floor(n: int) -> float:
    """The multiplier (relative to the size of ``g``'s terms) that rounding alone can
    give a bound token of an ``n``-token solve: ``16·eps·(4 + √n)`` (``g = 2Kα − d + μ``
    is a dot product of ``n`` terms of size at most that of ``g``'s, Σα = 1; 2.1e-14 at
    n = 4, 9.4e-14 at n = 500).

    Examples
    --------
    >>> 2e-14 < rounding_floor(4) < 3e-14
    True
    """
    return 16.0 * float(np.finfo(np.float64).eps) * (4.0 + float(n) ** 0.5)


def refine_moves(n: int) -> int:
    """How many active-set moves :func:`active_set_finish` may take past ``tol`` towards
    the rounding floor: ``16 + n // 16``."""
    return 16 + n // 16


def _fill(U: np.ndarray) -> np.ndarray:
    """A feasible point: the largest bounds filled first until the weights sum to 1."""
    a = np.zeros(len(U))
    left = 1.0
    for i in np.argsort(-U, kind="stable"):
        a[i] = min(U[i], left)
        left -= a[i]
        if left <= 0:
            break
    return a


def batch_solve(K: np.ndarray, diag: np.ndarray, U: np.ndarray | float, *,
                tol: float) -> BatchSolution:
    """Exact SVDD optimum on a feasible token set (``sum(U) >= 1``).

    ``U`` is the upper bound per token (a scalar C for all).
    """
    n = K.shape[0]
    U = np.broadcast_to(np.asarray(U, dtype=np.float64), (n,)).copy()
    # the gap in units of a typical diagonal: one huge exp-kernel diagonal must
    # not stop SMO before it has resolved the ordinary tokens
    scale = max(1.0, float(np.median(diag)))
    alpha0 = smo(K, diag, U, gap_tol=1e-11 * scale, max_iter=200 * n + 1000)
    return active_set_finish(K, diag, U, alpha0, tol=tol, max_iter=10 * n + 100)


# ----------------------------------------------------------------------------------------
# The large-block path (issue #36): libsvm's one-class SVM as a warm start, then an exact
# float64 finish on kernel columns of the support only (O(n·|S ∪ E|) memory, no n×n Gram).

def libsvm_warm_start(X: np.ndarray, C: float, gamma: float, *,
                      tol: float = 1e-3) -> np.ndarray:
    """An approximate SVDD optimum (rbf) from scikit-learn's ``OneClassSVM`` (libsvm).

    With ``k(x, x) = 1`` the SVDD dual ``min αᵀKα − diag(K)ᵀα, Σα = 1, 0 <= α <= C``
    is libsvm's one-class dual ``min ½βᵀKβ, Σβ = νn, 0 <= β <= 1`` with ``ν = 1/(Cn)``
    and ``α = C·β`` (the linear term is the constant ``Σα = 1``; the quadratic one is
    scaled by a positive factor). libsvm stops at its own tolerance and caches the
    kernel in float32, so this is only the start of :func:`column_finish`.

    Returns
    -------
    ndarray, shape (n,)
        ``C · β`` (exactly ``C`` where libsvm put β at its bound, 0 off its support).
    """
    n = len(X)
    nu = min(1.0, 1.0 / (C * n))
    support, beta, keys = _one_class_dual(X, nu, gamma, tol)
    try:
        alpha = np.zeros(n)
        alpha[np.asarray(support)] = C * np.minimum(np.asarray(beta, dtype=np.float64).ravel(),
                                                    1.0)
    finally:  # the fitted model's copy of the support's keys: freed holding none
        keys.fill(0.0)
    return alpha


def _one_class_dual(X: np.ndarray, nu: float, gamma: float, tol: float):
    """libsvm's one-class solution of ``X`` (rbf): its support indices, their β and its
    copy of their keys (the caller scrubs it). libsvm's kernel cache at scikit-learn's
    default size (200 MB): bounded, so the batch path holds no O(n²) array (a cache of
    every row barely sped it up).

    The call ``OneClassSVM.fit`` makes, without its input checks (the rows are the
    memory's validated float64 rows), which are most of its time on small data.
    Where scikit-learn's private ``_libsvm.fit`` does not take that call (another
    version), ``OneClassSVM`` itself (:func:`_one_class_dual_by_estimator`, the
    reference ``tests/exact/test_bulk.py`` compares it with).
    """
    try:
        from sklearn.svm import _libsvm

        _libsvm.set_verbosity_wrap(0)  # (a global: OneClassSVM sets it on every fit too)
        out = _libsvm.fit(np.ascontiguousarray(X, dtype=np.float64), np.ones(len(X)),
                          svm_type=2, kernel="rbf", degree=3, gamma=float(gamma), coef0=0.0,
                          tol=float(tol), C=0.0, nu=float(nu), epsilon=0.0, shrinking=1,
                          probability=0, cache_size=200.0, max_iter=-1, random_seed=0)
    except (ImportError, TypeError, AttributeError):
        return _one_class_dual_by_estimator(X, nu, gamma, tol)
    return out[0], out[3], out[1]


def _one_class_dual_by_estimator(X: np.ndarray, nu: float, gamma: float, tol: float):
    """:func:`_one_class_dual` by scikit-learn's public ``OneClassSVM``."""
    from sklearn.svm import OneClassSVM  # the estimator's dependency; loaded on first use

    oc = OneClassSVM(kernel="rbf", gamma=gamma, nu=nu, tol=tol).fit(X)
    return oc.support_, oc.dual_coef_, oc.support_vectors_


def column_finish(cols: KernelColumns, C: float, alpha0: np.ndarray, *, tol: float,
                  max_iter: int = 60) -> BatchSolution | None:
    """The exact SVDD optimum (rbf, bound ``C``) from an approximate one, or None.

    A primal-dual active-set method (Hintermüller, Ito & Kunisch 2002) on kernel
    columns of the support only: the partition read off ``alpha0``; on it the margin
    system ``g_S = 0, Σα = 1`` (error tokens at their bound, reserve at 0) is solved
    exactly in float64 (LU, two steps of iterative refinement); then every token's ``g``
    is computed and all wrong memberships flip at once — a margin coefficient beyond a
    bound joins that bound's set, a reserve token with ``g < 0`` or an error token
    with ``g > 0`` (beyond ``tol`` relative to the size of ``g``'s terms, as
    :func:`active_set_finish` measures it) joins the margin set. Stops when nothing
    flips: every token then satisfies the KKT conditions to ``tol``. From libsvm's
    partition this takes one to three solves; the bordered inverse of the final
    margin set is computed once, for the memory to keep.

    Copies (keys the kernel cannot tell apart: ``K_ij >= 1 − 1e-13``) share one
    coefficient budget (:func:`merge_copies`): a support token's kept row shows every
    copy of it, and the group is solved as one token with bound ``m·C`` (its other
    members leave the problem; their ``g`` is the representative's), then spread back
    in index order (:func:`spread_copies`: the first members at ``C``, one remainder,
    the rest 0). The optimum is unique only up to that split; the margin system holds
    one member of a group at most, so it stays positive definite.

    None where the method cannot certify its optimum: a partition seen before (a
    cycle), ``max_iter`` passes, an empty margin set, or copies that are not one group
    (a near-copy of a near-copy) — the caller then takes the memory's own path.
    """
    n = len(alpha0)
    edge = 1e-13 * C
    # 0 reserve, 1 margin, 2 error, 3 a copy merged into its group's representative
    state = np.where(alpha0 >= C, 2, np.where(alpha0 <= 0.0, 0, 1)).astype(np.int8)
    U = np.full(n, float(C))  # each token's bound (m·C for a group's representative)
    rep = np.full(n, -1, dtype=np.int64)  # a merged copy's representative
    copies = np.zeros(n, dtype=np.int64)  # copies seen in each checked row (0: unchecked)
    seen: set[bytes] = set()
    diag = np.ones(n)
    S = Q = factor = None  # the last solve's margin order, system and A's Cholesky factor
    # the error tokens' share: eS = Σ w_j K[:, j] over the error set (w_j = U_j / C: 1, or
    # m for a group of m copies), updated by the columns of the tokens whose weight
    # changed — computed a block at a time, never kept (issue #51)
    eS, ew = np.zeros(n), np.zeros(n)
    try:  # the systems and factors hold kernel values: each goes back zeroed
        for _ in range(max_iter):
            if not merge_copies(cols, state, U, rep, copies, C):
                return None
            key = state.tobytes()
            if key in seen:
                return None
            seen.add(key)
            E = np.flatnonzero(state == 2)
            S, Q2, factor2 = _margin_system(cols, state, S, Q, factor)
            _scrub_dropped(Q, Q2)
            _scrub_dropped(factor, factor2)
            Q, factor = Q2, factor2
            if len(S) == 0:
                return None
            pS = cols.ensure(S)
            want = np.zeros(n)
            want[E] = U[E] / C
            moved = np.flatnonzero(want != ew)
            for part, rows in cols.rows_of(moved):
                eS += (want[part] - ew[part]) @ rows
            ew = want
            m = len(S)
            rhs = np.empty(m + 1)
            rhs[0] = 1.0 - U[E].sum()
            rhs[1:] = diag[S] - 2.0 * C * eS[S]
            solve = _margin_solver(Q, check_finite=False, factor=factor)
            if solve is None:
                return None
            factor = solve.factor
            x = solve(rhs)
            for _ in range(2):  # iterative refinement
                x += solve(rhs - Q @ x)
            aS, mu = x[1:], float(x[0])
            a_rows = np.zeros(cols.m)  # alpha by kept row (the margin's)
            a_rows[pS] = aS
            g = 2.0 * (a_rows @ cols.rows[: cols.m]) + 2.0 * C * eS - diag + mu
            size = np.maximum(2.0 * diag + g - mu + abs(mu), 1.0)
            low = S[aS < -edge]
            high = S[aS > U[S] + edge]
            R = np.flatnonzero(state == 0)
            r_bad = R[-g[R] / size[R] > tol]
            e_bad = E[g[E] / size[E] > tol]
            if not (len(low) or len(high) or len(r_bad) or len(e_bad)):
                group = np.zeros(n)
                group[E] = U[E]
                group[S] = np.clip(aS, 0.0, U[S])
                alpha, margin = spread_copies(group, rep, S, C)
                cols.ensure(margin)  # (a spread copy on the margin needs its own column)
                Qinv = bordered_inverse(Q, factor=factor)  # the memory keeps it
                error = np.flatnonzero(alpha >= C)
                # the memory's error sum: eS itself where every error token stands alone
                # (a group's copies at C share their representative's column: summed anew)
                same = not (rep >= 0).any() and np.array_equal(error, E)
                return BatchSolution(alpha, mu, margin, error, np.flatnonzero(alpha <= 0.0),
                                     Qinv, eS.copy() if same else None)
            state[low] = 0
            state[high] = 2
            state[r_bad] = 1
            state[e_bad] = 1
        return None
    finally:
        for a in (Q, factor):
            if a is not None:
                a.fill(0.0)
        eS.fill(0.0)


# K_ij at or above this (rbf: 1 − K_ij the kernel distance) is a copy: the kernel
# cannot tell the keys apart (the memory's own test, svattn.exact.core.kernels.copy_groups)
COPY_KERNEL = 1.0 - 1e-13


def merge_copies(cols: KernelColumns, state: np.ndarray, U: np.ndarray, rep: np.ndarray,
                 copies: np.ndarray, C: float) -> bool:
    """Merge the copies of every margin and error token not checked yet into one token
    (in place): the kept row of such a token lists its copies (``K_ij >= COPY_KERNEL``);
    the first of them in index order becomes the group's representative with bound
    ``m·C`` and the group's weight (margin unless every member was at its bound), the
    others leave the problem (state 3, ``rep`` naming the representative). False where
    the copies do not form one group (a member already merged elsewhere, or rows that
    disagree about who is a copy): the caller cannot certify a split."""
    check = np.flatnonzero(((state == 1) | (state == 2)) & (copies == 0))
    if not len(check):
        return True
    cols.ensure(check[state[check] == 1])  # (error tokens' rows: computed, not kept)
    for part, rows in cols.rows_of(check):  # (no copy of the rows: a block at a time)
        copies[part] = np.count_nonzero(rows >= COPY_KERNEL, axis=1)
    for i in check[copies[check] > 1].tolist():
        if state[i] == 3:
            continue  # merged into a group found earlier in this pass
        for _, row in cols.rows_of(np.array([i])):  # (read before the scratch is zeroed)
            members = np.flatnonzero(row[0] >= COPY_KERNEL)
        if (rep[members] >= 0).any() or (U[members] > C).any():
            return False
        r = int(members[0])
        others = members[1:]
        state[r] = 2 if (state[members] == 2).all() else 1
        U[r] = len(members) * C
        state[others] = 3
        rep[others] = r
        copies[members] = len(members)
    return True


def spread_copies(group: np.ndarray, rep: np.ndarray, S: np.ndarray, C: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Alpha over every token from the groups' weights (``group``, on representatives):
    each group's weight ``w`` goes to its members in index order — ``C`` each while
    ``w >= C``, then the remainder, then 0 — so a group holds one free member at most.
    Returns alpha and the margin order ``S`` with each representative replaced by its
    group's free member (the rows of the margin system are the same: copies have the
    same kernel values)."""
    alpha = group.copy()
    margin = S.copy()
    merged = np.flatnonzero(rep >= 0)
    if not len(merged):
        return alpha, margin
    where = {int(s): p for p, s in enumerate(S.tolist())}
    for r in np.unique(rep[merged]).tolist():
        members = np.concatenate([[r], merged[rep[merged] == r]])
        members.sort()
        w = float(group[r])
        alpha[members] = 0.0
        for mbr in members.tolist():
            if w <= 1e-13 * C:
                break
            take = C if w >= C * (1 - 1e-13) else w
            alpha[mbr] = take
            w -= take
        free = members[(alpha[members] > 0) & (alpha[members] < C)]
        if r in where and len(free) == 1:
            margin[where[r]] = free[0]
    return alpha, margin


def _scrub_dropped(old: np.ndarray | None, new: np.ndarray | None) -> None:
    """Zero ``old`` (kernel-derived) where ``new``, which replaces it, is not held in it."""
    if old is not None and (new is None or not np.may_share_memory(old, new)):
        old.fill(0.0)


# at most this share of the last margin set may change for its factor to be kept: a
# token that left is deleted from it (Givens rotations, m² flops), a new one appended
# (a block row, m²k); more is a new factorization (m³/3)
APPEND_SHARE = 0.25


def _margin_system(cols: KernelColumns, state: np.ndarray, S: np.ndarray | None,
                   Q: np.ndarray | None, factor: np.ndarray | None):
    """The margin order, bordered system ``Q = [[0, 1ᵀ], [1, 2 K_SS]]`` and (when it
    could be kept) a lower Cholesky factor of ``2 K_SS`` for the margin set of
    ``state``. Where the last solve's margin set (``S``, ``Q``, ``factor``) changed
    by at most :data:`APPEND_SHARE` of it, its factor is kept: the tokens that left
    are deleted from ``Q`` and from the factor (the compiled core's Givens delete),
    the new ones appended in index order (``Q`` gets their rows, the factor a block
    row: ``L21 = A21 L11⁻ᵀ``, ``L22`` the factor of ``A22 − L21 L21ᵀ``); else the set
    in index order with no factor (the solver computes one). A factor is lower
    triangular where read (its other triangle is not) and contiguous either way."""
    from scipy.linalg import cholesky, solve_triangular

    from svattn.exact.backends.compiled.linalg import chol_delete

    now = np.flatnonzero(state == 1)
    if S is not None and factor is not None and len(S):
        kept = state[S] == 1
        gone = np.flatnonzero(~kept)
        new = np.setdiff1d(now, S, assume_unique=True)
        if 0 < len(gone) + len(new) <= APPEND_SHARE * len(S) and len(gone) < len(S):
            if len(gone):
                L = factor if factor.flags.f_contiguous else np.asfortranarray(factor)
                n = len(S)
                for p in gone[::-1].tolist():  # (column-major: the rotations vectorize)
                    n = chol_delete(L, p, n)
                factor = np.asfortranarray(L[:n, :n])  # (a copy: L is zeroed below)
                L.fill(0.0)  # kernel-derived values: the dropped buffer holds none (a
                # copied C-ordered factor: its caller, column_finish, zeroes that one)
                keep = np.concatenate([[0], 1 + np.flatnonzero(kept)])
                S, Q = S[kept], Q[np.ix_(keep, keep)]
            if len(new) == 0:
                return S, Q, factor
            m0, k = len(S), len(new)
            S2 = np.concatenate([S, new])
            Q2 = np.empty((m0 + k + 1, m0 + k + 1))
            Q2[: m0 + 1, : m0 + 1] = Q
            Q2[0, m0 + 1:] = 1.0
            Q2[m0 + 1:, 0] = 1.0
            pN = cols.ensure(new)  # (first: it may grow cols.rows, a new array)
            block = cols.rows[np.ix_(pN, S2)]  # K[new, S2] (symmetric)
            block *= 2.0
            Q2[m0 + 1:, 1:] = block
            Q2[1: m0 + 1, m0 + 1:] = block[:, :m0].T
            L21t = P = Z = L22 = None
            try:
                L21t = solve_triangular(factor, block[:, :m0].T, lower=True,
                                        check_finite=False)
                P = L21t.T @ L21t
                Z = block[:, m0:] - P
                L22 = cholesky(Z, lower=True, check_finite=False)
                L = np.zeros((m0 + k, m0 + k), order="F")
                L[:m0, :m0] = factor  # (its upper triangle, if any, is not read)
                L[m0:, :m0] = L21t.T
                L[m0:, m0:] = L22
            except np.linalg.LinAlgError:
                return S2, Q2, None  # the solver's own factorization decides
            finally:  # kernel-derived temporaries: freed zeroed
                for a in (block, L21t, P, Z, L22):
                    if a is not None:
                        a.fill(0.0)
            return S2, Q2, L
    pS = cols.ensure(now)
    m = len(now)
    Q2 = np.empty((m + 1, m + 1))
    Q2[0, 0] = 0.0
    Q2[0, 1:] = 1.0
    Q2[1:, 0] = 1.0
    if m and (np.diff(pS) == 1).all():  # rows in order (the first system): ~2x faster
        Q2[1:, 1:] = np.take(cols.rows[pS[0]: pS[-1] + 1], now, axis=1)
    else:
        Q2[1:, 1:] = cols.rows[np.ix_(pS, now)]
    Q2[1:, 1:] *= 2.0
    return now, Q2, None


def _lapack_factor(L: np.ndarray) -> tuple[np.ndarray, bool]:
    """A lower factor as LAPACK takes it without a copy: ``(L, True)`` in Fortran
    order, ``(Lᵀ, False)`` (the upper factor, Fortran-ordered) in C order."""
    if L.flags.f_contiguous:
        return L, True
    if L.flags.c_contiguous:
        return L.T, False
    return np.asfortranarray(L), True


def _margin_solver(Q: np.ndarray, *, check_finite: bool = False,
                   factor: np.ndarray | None = None):
    """A solver of the bordered system ``Q = [[0, 1ᵀ], [1, A]]`` with ``A = 2 K_SS``
    positive definite, by one Cholesky factor of ``A`` (a third of an LU's work) and
    the Schur complement of the border: ``x = [mu, a]`` with ``A a + mu 1 = r_S`` and
    ``1ᵀa = r_0``. ``factor``: ``A``'s lower factor already computed (its upper
    triangle is not read). None when ``A`` has no Cholesky factor (not positive
    definite)."""
    from scipy.linalg import cho_factor, cho_solve

    A = Q[1:, 1:]
    if factor is not None:
        c = _lapack_factor(factor)
    else:
        try:
            c = cho_factor(A, lower=True, check_finite=check_finite)
        except np.linalg.LinAlgError:
            return None
    w = cho_solve(c, np.ones(len(A)), check_finite=check_finite)
    sw = float(w.sum())
    if not sw > 0:
        if factor is None:  # (a factor it was given is its caller's to zero)
            c[0].fill(0.0)
        return None

    def solve(r: np.ndarray) -> np.ndarray:
        u = cho_solve(c, r[1:], check_finite=check_finite)
        mu = (float(u.sum()) - r[0]) / sw
        out = np.empty(len(r))
        out[0] = mu
        out[1:] = u - mu * w
        return out

    solve.factor = c[0] if c[1] else c[0].T  # lower (where read), for bordered_inverse
    return solve


def bordered_inverse(Q: np.ndarray, factor: np.ndarray | None = None) -> np.ndarray:
    """``Q⁻¹`` of ``Q = [[0, 1ᵀ], [1, A]]`` (``A`` positive definite) from ``A⁻¹`` by a
    Cholesky factor (``potrf`` + ``potri``: half the work of a general inverse):
    ``[[−1/s, wᵀ/s], [w/s, A⁻¹ − w wᵀ/s]]`` with ``w = A⁻¹ 1``, ``s = 1ᵀw``.
    ``factor``: ``A``'s lower Cholesky factor already computed (``potrf``'s, as
    :func:`_margin_solver` keeps it; its upper triangle is not read): the same result
    without a second factorization. A general inverse where ``A`` has no Cholesky
    factor."""
    from scipy.linalg import lapack

    A = Q[1:, 1:]
    m = len(A)
    lower = True
    if factor is not None:
        (L, lower), info = _lapack_factor(factor), 0
    else:
        L, info = lapack.dpotrf(A, lower=1, clean=1)
    if info == 0:
        Ai, info = lapack.dpotri(L, lower=int(lower))
    if info != 0:
        return np.linalg.inv(Q)
    if not lower:
        Ai = Ai.T  # (the lower triangle valid, as below reads it)
    out = np.empty((m + 1, m + 1))
    B = out[1:, 1:]
    bs = 64  # A⁻¹ from its lower triangle and w wᵀ/s off it, a block of rows at a time
    for j0 in range(0, m, bs):  # (no m×m temporary: each is a fresh array's first writes)
        j1 = min(m, j0 + bs)
        B[j0:j1, :j0] = Ai[j0:j1, :j0]
        B[j0:j1, j1:] = Ai[j1:, j0:j1].T
        D = Ai[j0:j1, j0:j1]
        B[j0:j1, j0:j1] = np.tril(D) + np.tril(D, -1).T
    Ai.fill(0.0)
    w = B.sum(axis=1)
    s = float(w.sum())
    ws = w / s
    out[0, 0] = -1.0 / s
    out[0, 1:] = ws
    out[1:, 0] = ws
    for j0 in range(0, m, bs):
        j1 = min(m, j0 + bs)
        B[j0:j1] -= np.outer(w[j0:j1], ws)
    return out


def libsvm_solve(X: np.ndarray, C: float, gamma: float, *, tol: float,
                 libsvm_tol: float = 1e-2) -> tuple[BatchSolution | None, KernelColumns]:
    """The exact rbf SVDD optimum of ``X`` by :func:`libsvm_warm_start` and
    :func:`column_finish` (None: the caller solves it its own way), and the columns
    it computed (the caller scrubs them; on an error this does not answer with None —
    memory exhausted, an interrupt — they are scrubbed here, and the error raised).

    libsvm stops at ``libsvm_tol`` (its default is 1e-3): on issue #36's stream at
    n = 4k-8k, 1e-2 took ~20 % less of libsvm's time and the finish the same two
    solves (1e-1: four), since the finish corrects every membership libsvm left wrong.

    A numerical failure on the way (libsvm refusing the data, a singular margin
    system) is a None too: the caller's own path handles every token set.
    """
    failures = (ValueError, ArithmeticError, np.linalg.LinAlgError)
    try:
        alpha0 = libsvm_warm_start(X, C, gamma, tol=libsvm_tol)
    except failures:
        return None, KernelColumns(X[:0], gamma, capacity=1)
    # room for libsvm's margin set and a quarter: only margin columns are kept (error
    # tokens' are summed; issue #51), and the memory takes this buffer as its cache
    free = np.count_nonzero((alpha0 > 0) & (alpha0 < C))
    cols = KernelColumns(X, gamma, capacity=int(1.25 * free) + 64)
    try:
        return column_finish(cols, C, alpha0, tol=tol), cols
    except failures:
        return None, cols
    except BaseException:  # (memory exhausted, an interrupt): the caller never gets cols
        cols.scrub()
        raise
