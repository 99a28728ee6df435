"""Exact batched Euclidean projection onto the capped simplex.

``P(v) = argmin_x ‖x − v‖²  s.t.  Σ x = 1, 0 <= x <= C`` has the form
``x = clip(v − tau, 0, C)`` with ``tau`` the root of the piecewise-linear,
non-increasing ``f(tau) = Σ clip(v_i − tau, 0, C) − 1`` (breakpoints ``v_i − C``
and ``v_i``). We find it sort-free: a safeguarded Newton iteration on ``f``
inside the bracket ``[min v − C, max v]`` (a Newton step from ``tau`` is the
exact finish ``tau' = (Σ_F v + C·|U| − 1)/|F|`` for the current free set ``F``
and upper set ``U``, so once the sets are right it lands on the root), falling
back to bisection when the step leaves the bracket. A warm start (the previous
``tau`` inside an iterative solver) typically converges in one or two steps.

:func:`project_capped_simplex_reference` is the slow per-problem sort-based
method in numpy float64, used by the tests.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["project_capped_simplex", "project_capped_simplex_reference"]


def project_capped_simplex(
    v: torch.Tensor,
    C: float,
    mask: torch.Tensor | None = None,
    tau: torch.Tensor | None = None,
    max_iter: int = 100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Project each row of ``v`` onto ``{Σ x = 1, 0 <= x <= C}`` (masked entries fixed at 0).

    Parameters
    ----------
    v : Tensor ``(..., n)``
        Points to project, one problem per row.
    C : float
        Box; every row must have ``n_valid·C >= 1`` (not checked here).
    mask : bool Tensor ``(..., n)``, optional
        True where the coordinate is present; masked coordinates get ``x = 0``.
    tau : Tensor ``(...)``, optional
        Warm start for the threshold.
    max_iter : int
        Cap on safeguarded Newton/bisection steps (bisection alone needs ~60 in float64).

    Returns
    -------
    x : Tensor ``(..., n)``
    tau : Tensor ``(...)``
        The threshold, ``x = clip(v − tau, 0, C)`` on valid entries.

    Examples
    --------
    >>> import torch
    >>> x, tau = project_capped_simplex(torch.tensor([[3.0, 1.0, 0.0]]), C=0.6)
    >>> x
    tensor([[0.6000, 0.4000, 0.0000]])
    """
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    n = mask.sum(-1).to(v.dtype)  # (...)
    big = torch.finfo(v.dtype).max
    lo = torch.where(mask, v, big).amin(-1) - C  # f(lo) = n·C − 1 >= 0
    hi = torch.where(mask, v, -big).amax(-1)  # f(hi) = −1 < 0
    if tau is None:
        vsum = torch.where(mask, v, 0.0).sum(-1)
        tau = (vsum - 1.0) / n  # the root when no entry is clipped
    tau = torch.minimum(torch.maximum(tau, lo), hi)
    tol = 8.0 * torch.finfo(v.dtype).eps * n.clamp_min(1.0)
    vm = torch.where(mask, v, 0.0)
    for _ in range(max_iter):
        u = v - tau.unsqueeze(-1)
        x = torch.where(mask, u.clamp(0.0, C), 0.0)
        f = x.sum(-1) - 1.0
        done = f.abs() <= tol
        if bool(done.all()):
            break
        lo = torch.where(f > 0, tau, lo)
        hi = torch.where(f < 0, tau, hi)
        free = mask & (u > 0) & (u < C)
        nf = free.sum(-1).to(v.dtype)
        n_up = (mask & (u >= C)).sum(-1).to(v.dtype)
        newton = ((vm * free).sum(-1) + C * n_up - 1.0) / nf.clamp_min(1.0)
        ok = (nf > 0) & (newton > lo) & (newton < hi)
        step = torch.where(ok, newton, 0.5 * (lo + hi))
        tau = torch.where(done, tau, step)
    x = torch.where(mask, (v - tau.unsqueeze(-1)).clamp(0.0, C), 0.0)
    return x, tau


def project_capped_simplex_reference(v: np.ndarray, C: float) -> np.ndarray:
    """Slow exact projection of one vector ``v`` (n,) in float64 by sorting the breakpoints.

    ``f(tau)`` is linear between consecutive sorted breakpoints ``{v_i − C, v_i}``;
    find the segment where it crosses 0 and interpolate.
    """
    v = np.asarray(v, dtype=np.float64)
    if v.size * C < 1.0 - 1e-12:
        raise ValueError("infeasible: n·C < 1")

    def f(t: float) -> float:
        return float(np.clip(v - t, 0.0, C).sum() - 1.0)

    bps = np.unique(np.concatenate([v - C, v]))  # sorted; f non-increasing along them
    vals = np.array([f(t) for t in bps])
    j = int(np.searchsorted(-vals, 0.0, side="left"))  # first breakpoint with f <= 0
    if j < len(bps) and vals[j] == 0.0:
        tau = bps[j]
    else:  # root inside (bps[j-1], bps[j]): f(bps[j-1]) > 0 > f(bps[j])
        t0, t1, f0, f1 = bps[j - 1], bps[j], vals[j - 1], vals[j]
        tau = t0 + f0 * (t1 - t0) / (f0 - f1)
    return np.clip(v - tau, 0.0, C)
