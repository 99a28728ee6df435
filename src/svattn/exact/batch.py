"""The memory's own batch solver: SMO followed by an exact active-set finish.

:class:`~svattn.exact.memory.SVDDMemory` calls this when it first becomes
feasible (``n = warmup_threshold(C)``) and as a fallback when an incremental
step meets a degeneracy it will not guess through. It is deliberately a
different algorithm from the oracle in :mod:`svattn.exact.oracle` (which
starts from an interior-point QP), so the two can check each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svattn.exact.conventions import mu_for_empty_margin


@dataclass(frozen=True)
class BatchSolution:
    """Exact optimum of the SVDD dual on a fixed token set."""

    alpha: np.ndarray
    mu: float
    margin: np.ndarray  # indices with 0 < alpha < C
    error: np.ndarray  # indices with alpha = C
    reserve: np.ndarray  # indices with alpha = 0


def smo(K: np.ndarray, diag: np.ndarray, C: float, *, gap_tol: float, max_iter: int) -> np.ndarray:
    """Sequential minimal optimisation with second-order working-set selection.

    Pairs are picked as in libsvm (Fan, Chen & Lin 2005, WSS 2): the index
    that most wants to grow, and the partner that gives the largest decrease
    of the objective. Stops when the maximal KKT gap is below ``gap_tol``.
    """
    n = K.shape[0]
    # uniform is feasible (n·C >= 1 up to FEASIBILITY_SLACK, then all sit at C)
    a = np.full(n, min(C, 1.0 / n))
    grad = 2.0 * (K @ a) - diag
    tau = 1e-12 * max(1.0, float(diag.max()))
    for _ in range(max_iter):
        can_up = a < C
        can_down = a > 0
        gi = np.where(can_up, grad, np.inf)
        i = int(np.argmin(gi))
        gap = float(np.max(np.where(can_down, grad, -np.inf)) - gi[i])
        if gap <= gap_tol:
            break
        b = grad - grad[i]
        eta = np.maximum(diag[i] + diag - 2.0 * K[i], tau)
        score = np.where(can_down & (b > 0), b * b / eta, -np.inf)
        j = int(np.argmax(score))
        step = min(b[j] / (2.0 * eta[j]), C - a[i], a[j])
        a[i] += step
        a[j] -= step
        grad += (2.0 * step) * (K[i] - K[j])
    return a


def _bordered_solve(K: np.ndarray, diag: np.ndarray, C: float, S, E) -> tuple[np.ndarray, float]:
    """alpha_S and mu from g_S = 0 and sum(alpha) = 1 with alpha_E = C."""
    m = len(S)
    Q = np.empty((m + 1, m + 1))
    Q[0, 0] = 0.0
    Q[0, 1:] = 1.0
    Q[1:, 0] = 1.0
    Q[1:, 1:] = 2.0 * K[np.ix_(S, S)]
    rhs = np.empty(m + 1)
    rhs[0] = 1.0 - C * len(E)
    rhs[1:] = diag[S] - 2.0 * C * K[np.ix_(S, E)].sum(axis=1)
    x = np.linalg.solve(Q, rhs)
    x += np.linalg.solve(Q, rhs - Q @ x)  # one step of iterative refinement
    return x[1:], float(x[0])


def active_set_finish(
    K: np.ndarray, diag: np.ndarray, C: float, alpha0: np.ndarray, *, tol: float, max_iter: int
) -> BatchSolution:
    """Exact optimum from an approximate one.

    Reads the partition off ``alpha0``, solves the bordered KKT system on it,
    and moves the worst violator of the KKT conditions until none is left.
    """
    n = K.shape[0]
    scale = max(1.0, float(diag.max()))
    edge = 1e-9 * C
    state = np.where(alpha0 >= C - edge, 2, np.where(alpha0 <= edge, 0, 1))  # 0 R, 1 S, 2 E
    for _ in range(max_iter):
        S = np.flatnonzero(state == 1)
        E = np.flatnonzero(state == 2)
        alpha = np.zeros(n)
        alpha[E] = C
        if len(S):
            alpha_S, mu = _bordered_solve(K, diag, C, S, E)
            alpha[S] = alpha_S
            grad = 2.0 * (K @ alpha) - diag
        else:
            if len(E) == 0 or abs(C * len(E) - 1.0) > 1e-12:
                # no margin token although the budget is not met exactly: put the
                # token closest to the boundary back into the margin set
                grad = 2.0 * (K @ alpha) - diag
                cand = np.flatnonzero(state != 1)
                state[cand[np.argmin(np.abs(grad[cand] - np.median(grad)))]] = 1
                continue
            grad = 2.0 * (K @ alpha) - diag
            mu = mu_for_empty_margin(grad[E])
        g = grad + mu
        viol = np.zeros(n)
        if len(S):
            viol[S] = np.maximum(-alpha[S], alpha[S] - C)
        viol[E] = np.maximum(g[E], 0.0)
        R = np.flatnonzero(state == 0)
        viol[R] = np.maximum(-g[R], 0.0)
        worst = int(np.argmax(viol))
        if viol[worst] <= tol * scale:
            return BatchSolution(alpha, mu, S, E, R)
        if state[worst] == 1:
            state[worst] = 0 if alpha[worst] < 0 else 2
        else:
            state[worst] = 1
    raise RuntimeError(
        f"active-set finish did not converge in {max_iter} moves (n={n}, C={C}); "
        "the problem is probably degenerate (duplicate keys)"
    )


def batch_solve(K: np.ndarray, diag: np.ndarray, C: float, *, tol: float) -> BatchSolution:
    """Exact SVDD optimum on a feasible token set (``n·C >= 1``)."""
    n = K.shape[0]
    scale = max(1.0, float(diag.max()))
    alpha0 = smo(K, diag, C, gap_tol=1e-11 * scale, max_iter=200 * n + 1000)
    return active_set_finish(K, diag, C, alpha0, tol=tol, max_iter=10 * n + 100)
