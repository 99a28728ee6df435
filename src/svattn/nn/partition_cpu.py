"""The partition search on CPU in eager mode as compiled loops (numba): FISTA and the repair.

:func:`svattn.nn.batched.fista` on CPU in eager mode (where
:func:`~svattn.nn.common.host_reads` allows) hands its iterations to :func:`fista_loop`:
the same method — gradient step ``y − step·(2 y K − d)`` (one BLAS gemv per problem),
exact projection onto the capped simplex (warm-started safeguarded Newton, as
:meth:`svattn.nn.projection.ProjectionPlan._project_newton`), the gradient-based
adaptive restart, momentum from the same ``beta`` table, and the CPU stop once no
problem's partition changed over ``check`` iterations — run over all problems inside
one numba function on the tensors' memory. In the op-by-op form each iteration
launched ~70 small tensor ops on ``(P, 1, n)`` rows (each a few µs of dispatch for a
few µs of arithmetic); here a solve is a handful of torch ops whatever ``max_iter``
is. Results agree with the op-by-op form to rounding (summation order), which is what
the accelerator's static schedule also differs by.

:func:`repair_loop` is :func:`svattn.nn.batched._repair`'s active-set rounds the same
way: per problem, the margin system on its own ``S`` (one LU with partial pivoting of
size ``|S| + 1``, iterated-ridge steps on its factors), ``g = 2 K alpha − d + mu``, the moves
between ``S``, ``E`` and ``R``, and a stop at the first settled round (a round on a
settled partition moves nothing, so stopping there is the static schedule's result).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["MASS_SLACK", "fista_loop", "lu_factor_small", "lu_solve_small", "repair_loop"]

# |C·|E| − 1| above which a partition without margin tokens does not hold the mass
# (FEASIBILITY_SLACK of svattn.exact.core.conventions).
MASS_SLACK = 1e-12


@njit(cache=True, nogil=True)
def _project(v, valid, C, tau, eps):  # pragma: no cover - compiled
    """Capped-simplex projection of one row; returns (x, tau). Safeguarded Newton."""
    n = v.shape[0]
    m = 0
    lo = np.inf
    hi = -np.inf
    for i in range(n):
        if valid[i]:
            m += 1
            if v[i] < lo:
                lo = v[i]
            if v[i] > hi:
                hi = v[i]
    lo -= C  # f(lo) = m·C − 1 >= 0, f(hi) = −1 < 0
    if tau < lo:
        tau = lo
    if tau > hi:
        tau = hi
    tol = 8.0 * eps * m
    for _ in range(100):
        f = -1.0
        nf = 0
        n_up = 0
        s_free = 0.0
        for i in range(n):
            if valid[i]:
                u = v[i] - tau
                if u >= C:
                    f += C
                    n_up += 1
                elif u > 0.0:
                    f += u
                    nf += 1
                    s_free += v[i]
        if abs(f) <= tol:
            break
        if f > 0:
            lo = tau
        if f < 0:
            hi = tau
        newton = (s_free + C * n_up - 1.0) / max(nf, 1)
        if nf > 0 and lo < newton < hi:
            tau = newton
        else:
            tau = 0.5 * (lo + hi)
    x = np.zeros_like(v)
    for i in range(n):
        if valid[i]:
            u = v[i] - tau
            x[i] = C if u >= C else (u if u > 0.0 else 0.0)
    return x, tau


@njit(cache=True, nogil=True)
def _steps(K, n_iter):  # pragma: no cover - compiled
    """1 / (2 λmax) per problem, as :func:`svattn.nn.batched.lambda_max` computes λmax."""
    P, n, _ = K.shape
    step = np.empty(P, dtype=K.dtype)
    for p in range(P):
        x = np.ones(n, dtype=K.dtype)
        y = np.dot(K[p], x)
        rowmax = y.max()
        lam = 0.0
        for it in range(max(n_iter, 1)):
            if it:
                y = np.dot(K[p], x)
            lam = np.dot(x, y) / max(np.dot(x, x), 1e-300)
            nrm = max(np.sqrt(np.dot(y, y)), 1e-300)
            for j in range(n):
                x[j] = y[j] / nrm
        step[p] = 0.5 / max(min(1.05 * lam, rowmax), 1e-12)
    return step


@njit(cache=True, nogil=True)
def _iterate(K, d, a, y, valid, C, betas, step, tau, r, p, it0, it1, eps):  # pragma: no cover
    """Iterations ``it0 + 1 .. it1`` of problem ``p`` (its rows of ``a``, ``y``, ``tau``,
    ``r`` updated in place)."""
    n = a.shape[1]
    Kp, dp, ap, yp, validp = K[p], d[p], a[p], y[p], valid[p]
    for it in range(it0 + 1, it1 + 1):
        v = np.dot(yp, Kp)  # y K (BLAS gemv); the step: y − step·(2 y K − d)
        m2 = -2.0 * step[p]
        for j in range(n):
            v[j] = yp[j] + step[p] * dp[j] + m2 * v[j]
        if it == 1:  # the Newton start when no entry is clipped: (Σ v − 1) / m
            t0 = 0.0
            m = 0
            for j in range(n):
                if validp[j]:
                    t0 += v[j]
                    m += 1
            tau[p] = (t0 - 1.0) / max(m, 1)
        x, t = _project(v, validp, C, tau[p], eps)
        tau[p] = t
        # Adaptive restart: momentum off where it points uphill.
        up = 0.0
        for j in range(n):
            up += (yp[j] - x[j]) * (x[j] - ap[j])
        r[p] = 0 if up > 0 else r[p] + 1
        beta = betas[r[p]]
        for j in range(n):
            diff = x[j] - ap[j]
            yp[j] = x[j] + beta * diff
            ap[j] = x[j]


@njit(cache=True, nogil=True)
def _loop(K, d, a, valid, C, betas, max_iter, check, eps):  # pragma: no cover
    """All problems' iterations, problem by problem within each run of ``check``
    iterations (one problem's ``K`` stays in cache over the run; the problems are
    independent between the checks), then the stop check over all of them."""
    P, n = a.shape
    step = _steps(K, 4)
    y = a.copy()
    tau = np.zeros(P, dtype=a.dtype)
    r = np.zeros(P, dtype=np.int64)
    S_old = np.zeros((P, n), dtype=np.bool_)
    E_old = np.zeros((P, n), dtype=np.bool_)
    if check:
        for p in range(P):
            for i in range(n):
                S_old[p, i] = valid[p, i] and 0.0 < a[p, i] < C
                E_old[p, i] = valid[p, i] and a[p, i] >= C
    block = check if check else max_iter
    it = 0
    while it < max_iter:
        it_next = min(it + block, max_iter)
        for p in range(P):
            _iterate(K, d, a, y, valid, C, betas, step, tau, r, p, it, it_next, eps)
        it = it_next
        if check and it % check == 0:
            same = True
            for p in range(P):
                for i in range(n):
                    s_new = valid[p, i] and 0.0 < a[p, i] < C
                    e_new = valid[p, i] and a[p, i] >= C
                    if s_new != S_old[p, i] or e_new != E_old[p, i]:
                        same = False
                    S_old[p, i] = s_new
                    E_old[p, i] = e_new
            if same:
                break
    return it


def fista_loop(
    K: torch.Tensor,
    d: torch.Tensor,
    a: torch.Tensor,
    valid: torch.Tensor,
    C: float,
    betas: list[float],
    max_iter: int,
    check: int,
) -> tuple[torch.Tensor, int]:
    """FISTA's iterations on CPU tensors: kernel matrices ``K`` (P, n, n) (zero on absent
    keys), diagonals ``d`` (P, n), feasible start ``a`` (P, n) (the step ``1/(2 λmax)``
    from the same 4-step power iteration as :func:`svattn.nn.batched.lambda_max`),
    ``valid`` (P, n) bool, ``betas[r]`` the momentum ``r`` iterations after a restart.
    Returns the last iterate (a new tensor) and the iterations run: all ``max_iter``, or
    fewer where no partition changed over ``check`` iterations (``check = 0``: never)."""
    dt = K.dtype
    out = a.to(dt).contiguous().clone()
    it = _loop(K.contiguous().numpy(), d.to(dt).contiguous().numpy(),
               out.numpy(), valid.contiguous().numpy(),
               float(C), np.asarray(betas, dtype=np.float64 if dt == torch.float64 else
                                    np.float32),
               int(max_iter), int(check), float(torch.finfo(dt).eps))
    return out, int(it)


@njit(cache=True, nogil=True)
def lu_factor_small(M, piv):  # pragma: no cover - compiled
    """In-place LU with partial pivoting of a small square ``M`` (LAPACK getrf's method);
    a call to LAPACK costs more than the arithmetic at the repair's sizes. Returns
    whether every pivot is nonzero (LAPACK's ``info == 0``): :func:`lu_solve_small`
    divides by them."""
    m = M.shape[0]
    nonsingular = True
    for k in range(m):
        p = k
        best = abs(M[k, k])
        for i in range(k + 1, m):
            if abs(M[i, k]) > best:
                best = abs(M[i, k])
                p = i
        piv[k] = p
        if p != k:
            for j in range(m):
                t = M[k, j]
                M[k, j] = M[p, j]
                M[p, j] = t
        if M[k, k] == 0.0:
            nonsingular = False
        inv = 1.0 / M[k, k] if M[k, k] != 0.0 else 0.0
        for i in range(k + 1, m):
            f = M[i, k] * inv
            M[i, k] = f
            if f != 0.0:
                for j in range(k + 1, m):
                    M[i, j] -= f * M[k, j]
    return nonsingular


@njit(cache=True, nogil=True)
def lu_solve_small(M, piv, b):  # pragma: no cover - compiled
    """Solve with the factors of :func:`lu_factor_small` (every pivot nonzero: its
    return); ``b`` is overwritten by the solution."""
    m = M.shape[0]
    for k in range(m):
        p = piv[k]
        if p != k:
            t = b[k]
            b[k] = b[p]
            b[p] = t
    for i in range(m):
        acc = b[i]
        for j in range(i):
            acc -= M[i, j] * b[j]
        b[i] = acc
    for i in range(m - 1, -1, -1):
        acc = b[i]
        for j in range(i + 1, m):
            acc -= M[i, j] * b[j]
        b[i] = acc / M[i, i]


@njit(cache=True, nogil=True)
def _hold_the_mass(S, E, valid, g, C):  # pragma: no cover - compiled
    """With ``S`` empty only ``C·|E|`` holds the mass: where it misses 1, the token that
    gains most joins ``S`` (an R token of least ``g`` when short, the E token of largest
    ``g`` when over), as :func:`svattn.nn.batched._hold_the_mass`. Returns whether it moved."""
    nE = 0
    for i in range(S.shape[0]):
        if S[i]:
            return False
        nE += E[i]
    short = C * nE < 1.0 - MASS_SLACK
    if not short and C * nE <= 1.0 + MASS_SLACK:
        return False
    best = -1
    for i in range(S.shape[0]):
        if short and valid[i] and not E[i] and (best < 0 or g[i] < g[best]):
            best = i
        elif not short and E[i] and (best < 0 or g[i] > g[best]):
            best = i
    if best < 0:
        return False
    S[best] = True
    E[best] = False
    return True


@njit(cache=True, nogil=True)
def _repair(K, d, valid, S, E, C, ridge, ridge_steps, refine, tol, settled):  # pragma: no cover
    """The rounds of :func:`repair_loop`, ``settled`` (P,) written. Returns the first
    problem whose margin system has a zero pivot (singular in ``K``'s precision: the
    rounds stop there), or -1."""
    P, n = S.shape
    settled[:] = True
    dt = K.dtype
    big = np.finfo(dt).max
    alpha = np.empty(n, dtype=dt)
    for p in range(P):
        Kp = K[p]
        for _ in range(refine):
            idx = np.nonzero(S[p])[0]
            s = idx.shape[0]
            nE = 0
            for i in range(n):
                nE += E[p, i]
            for i in range(n):
                alpha[i] = C if E[p, i] else 0.0
            mu = 0.0
            if s > 0:
                M = np.zeros((s + 1, s + 1), dtype=dt)
                rhs = np.empty(s + 1, dtype=dt)
                for a in range(s):
                    ia = idx[a]
                    for b in range(s):
                        M[a, b] = 2.0 * Kp[ia, idx[b]]
                    M[a, a] += ridge
                    M[a, s] = 1.0
                    M[s, a] = 1.0
                    ke = 0.0
                    for i in range(n):
                        if E[p, i]:
                            ke += Kp[ia, i]
                    rhs[a] = d[p, ia] - 2.0 * C * ke
                rhs[s] = 1.0 - C * nE
                piv = np.empty(s + 1, dtype=np.int64)
                if not lu_factor_small(M, piv):
                    settled[p] = False
                    return p
                z = rhs.copy()
                lu_solve_small(M, piv, z)
                if ridge > 0:
                    for _step in range(ridge_steps):  # iterated ridge on the same factors
                        r2 = rhs.copy()
                        for a in range(s):
                            r2[a] += ridge * z[a]
                        lu_solve_small(M, piv, r2)
                        z = r2
                for a in range(s):
                    alpha[idx[a]] = z[a]
                mu = z[s]
            g = 2.0 * np.dot(Kp, alpha) - d[p]  # K symmetric: K alpha
            if s == 0:  # the largest mu that keeps E's tokens at C
                mu = big
                for i in range(n):
                    if E[p, i] and -g[i] < mu:
                        mu = -g[i]
            same = True
            for i in range(n):
                gi = g[i] + mu
                up = gi > tol
                down = gi < -tol
                if S[p, i]:
                    s_new = 0.0 <= alpha[i] <= C
                    e_new = alpha[i] > C
                elif E[p, i]:
                    s_new = up
                    e_new = not up
                else:
                    s_new = down and valid[p, i]
                    e_new = False
                if s_new != S[p, i] or e_new != E[p, i]:
                    same = False
                S[p, i] = s_new
                E[p, i] = e_new
            if _hold_the_mass(S[p], E[p], valid[p], g, C):
                same = False
            settled[p] = same
            if same:
                break
    return -1


def repair_loop(
    K: torch.Tensor,
    d: torch.Tensor,
    valid: torch.Tensor,
    S: torch.Tensor,
    E: torch.Tensor,
    C: float,
    ridge: float,
    ridge_steps: int,
    refine: int,
    tol: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Up to ``refine`` active-set rounds per problem from the sets ``S``, ``E`` (P, n) on
    CPU tensors (``K`` (P, n, n), ``d`` (P, n)). Returns the new ``S``, ``E`` and
    ``settled`` (P,): whether the problem's last round moved nothing.

    Raises
    ------
    ValueError
        A margin system has a zero pivot in ``K``'s precision: a ``ridge`` below the
        keys' working precision, on duplicate keys.
    """
    S2, E2 = S.contiguous().clone(), E.contiguous().clone()
    dt = K.dtype
    settled = np.empty(S2.shape[0], dtype=np.bool_)
    singular = _repair(K.contiguous().numpy(), d.to(dt).contiguous().numpy(),
                       valid.contiguous().numpy(), S2.numpy(), E2.numpy(), float(C),
                       float(ridge), int(ridge_steps), int(refine), float(tol), settled)
    if singular >= 0:
        raise ValueError(
            f"SolverOptions ridge={ridge!r} is too small for the 'approximate' finish on "
            f"{dt} keys: the ridged margin system of problem {singular} is singular in "
            f"that precision (on duplicate keys; e.g. 1e-6 for float32, 1e-14 for "
            f"float64, or finish='optimum', which needs no ridge)")
    return S2, E2, torch.from_numpy(settled)
