"""Independent from-scratch SVDD solver: the oracle for tests and certificates.

Solves the SVDD / one-class SVM dual (``docs/design.md`` §1–3)

.. math::

    \\min_\\alpha\\; \\alpha^T K \\alpha - \\operatorname{diag}(K)^T \\alpha
    \\quad\\text{s.t.}\\quad \\textstyle\\sum_i \\alpha_i = 1,\\; 0 \\le \\alpha_i \\le C

in two stages:

1. a dense interior-point QP solve (Clarabel) for an approximate ``alpha``;
2. an *exact active-set polish*: read the partition (margin S, error E,
   reserve R) off the approximate solution, solve the bordered system

   ``[[2 K_SS, 1], [1^T, 0]] [alpha_S; mu] = [d_S - 2 C K_SE 1; 1 - C |E|]``

   with a backward-stable factorisation plus iterative refinement, move KKT
   violators between the sets and repeat until the KKT residual is below
   ``tol``.

With ``g_i = 2 (K alpha)_i - K_ii + mu`` the KKT conditions are ``g = 0`` on S
(``0 < alpha < C``), ``g <= 0`` on E (``alpha = C``) and ``g >= 0`` on R
(``alpha = 0``). The output has ``alpha`` *exactly* 0 on R and *exactly* C on E.

This module deliberately shares no code with the incremental solver
(:mod:`svattn.exact.memory`); it depends only on numpy, scipy, clarabel and the
shared conventions of :mod:`svattn.exact.core.conventions` (warm-up state and the
choice of ``mu`` when the margin set is empty).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
import scipy.sparse

from svattn.exact.core.conventions import FEASIBILITY_SLACK, is_feasible, mu_for_empty_margin

__all__ = ["solve_svdd", "kkt_residual", "partition", "svdd_objective"]

# Relative asymmetry of K that is still accepted (and symmetrised away).
_SYM_RTOL = 1e-10
# Iterations of "move every violator at once" before switching to one at a time.
_BULK_ITERS = 8
# Initial partition: |g| / max diag(K) below this, or alpha within
# (_INTERIOR·C, (1 − _INTERIOR)·C), counts as margin.
_G_DELTA = 1e-9
_INTERIOR = 1e-3
# Below this reciprocal condition number the bordered matrix is treated as singular.
_RCOND_MIN = 1e-14
# A singular system whose min-norm (SVD) solution leaves a residual (scaled
# system, O(1) entries) above this is inconsistent on that partition.
_SVD_ACCEPT = 1e-13


# --------------------------------------------------------------------------- #
# validation                                                                   #
# --------------------------------------------------------------------------- #


def _check_gram(K: object, name: str = "K") -> np.ndarray:
    """Return ``K`` as a symmetric float64 (n, n) array or raise ``ValueError``."""
    try:
        arr = np.asarray(K, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real (n, n) array, got {type(K).__name__}") from exc
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"{name} must be a 2-D square (n, n) array, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} must have n >= 1 rows (at least one token), got shape (0, 0)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, found {int(np.sum(~np.isfinite(arr)))} NaN/inf")
    scale = float(np.max(np.abs(arr)))
    asym = float(np.max(np.abs(arr - arr.T)))
    if asym > _SYM_RTOL * max(scale, 1e-300):
        raise ValueError(
            f"{name} must be symmetric: max |K - K^T| = {asym:.3g} exceeds "
            f"{_SYM_RTOL:g} * max |K| = {_SYM_RTOL * scale:.3g}"
        )
    if asym > 0.0:
        arr = 0.5 * (arr + arr.T)
    return arr


def _check_C(C: object, n: int | None = None) -> float | np.ndarray:
    if np.ndim(C) == 1 and not isinstance(C, (str, bytes)):
        box = np.asarray(C, dtype=np.float64)
        if (n is not None and box.shape != (n,)) or not np.all(np.isfinite(box) & (box > 0)):
            raise ValueError(f"C as per-token boxes must be {n or 'n'} finite numbers > 0")
        return box
    ok = not isinstance(C, bool) and isinstance(C, numbers.Real) and 0.0 < float(C) < math.inf
    if not ok:
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    return float(C)


def _check_alpha(alpha: object, n: int | None = None) -> np.ndarray:
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"alpha must be a 1-D array, got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"alpha must have length n = {n} (rows of K), got {a.shape[0]}")
    if not np.all(np.isfinite(a)):
        raise ValueError("alpha must be finite")
    return a


def _check_nonneg(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number >= 0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return v


def _g_size(diag: np.ndarray, g: np.ndarray, mu: float) -> np.ndarray:
    """Per-token size of the terms in ``g_i`` (kernels here are positive entrywise):
    ``K_ii + 2 (K alpha)_i + |mu| = 2 K_ii + g_i - mu + |mu|``, at least 1.

    Rounding in ``g_i`` is relative to this, so KKT violations are measured
    against it: with the exp kernel one huge diagonal entry must not make the
    conditions on every other token ~1e8 times looser.
    """
    return np.maximum(2.0 * diag + g - mu + abs(mu), 1.0)


def _at(C: float | np.ndarray, idx):
    return C if np.ndim(C) == 0 else C[idx]  # the box of the tokens idx


def _box_total(C: float | np.ndarray, idx: np.ndarray) -> float:
    return C * idx.size if np.ndim(C) == 0 else float(C[idx].sum())  # sum of idx's boxes


def _g_scale(diag: np.ndarray) -> float:
    """Scale of ``g``: ``max diag(K)`` (1 for rbf), or 1 when that is 0."""
    m = float(np.max(diag))
    return m if m > 0.0 else 1.0


# --------------------------------------------------------------------------- #
# public helpers                                                               #
# --------------------------------------------------------------------------- #


def partition(alpha: np.ndarray, C: float, atol: float = 0.0) -> dict[str, list[int]]:
    """Split token indices into margin, error and reserve sets.

    Parameters
    ----------
    alpha
        Coefficients, shape ``(n,)``.
    C
        Box bound (> 0).
    atol
        ``alpha_i <= atol`` counts as reserve, ``alpha_i >= C - atol`` as error.
        The default 0 reads the exact partition of :func:`solve_svdd`'s output,
        which has ``alpha`` exactly 0 on R and exactly C on E.

    Returns
    -------
    dict
        ``{"margin": [...], "error": [...], "reserve": [...]}``, each a sorted
        list of ``int`` indices. A token with ``alpha_i <= atol`` and
        ``alpha_i >= C - atol`` (only possible when ``C <= 2 atol``) is reserve.

    Examples
    --------
    >>> partition(np.array([0.0, 0.25, 0.5, 0.25]), C=0.5)
    {'margin': [1, 3], 'error': [2], 'reserve': [0]}
    """
    a = _check_alpha(alpha)
    Cf = _check_C(C, a.size)
    at = _check_nonneg(atol, "atol")
    res = a <= at
    err = (a >= Cf - at) & ~res
    mar = ~res & ~err
    return {
        "margin": [int(i) for i in np.flatnonzero(mar)],
        "error": [int(i) for i in np.flatnonzero(err)],
        "reserve": [int(i) for i in np.flatnonzero(res)],
    }


def svdd_objective(K: np.ndarray, alpha: np.ndarray) -> float:
    """The dual objective ``alpha^T K alpha - diag(K)^T alpha``.

    Examples
    --------
    >>> svdd_objective(np.eye(2), np.array([0.5, 0.5]))
    -0.5
    """
    Kc = _check_gram(K)
    a = _check_alpha(alpha, Kc.shape[0])
    return float(a @ (Kc @ a) - np.diag(Kc) @ a)


def _kkt_parts(
    K: np.ndarray, alpha: np.ndarray, mu: float, C: float, atol: float
) -> tuple[float, float]:
    """(primal violation, dual violation / scale) — inputs already validated."""
    diag = np.diag(K)
    g = 2.0 * (K @ alpha) - diag + mu
    g = g / _g_size(diag, g, mu)
    primal = max(
        abs(float(np.sum(alpha)) - 1.0),
        float(np.max(-alpha, initial=0.0)),
        float(np.max(alpha - C, initial=0.0)),
    )
    res = alpha <= atol
    err = (alpha >= C - atol) & ~res
    mar = ~res & ~err
    dual = max(
        float(np.max(np.abs(g[mar]), initial=0.0)),
        float(np.max(g[err], initial=0.0)),
        float(np.max(-g[res], initial=0.0)),
    )
    return primal, dual


def kkt_residual(
    K: np.ndarray, alpha: np.ndarray, mu: float, C: float, *, atol: float = 0.0
) -> float:
    """Largest violation of the SVDD constraints and KKT conditions.

    Computed from scratch: ``g = 2 K alpha - diag(K) + mu`` and the partition of
    ``alpha`` (as :func:`partition` with the same ``atol``). The result is the
    maximum of

    * the primal violations ``|sum(alpha) - 1|``, ``max(-alpha)``,
      ``max(alpha - C)`` (dimensionless), and
    * the dual violations ``|g_S|``, ``max(g_E, 0)``, ``max(-g_R, 0)``, each
      divided by the size of the terms of ``g_i``,
      ``K_ii + 2 (K alpha)_i + |mu|`` (at least 1), the scale its rounding
      error lives on.

    Parameters
    ----------
    K
        Symmetric PSD Gram matrix ``(n, n)``.
    alpha
        Coefficients ``(n,)``.
    mu
        Multiplier of ``sum(alpha) = 1``.
    C
        Box bound.
    atol
        Tolerance for reading the partition off ``alpha`` (default 0: exact).

    Returns
    -------
    float
        The residual; 0 at an exact optimum. It is not meaningful in the
        warm-up regime ``n·C < 1`` (no feasible point exists).

    Examples
    --------
    >>> K = np.eye(3)
    >>> alpha, mu = solve_svdd(K, 1.0, return_mu=True)
    >>> kkt_residual(K, alpha, mu, 1.0) < 1e-15
    True
    """
    Kc = _check_gram(K)
    a = _check_alpha(alpha, Kc.shape[0])
    Cf = _check_C(C, a.size)
    if isinstance(mu, bool) or not isinstance(mu, numbers.Real) or not math.isfinite(float(mu)):
        raise ValueError(f"mu must be a finite real number, got {mu!r}")
    at = _check_nonneg(atol, "atol")
    return max(_kkt_parts(Kc, a, float(mu), Cf, at))


# --------------------------------------------------------------------------- #
# stage 1: approximate solve                                                   #
# --------------------------------------------------------------------------- #


def _clarabel_solve(Ks: np.ndarray, C: float) -> tuple[np.ndarray, float]:
    """Approximate ``(alpha, mu)`` from Clarabel on the (scaled) Gram matrix ``Ks``."""
    import clarabel

    n = Ks.shape[0]
    P = scipy.sparse.csc_matrix(np.triu(2.0 * Ks))
    q = -np.diag(Ks).copy()
    eye = scipy.sparse.identity(n, format="csc")
    A = scipy.sparse.vstack([scipy.sparse.csc_matrix(np.ones((1, n))), -eye, eye], format="csc")
    b = np.concatenate([[1.0], np.zeros(n), np.full(n, C)])
    cones = [clarabel.ZeroConeT(1), clarabel.NonnegativeConeT(2 * n)]
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs = 1e-11
    settings.tol_gap_rel = 1e-11
    settings.tol_feas = 1e-11
    settings.tol_ktratio = 1e-9
    settings.max_iter = 200
    sol = clarabel.DefaultSolver(P, q, A, b, cones, settings).solve()
    x = np.asarray(sol.x, dtype=np.float64)
    if x.shape != (n,) or not np.all(np.isfinite(x)):
        raise RuntimeError(f"Clarabel returned no usable solution (status {sol.status})")
    # Stationarity reads 2 Ks x - d + z_0 1 - z_low + z_up = 0, so z_0 is mu.
    mu = float(sol.z[0])
    return x, (mu if math.isfinite(mu) else 0.0)


# --------------------------------------------------------------------------- #
# stage 2: exact active-set polish                                             #
# --------------------------------------------------------------------------- #


def _solve_bordered(
    K: np.ndarray, diag: np.ndarray, S: np.ndarray, E: np.ndarray, C: float
) -> tuple[np.ndarray, float, np.ndarray | None]:
    """Solve ``[[2K_SS, 1], [1^T, 0]] [a_S; mu] = [d_S - 2C K_SE 1; 1 - C|E|]``.

    The system is first equilibrated: with ``D = diag(2 K_SS)^(1/2)`` and a
    scalar ``s`` it becomes ``[[D^-1 2K_SS D^-1, s D^-1 1], [s 1^T D^-1, 0]]
    [D a_S; mu / s] = [D^-1 rhs_S; s rhs_last]`` (unit diagonal, balanced
    border), which matters for the exp kernel whose diagonal spans many orders
    of magnitude. Then Bunch–Kaufman LDL^T with two steps of iterative
    refinement. When that matrix is numerically singular (duplicate or
    near-duplicate keys on the margin) a minimum-norm least-squares solution
    (SVD) is used instead, also refined, when that solves the system (it is
    consistent); otherwise the exact (huge) solution, see the comment below.
    Every solution of a singular but consistent system gives the
    same ``g`` on all tokens (``K`` is PSD), so the choice only affects how
    ``alpha`` is split between copies.

    Returns ``(alpha_S, mu, None)``, or ``(alpha_S, mu, direction)`` when the
    system is inconsistent, with ``direction`` a null direction of the face.
    """
    m = S.size
    A = 2.0 * K[np.ix_(S, S)]
    dA = np.sqrt(np.clip(np.diag(A), 0.0, None))
    dA[~(dA > 0.0)] = 1.0
    u = 1.0 / dA
    sb = 1.0 / float(np.max(u))
    M = np.empty((m + 1, m + 1))
    M[:m, :m] = A / np.outer(dA, dA)
    M[:m, m] = sb * u
    M[m, :m] = sb * u
    M[m, m] = 0.0
    rhs = np.empty(m + 1)
    KSE = K[np.ix_(S, E)]
    rhs[:m] = (diag[S] - 2.0 * (C * KSE.sum(axis=1) if np.ndim(C) == 0 else KSE @ C[E])) * u
    rhs[m] = sb * (1.0 - _box_total(C, E))

    def refine(solver) -> tuple[np.ndarray, float]:
        x = solver(rhs)
        for _ in range(2):
            x = x + solver(rhs - M @ x)
        r = float(np.max(np.abs(rhs - M @ x)))
        return x, (r if np.all(np.isfinite(x)) else math.inf)

    ldl = None
    ldu, ipiv, info = scipy.linalg.lapack.dsytrf(M, lower=1)
    if info == 0:

        def ldl_solve(v: np.ndarray) -> np.ndarray:
            return scipy.linalg.lapack.dsytrs(ldu, ipiv, v[:, None], lower=1)[0][:, 0]

        anorm = float(np.max(np.sum(np.abs(M), axis=0)))
        rcond, info = scipy.linalg.lapack.dsycon(ldu, ipiv, anorm, lower=1)
        ldl = refine(ldl_solve)
        if info == 0 and rcond > _RCOND_MIN and ldl[1] < math.inf:
            x = ldl[0]
            return x[:m] * u, float(x[m]) * sb, None

    try:
        U, sv, Vt = np.linalg.svd(M)
    except np.linalg.LinAlgError:
        # LAPACK's divide-and-conquer driver (gesdd) occasionally fails to
        # converge on near-singular matrices; the QR-iteration driver does not
        U, sv, Vt = scipy.linalg.svd(M, lapack_driver="gesvd")
    cut = sv[0] * (m + 1) * np.finfo(np.float64).eps
    inv_s = np.where(sv > cut, 1.0 / np.where(sv > cut, sv, 1.0), 0.0)
    x, res = refine(lambda v: Vt.T @ (inv_s * (U.T @ v)))
    if res > _SVD_ACCEPT:
        # Inconsistent on this partition: the right-hand side has a component
        # along a (near-)null direction of the matrix, i.e. the objective is
        # linear along it (near-duplicate keys on the margin). The face has no
        # finite optimum; report the direction (alpha part, sum 0) so that the
        # polish can walk along it to a bound. Its sign is left to the caller:
        # the curvature along it is rounding noise.
        v = Vt[-1]
        return x[:m] * u, float(x[m]) * sb, v[:m] * u
    return x[:m] * u, float(x[m]) * sb, None


def _initial_state(
    K: np.ndarray, diag: np.ndarray, C: float, alpha0: np.ndarray, mu0: float
) -> np.ndarray:
    """Partition guess (0 = reserve, 1 = margin, 2 = error) from an approximate solve.

    Read off ``g`` rather than ``alpha``: on badly scaled problems an interior
    point solution sits far (relative to C) from the bounds while ``g`` already
    separates the sets cleanly. A token is margin when ``|g| <= delta`` or when
    ``alpha`` is clearly interior; otherwise the sign of ``g`` decides.
    """
    scale = _g_scale(diag)
    g0 = (2.0 * (K @ alpha0) - diag) / scale + mu0
    state = np.where(g0 > 0.0, 0, 2).astype(np.int8)
    interior = (alpha0 > _INTERIOR * C) & (alpha0 < (1.0 - _INTERIOR) * C)
    state[(np.abs(g0) <= _G_DELTA) | interior] = 1
    return state


def _project_capped_simplex(v: np.ndarray, C: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{sum(x) = 1, 0 <= x <= C}`` (bisection)."""
    lo, hi = float(np.min(v)) - 1.0, float(np.max(v))  # sum(clip(v - tau)) >= 1 at lo, 0 at hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.clip(v - mid, 0.0, C).sum() >= 1.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-17 * max(1.0, abs(lo)):
            break
    return np.clip(v - lo, 0.0, C)


def _eqp(
    K: np.ndarray, diag: np.ndarray, state: np.ndarray, C: float
) -> tuple[np.ndarray, float, np.ndarray | None] | None:
    """Optimum on the face given by ``state``: ``(alpha, mu, None)``; with a null
    direction (on all n tokens) instead of None when the face has no finite
    optimum; None when S is empty and ``C·|E| != 1`` (no point of the face
    satisfies ``sum = 1``)."""
    n = K.shape[0]
    S = np.flatnonzero(state == 1)
    E = np.flatnonzero(state == 2)
    alpha = np.zeros(n)
    alpha[E] = _at(C, E)
    if S.size == 0:
        if abs(1.0 - _box_total(C, E)) > 1e-12:
            return None
        grad = 2.0 * (K @ alpha) - diag
        return alpha, mu_for_empty_margin(grad[E]), None
    aS, mu, dS = _solve_bordered(K, diag, S, E, C)
    alpha[S] = aS
    if dS is None:
        return alpha, mu, None
    direction = np.zeros(n)
    direction[S] = dS
    return alpha, mu, direction


def _polish(
    K: np.ndarray,
    C: float,
    state: np.ndarray,
    tol: float,
    max_polish: int,
    alpha0: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Exact active-set polish from the partition guess ``state``.

    Phase 1 ("bulk") moves every violator at once; it converges in one or two
    solves from a good guess. If it has not converged after ``_BULK_ITERS``
    solves or revisits a partition, phase 2 runs a textbook primal active-set
    method from a feasible point (the last in-box iterate, or the projection of
    ``alpha0``): step towards the face optimum until the first margin token hits
    a bound (it joins E or R; ties: lowest index), or, at a face optimum, free
    the worst KKT violator (ties: lowest index). Phase 2 decreases the objective
    monotonically, so it does not cycle except through zero-length steps.
    """
    n = K.shape[0]
    diag = np.diag(K).copy()
    state = state.copy()
    last_res = math.inf

    def dual_violators(alpha: np.ndarray, mu: float, st: np.ndarray):
        g = 2.0 * (K @ alpha) - diag + mu
        gtol = tol * _g_size(diag, g, mu)
        E = np.flatnonzero(st == 2)
        R = np.flatnonzero(st == 0)
        S = np.flatnonzero(st == 1)
        e_bad = E[g[E] > gtol[E]]
        r_bad = R[g[R] < -gtol[R]]
        gs = g / (gtol / tol)
        res = max(
            float(np.max(np.abs(gs[S]), initial=0.0)),
            float(np.max(gs[E], initial=0.0)),
            float(np.max(-gs[R], initial=0.0)),
        )
        res = max(res, abs(float(alpha.sum()) - 1.0))
        return g, e_bad, r_bad, res

    def worst(g: np.ndarray, e_bad: np.ndarray, r_bad: np.ndarray) -> int:
        viol = np.concatenate([g[e_bad], -g[r_bad]])
        idx = np.concatenate([e_bad, r_bad])
        return int(idx[np.lexsort((idx, -viol))[0]])

    def accept(alpha: np.ndarray, mu: float, res: float, st: np.ndarray):
        if res <= tol:
            return alpha, float(mu)
        raise RuntimeError(
            f"solve_svdd: bordered solve on the final partition leaves KKT residual "
            f"{res:.3g} > tol {tol:g} (K_SS too ill-conditioned? n={n}, "
            f"|S|={int(np.sum(st == 1))})"
        )

    # ---- phase 1: bulk moves -------------------------------------------------
    seen: set[bytes] = set()
    feasible: tuple[np.ndarray, np.ndarray] | None = None  # (alpha, state)
    it = 0
    while it < min(_BULK_ITERS, max_polish):
        sig = state.tobytes()
        if sig in seen:
            break
        seen.add(sig)
        it += 1
        sol = _eqp(K, diag, state, C)
        if sol is None or sol[2] is not None:
            break
        alpha, mu, _ = sol
        S = np.flatnonzero(state == 1)
        low = S[alpha[S] < 0.0]
        high = S[alpha[S] > _at(C, S)]
        g, e_bad, r_bad, last_res = dual_violators(alpha, mu, state)
        if low.size == 0 and high.size == 0:
            if e_bad.size == 0 and r_bad.size == 0:
                return accept(alpha, mu, last_res, state)
            feasible = (alpha, state.copy())
        state[low] = 0
        state[high] = 2
        state[e_bad] = 1
        state[r_bad] = 1

    # ---- phase 2: primal active set from a feasible point -------------------
    if feasible is not None:
        x, state = feasible[0].copy(), feasible[1].copy()
    else:
        x = _project_capped_simplex(alpha0, C)
        state = np.ones(n, dtype=np.int8)
        state[x <= 0.0] = 0
        state[x >= C] = 2
    while it < max_polish:
        it += 1
        S = np.flatnonzero(state == 1)
        sol = _eqp(K, diag, state, C)
        if sol is None:
            # S empty but the face misses sum = 1 (x sits on it only up to
            # rounding): free the bound token whose gradient favours it most.
            grad = 2.0 * (K @ x) - diag
            E = np.flatnonzero(state == 2)
            R = np.flatnonzero(state == 0)
            if _box_total(C, E) < 1.0:
                j = int(R[np.argmin(grad[R])])
            else:
                j = int(E[np.argmax(grad[E])])
            state[j] = 1
            continue
        xs, mu, direction = sol
        if direction is not None:
            # no finite face optimum: walk along the descent sign of the null
            # direction (objective linear there) to the first bound
            grad = 2.0 * (K @ x) - diag
            p = -direction if float(grad @ direction) > 0.0 else direction
        else:
            p = xs - x
        out = S[(xs[S] < 0.0) | (xs[S] > _at(C, S))] if direction is None else S
        if out.size:
            # ratio test: first margin token to hit a bound along x -> xs
            pS = p[S]
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(pS < 0.0, x[S] / -pS,
                             np.where(pS > 0.0, (_at(C, S) - x[S]) / pS, np.inf))
            t = np.clip(t, 0.0, None)
            k = int(np.lexsort((S, t))[0])
            j, step = int(S[k]), float(t[k])
            x = np.clip(x + step * p, 0.0, C)
            to_error = pS[k] > 0.0
            x[j] = _at(C, j) if to_error else 0.0
            state[j] = 2 if to_error else 0
            continue
        x = xs
        g, e_bad, r_bad, last_res = dual_violators(xs, mu, state)
        if e_bad.size == 0 and r_bad.size == 0:
            return accept(xs, mu, last_res, state)
        state[worst(g, e_bad, r_bad)] = 1

    raise RuntimeError(
        f"solve_svdd: active-set polish did not converge in max_polish={max_polish} "
        f"iterations (n={n}, C={C!r:.60}, last KKT residual {last_res:.3g}, tol {tol:g})"
    )


# --------------------------------------------------------------------------- #
# public solver                                                                #
# --------------------------------------------------------------------------- #


def solve_svdd(
    K: np.ndarray,
    C: float,
    *,
    tol: float = 1e-12,
    return_mu: bool = False,
    max_polish: int | None = None,
) -> np.ndarray | tuple[np.ndarray, float]:
    """Exact SVDD dual solution from scratch (the oracle).

    Minimises ``alpha^T K alpha - diag(K)^T alpha`` subject to
    ``sum(alpha) = 1`` and ``0 <= alpha <= C``: Clarabel for an approximate
    optimum, then an exact active-set polish on the bordered margin system
    until the KKT residual (see :func:`kkt_residual`) is at most ``tol``.

    Parameters
    ----------
    K
        Symmetric positive semi-definite Gram matrix, shape ``(n, n)``, ``n >= 1``.
        Asymmetry up to ``1e-10 · max|K|`` is accepted and symmetrised away.
    C
        Box bound, finite and ``> 0``; or one box per token (1-D: ``0 <= alpha_i <= C_i``,
        ``SVDD``'s ``sample_weight``; ``sum(C) < 1``: ``alpha = C / sum(C)``, ``mu = 0``).
    tol
        Target KKT residual; dual violations are measured relative to
        ``max(diag(K))``.
    return_mu
        Also return the multiplier ``mu`` of ``sum(alpha) = 1``.
    max_polish
        Cap on active-set iterations (default ``20 + 2 n``).

    Returns
    -------
    alpha : numpy.ndarray
        Shape ``(n,)``, float64; exactly 0 on the reserve set and exactly ``C``
        on the error set.
    mu : float
        Only with ``return_mu=True``. When the margin set is empty it follows
        :func:`svattn.exact.core.conventions.mu_for_empty_margin`.

    Notes
    -----
    Warm-up: when ``n·C < 1`` (see :func:`svattn.exact.core.conventions.is_feasible`)
    no feasible point exists and the convention state is returned: uniform
    ``alpha = 1/n`` and ``mu = 0``.

    When ``K_SS`` is singular (duplicate keys on the margin) ``alpha`` is not
    unique; ``K alpha``, ``mu`` and the objective still are.

    Raises
    ------
    ValueError
        On malformed input (``K`` not a finite symmetric square matrix, ``n = 0``,
        ``C`` not finite and positive, ``tol`` negative).
    RuntimeError
        If the polish does not reach ``tol`` within ``max_polish`` iterations
        or cycles.

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact.core.kernels import kernel_matrix
    >>> x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.1, 0.1]])
    >>> K = kernel_matrix(x, x, "rbf", 0.5)
    >>> alpha, mu = solve_svdd(K, 0.4, return_mu=True)
    >>> float(alpha.sum())
    1.0
    >>> partition(alpha, 0.4)
    {'margin': [0], 'error': [1, 2], 'reserve': [3]}
    >>> kkt_residual(K, alpha, mu, 0.4) < 1e-12
    True
    >>> solve_svdd(K, 0.1)  # n·C < 1: warm-up convention
    array([0.25, 0.25, 0.25, 0.25])
    """
    Kc = _check_gram(K)
    Cf = _check_C(C, Kc.shape[0])
    tolf = _check_nonneg(tol, "tol")
    n = Kc.shape[0]
    if max_polish is None:
        cap = 20 + 2 * n
    else:
        if isinstance(max_polish, bool) or not isinstance(max_polish, numbers.Integral):
            raise ValueError(f"max_polish must be an int >= 1, got {max_polish!r}")
        cap = int(max_polish)
        if cap < 1:
            raise ValueError(f"max_polish must be an int >= 1, got {max_polish!r}")

    if not (is_feasible(n, Cf) if np.ndim(Cf) == 0 else Cf.sum() >= 1.0 - FEASIBILITY_SLACK):
        alpha, mu = (np.full(n, 1.0 / n) if np.ndim(Cf) == 0 else Cf / Cf.sum()), 0.0
    else:
        diag = np.diag(Kc)
        if n == 1:  # the only feasible point; the polish reads off its set and mu
            alpha0 = np.ones(1)
            state = np.array([2 if _at(Cf, 0) <= 1.0 else 1], dtype=np.int8)
        else:
            alpha0, mu0 = _clarabel_solve(Kc / _g_scale(diag), Cf)
            state = _initial_state(Kc, diag, Cf, alpha0, mu0)
        alpha, mu = _polish(Kc, Cf, state, tolf, cap, alpha0)

    if return_mu:
        return alpha, float(mu)
    return alpha
