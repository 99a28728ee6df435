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
    margin: np.ndarray  # indices with 0 < alpha < U
    error: np.ndarray  # indices with alpha = U
    reserve: np.ndarray  # indices with alpha = 0


def smo(K: np.ndarray, diag: np.ndarray, U: np.ndarray, *, gap_tol: float,
        max_iter: int) -> np.ndarray:
    """Sequential minimal optimisation with second-order working-set selection.

    Pairs are picked as in libsvm (Fan, Chen & Lin 2005, WSS 2): the index
    that most wants to grow, and the partner that gives the largest decrease
    of the objective. Stops when the maximal KKT gap is below ``gap_tol``.
    """
    # a feasible start: fill the largest bounds first
    a = np.zeros(len(U))
    left = 1.0
    for i in np.argsort(-U, kind="stable"):
        a[i] = min(U[i], left)
        left -= a[i]
        if left <= 0:
            break
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
        score = np.where(can_down & (b > 0), b * b / eta, -np.inf)
        j = int(np.argmax(score))
        step = min(b[j] / (2.0 * eta[j]), U[i] - a[i], a[j])
        a[i] += step
        a[j] -= step
        grad += (2.0 * step) * (K[i] - K[j])
    return a


def _bordered_solve(K, diag, U, S, E) -> tuple[np.ndarray, float]:
    """alpha_S and mu from g_S = 0 and sum(alpha) = 1 with alpha_E = U_E."""
    m = len(S)
    Q = np.empty((m + 1, m + 1))
    Q[0, 0] = 0.0
    Q[0, 1:] = 1.0
    Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K[np.ix_(S, S)]
    rhs = np.empty(m + 1)
    rhs[0] = 1.0 - U[E].sum()
    rhs[1:] = diag[S] - 2.0 * (K[np.ix_(S, E)] @ U[E])
    x = np.linalg.solve(Q, rhs)
    x += np.linalg.solve(Q, rhs - Q @ x)  # one step of iterative refinement
    return x[1:], float(x[0])


def active_set_finish(K: np.ndarray, diag: np.ndarray, U: np.ndarray, alpha0: np.ndarray, *,
                      tol: float, max_iter: int) -> BatchSolution:
    """Exact optimum from an approximate one.

    Reads the partition off ``alpha0``, solves the bordered KKT system on it,
    and moves the worst violator of the KKT conditions until none is left.
    """
    n = K.shape[0]
    edge = 1e-9 * U
    state = np.where(alpha0 >= U - edge, 2, np.where(alpha0 <= edge, 0, 1))  # 0 R, 1 S, 2 E
    for _ in range(max_iter):
        S = np.flatnonzero(state == 1)
        E = np.flatnonzero(state == 2)
        alpha = np.zeros(n)
        alpha[E] = U[E]
        if len(S):
            alpha_S, mu = _bordered_solve(K, diag, U, S, E)
            alpha[S] = alpha_S
            grad = 2.0 * (K @ alpha) - diag
        else:
            grad = 2.0 * (K @ alpha) - diag
            if len(E) == 0 or abs(U[E].sum() - 1.0) > 1e-12:
                # no margin token although the bounds do not sum to 1: bring the
                # token closest to the boundary back into the margin set
                cand = np.flatnonzero(state != 1)
                state[cand[np.argmin(np.abs(grad[cand] - np.median(grad)))]] = 1
                continue
            mu = float(np.min(-grad[E]))  # the empty-margin convention
        g = grad + mu
        # g violations relative to the size of their terms (K > 0 entrywise)
        size = np.maximum(2.0 * diag + g - mu + abs(mu), 1.0)
        viol = np.zeros(n)
        if len(S):
            viol[S] = np.maximum(-alpha[S], alpha[S] - U[S])
        viol[E] = np.maximum(g[E], 0.0) / size[E]
        R = np.flatnonzero(state == 0)
        viol[R] = np.maximum(-g[R], 0.0) / size[R]
        worst = int(np.argmax(viol))
        if viol[worst] <= tol:
            return BatchSolution(alpha, mu, S, E, R)
        if state[worst] == 1:
            state[worst] = 0 if alpha[worst] < 0 else 2
        else:
            state[worst] = 1
    raise RuntimeError(
        f"active-set finish did not converge in {max_iter} moves (n={n}); "
        "the problem is probably degenerate (near-duplicate keys)"
    )


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
