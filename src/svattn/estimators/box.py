"""The box ``C`` of :class:`~svattn.estimators.SVDD`: from ``nu`` or given, and the warning
when the rows held cannot fill it.

The dual's constraints ``Σ α_i = 1, 0 <= α_i <= C`` let at most ``⌊1/C⌋`` rows sit at
the box, and need at least ``⌈1/C⌉`` rows with weight: ``C = 1/k`` lets ``k`` rows carry
all of it. ``nu`` sets ``C = 1/(ν n)``, so ``n·C = 1/ν >= 1`` always holds at ``fit``; a
``C`` given directly, or a model that has forgotten rows since (``C_`` stays fixed), can
hold fewer than ``⌈1/C⌉`` rows. Then no solution keeps every ``α_i <= C``: the model
stays uniform (every row weight ``1/n``, ``μ = 0``: the exact core's warm-up) and is not
fitted to the rows' shape. For rbf its decision function is
``(2·mean_i k(x_i, x) − 1) / (2C)``: a point is inside where its mean kernel value to
the rows is at least 1/2, which with ``gamma="scale"`` leaves most rows, often all,
outside. :class:`InfeasibleBoxWarning` says so when it happens (docs/usage.md,
"Choosing C").
"""

from __future__ import annotations

import math
import numbers
import warnings

from svattn.exact.core.conventions import is_feasible, warmup_threshold

__all__ = ["InfeasibleBoxWarning", "box_of", "warn_if_uniform"]


class InfeasibleBoxWarning(UserWarning):
    """The model holds fewer than ``⌈1/C⌉`` rows (``n·C < 1``): it is uniform, not fitted
    to the rows' shape, until it holds ``⌈1/C⌉`` (module docstring)."""


def box_of(nu: object, C: object, n: int) -> float:
    """The box of a fit on ``n`` rows: ``C`` when given, else ``1 / (nu · n)`` (nu 0.5 by
    default).

    Raises
    ------
    ValueError
        Both given, ``C`` not a finite number > 0, or ``nu`` not in (0, 1].

    Examples
    --------
    >>> box_of(None, None, 100), box_of(0.1, None, 100), box_of(None, 0.25, 100)
    (0.02, 0.1, 0.25)
    """
    if nu is not None and C is not None:
        raise ValueError("give nu or C, not both (nu sets C = 1 / (nu · n_samples))")
    if C is not None:
        try:  # (an int too large for a float overflows in isfinite)
            ok = not isinstance(C, bool) and isinstance(C, numbers.Real) \
                and math.isfinite(C) and C > 0
        except OverflowError:
            ok = False
        if not ok:
            raise ValueError(f"C must be a finite number > 0, got {C!r:.40}")
        return float(C)
    nu = 0.5 if nu is None else nu
    if isinstance(nu, bool) or not isinstance(nu, numbers.Real) or not 0 < nu <= 1:
        raise ValueError(f"nu must be in (0, 1], got {nu!r}")
    return 1.0 / (float(nu) * n)


def warn_if_uniform(C: float, n: int, after: str, stacklevel: int = 3) -> None:
    """Warn (:class:`InfeasibleBoxWarning`) when ``n`` rows cannot fill the box ``C``.

    ``after`` names the operation (``"fit"``, ``"partial_fit"``, ``"forget"``); the
    message says what the box does and what to give instead.
    """
    if n < 1 or is_feasible(n, C):
        return
    k = warmup_threshold(C)
    warnings.warn(
        f"SVDD after {after}: C = {C:.6g} with {n} rows, n·C = {n * C:.3g} < 1. The weights "
        f"sum to 1 with each at most C, so at least ceil(1/C) = {k} rows must carry weight; "
        f"with fewer, no solution keeps every weight <= C: the model stays uniform (every "
        f"row weight 1/n), not fitted to the rows' shape, until it holds {k} rows (rbf: a "
        f"point is inside where its mean kernel value to the rows is >= 1/2, which usually "
        f"leaves most rows outliers). C = 1/k "
        f"lets k rows carry all the weight (here C >= {1.0 / n:.3g}); nu= sets "
        f"C = 1/(nu·n), the fraction of rows allowed outside", InfeasibleBoxWarning,
        stacklevel=stacklevel)
