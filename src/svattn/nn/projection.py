"""Exact batched Euclidean projection onto the capped simplex, in a fixed number of ops.

``P(v) = argmin_x ‖x − v‖²  s.t.  Σ x = 1, 0 <= x <= C`` has the form
``x = clip(v − tau, 0, C)`` with ``tau`` the root of the piecewise-linear,
non-increasing ``f(tau) = Σ clip(v_i − tau, 0, C) − 1``.

**Sort-based root.** Sort the ``2n`` breakpoints ``{v_i, v_i − C}`` in decreasing
order. Walking down from ``b_0 = max v`` (where ``f = −1``), entry ``i`` starts to
grow at ``v_i`` (the slope of ``f`` in ``−tau`` rises by 1) and stops at ``v_i − C``
(it falls by 1), so one ``cumsum`` of the ±1 weights gives the slope on every
segment and a second ``cumsum`` of ``slope · gap`` gives ``f`` at every breakpoint.
The root lies on the first segment where ``f`` turns non-negative; interpolate
there, then **finish exactly from the free set** ``F`` and upper set ``U`` read at
that ``tau``: ``tau = (Σ_F v + C·|U| − 1)/|F|`` (the cumsums' rounding does not
reach the result). Every step is one batched tensor op: no Python loop, no
data-dependent branch, no host synchronisation, so the projection is the same
~30 ops whatever ``v`` is, and it compiles into one graph.

Absent (masked) coordinates take the value of the smallest present one with
weight 0: they add zero-length segments and change no slope.

:func:`project_capped_simplex_reference` is the slow per-problem method in numpy
float64 (breakpoints evaluated one by one), used by the tests.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["project_capped_simplex", "project_capped_simplex_reference"]


def project_capped_simplex(
    v: torch.Tensor,
    C: float,
    mask: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
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
    weight : Tensor ``(..., n)``, optional
        ``mask`` in ``v``'s dtype (an iterative caller passes it once instead of
        converting the mask on every call).

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
    w = mask.to(v.dtype) if weight is None else weight  # (..., n)
    n = v.shape[-1]
    vmin = torch.where(mask, v, torch.finfo(v.dtype).max).amin(-1, keepdim=True)
    vf = torch.where(mask, v, vmin)  # absent: a zero-weight copy of the smallest present
    b, order = torch.cat([vf, vf - C], -1).sort(-1, descending=True)  # (..., 2n)
    slope = torch.cat([w, -w], -1).gather(-1, order).cumsum(-1)  # slope of f(−tau) below b_j
    rise = slope[..., :-1] * (b[..., :-1] - b[..., 1:])  # f(b_{j+1}) − f(b_j)
    f = torch.cat([torch.full_like(b[..., :1], -1.0), rise.cumsum(-1) - 1.0], -1)  # f(b_j)
    # First breakpoint with f >= 0 (f is non-decreasing along j); the root is on the
    # segment above it. Clamped: with n·C = 1, f reaches 0 only up to rounding.
    j = (f < 0).sum(-1, keepdim=True).clamp(1, 2 * n - 1)
    b_hi, f_hi, s_hi = (z.gather(-1, j - 1) for z in (b, f, slope))
    b_lo = b.gather(-1, j)
    tau = (b_hi + f_hi / s_hi.clamp_min(0.5)).clamp(min=b_lo, max=b_hi)  # (..., 1)
    # Exact finish from the sets at tau (a Newton step of f; exact when the sets are right).
    u = v - tau
    free = mask & (u > 0) & (u < C)
    nf = free.sum(-1, keepdim=True, dtype=v.dtype)  # counts in v's dtype: C·n_up stays exact
    n_up = (mask & (u >= C)).sum(-1, keepdim=True, dtype=v.dtype)
    finish = (torch.where(free, v, 0.0).sum(-1, keepdim=True) + C * n_up - 1.0) / nf.clamp_min(1)
    tau = torch.where(nf > 0, finish, tau)
    x = torch.where(mask, (v - tau).clamp(0.0, C), 0.0)
    return x, tau.squeeze(-1)


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
