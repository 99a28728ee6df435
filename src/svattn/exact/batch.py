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


@dataclass(frozen=True)
class BatchSolution:
    """Exact optimum of the SVDD dual on a fixed token set."""

    alpha: np.ndarray
    mu: float
    margin: np.ndarray  # the free indices of the final solve (alpha may sit at a bound)
    error: np.ndarray  # indices with alpha = U
    reserve: np.ndarray  # indices with alpha = 0


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
    """
    n = K.shape[0]
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
            return BatchSolution(alpha, mu, S, E, R)
        state[worst] = 1  # release the bound whose multiplier is wrong
    raise RuntimeError(
        f"active-set finish did not converge in {max_iter} moves (n={n}); "
        "the problem is probably degenerate (near-duplicate keys)"
    )


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
