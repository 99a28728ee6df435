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


# The most tokens a warm-up threshold may ask for. Counts up to 2**53 are exact in
# float64 (so n·C is one rounding of the true product); no memory holds more.
MAX_WARMUP = 2**53


def _round_up(x: float) -> str:
    """``x`` > 0 rounded up to three significant digits, as text (``1.12e-16``)."""
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / unit) * unit:.3g}"


def warmup_threshold(C: float) -> int:
    """Smallest ``n`` for which :func:`is_feasible` holds, found in O(1) steps.

    Raises
    ------
    ValueError
        ``C`` not a finite number > 0, or so small that the memory would stay
        uniform until it held more than :data:`MAX_WARMUP` tokens (``C`` below
        about ``1.1e-16``): such a memory never reaches its optimum.

    Examples
    --------
    >>> warmup_threshold(0.25), warmup_threshold(1 / 3), warmup_threshold(2.0)
    (4, 3, 1)
    >>> warmup_threshold(1e-300)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: C = 1e-300 is too small: ... C must be >= 1.12e-16
    """
    if not (C > 0 and math.isfinite(C)):
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    bound = (1.0 - FEASIBILITY_SLACK) / C  # inf for a subnormal C
    if bound > MAX_WARMUP:
        inverse = f"= {1.0 / C:.6g}" if C > 1.0 / 1.7e308 else "> 1.7e308"
        raise ValueError(
            f"C = {C!r:.40} is too small: the memory's weights stay uniform until it holds "
            f"n >= 1/C {inverse} tokens, more than any memory holds (2**53); C must be "
            f">= {_round_up(1.0 / MAX_WARMUP)}"
        )
    # bound is within a few units of the answer (both are exact below 2**53): step to it
    n = max(1, math.ceil(bound))
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
