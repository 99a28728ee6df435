"""Conventions that make the SVDD state a function of the token *set* alone.

The incremental memory and the independent oracle must agree on these, and
only these, so they live here (the two solvers share no other code).

Warm-up
    With a fixed box C the dual ``{sum(alpha) = 1, 0 <= alpha <= C}`` is
    infeasible while ``n·C < 1``. Below that threshold the state is uniform,
    ``alpha = 1/n`` on every token, and ``mu = 0``; every token then counts as
    support (it carries weight in the readout). From ``n = warmup_threshold(C)``
    on, alpha is the exact optimum of the QP.

Empty margin set
    When no token has ``0 < alpha < C`` the multiplier ``mu`` is not unique:
    any value with ``g_E <= 0 <= g_R`` is optimal. We take the largest, so the
    highest error-set token sits exactly on the boundary:
    ``mu = min_{i in E} (K_ii − 2 (K alpha)_i)``.
"""

from __future__ import annotations

import math

import numpy as np

# n·C within this of 1 counts as feasible: C = 1/3 with n = 3 must be feasible
# although 3 * (1/3) may round below 1.
FEASIBILITY_SLACK = 1e-12


def is_feasible(n: int, C: float) -> bool:
    """True when ``{sum(alpha) = 1, 0 <= alpha <= C}`` has a point for ``n`` tokens."""
    return n >= 1 and n * C >= 1.0 - FEASIBILITY_SLACK


def warmup_threshold(C: float) -> int:
    """Smallest ``n`` for which :func:`is_feasible` holds."""
    if not C > 0:
        raise ValueError(f"C must be > 0, got {C!r}")
    n = max(1, math.floor(1.0 / C))
    while not is_feasible(n, C):
        n += 1
    while n > 1 and is_feasible(n - 1, C):
        n -= 1
    return n


def mu_for_empty_margin(grad_error: np.ndarray) -> float:
    """``mu`` when the margin set is empty.

    Parameters
    ----------
    grad_error
        ``2 (K alpha)_i − K_ii`` on the error set (non-empty).

    Returns
    -------
    float
        ``min_i (−grad_error_i)``: the largest mu with every ``g_E <= 0``.
    """
    return float(np.min(-np.asarray(grad_error, dtype=np.float64)))
