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
there (a third ``cumsum``, of the signed breakpoints, holds ``Σ_F v + C·|U|`` for
the free set ``F`` and upper set ``U`` of every segment), then **finish** with one
Newton step of ``f`` from that ``tau``, exact once ``F`` is right (the cumsums'
rounding does not reach the result). Every step is one batched tensor op: no Python loop, no
data-dependent branch, no host synchronisation, so the projection is the same
26 ops whatever ``v`` is, and it compiles into one graph.

Absent (masked) coordinates are set far below every present one with weight 0:
their breakpoints come last and change no slope.

:func:`project_capped_simplex_reference` is the slow per-problem method in numpy
float64 (breakpoints evaluated one by one), used by the tests.
"""

from __future__ import annotations

import numpy as np
import torch

from svattn.nn.common import host_reads

__all__ = ["ProjectionPlan", "project_capped_simplex", "project_capped_simplex_reference"]


def project_capped_simplex(
    v: torch.Tensor,
    C: float,
    mask: torch.Tensor | None = None,
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
    plan = ProjectionPlan.of(mask, v.dtype)
    x, tau = plan.project(torch.where(mask, v, plan.low), C)
    return x, tau.squeeze(-1)


class ProjectionPlan:
    """What the projection needs from the mask alone, built once per solve.

    An iterative caller (FISTA) keeps absent coordinates of its points at
    :attr:`low` itself and calls :meth:`project` on every iteration: 26 tensor
    ops, none of them a cast or a host read.
    """

    def __init__(self, signs: torch.Tensor, index: torch.Tensor, low: float,
                 mask: torch.Tensor) -> None:  # fmt: skip
        self.signs = signs  # (..., 2n): +1 at v_i, −1 at v_i − C; 0 for absent entries
        self.index = index  # (2n,): breakpoint positions 0 .. 2n − 1
        self.low = low  # the value absent coordinates hold (below every present one)
        self.mask = mask  # (..., n) bool

    @classmethod
    def of(cls, mask: torch.Tensor, dtype: torch.dtype) -> ProjectionPlan:
        w = mask.to(dtype)
        index = torch.arange(2 * mask.shape[-1], device=mask.device)
        # Far below any present value yet finite: 0·low stays 0 in the cumsums.
        return cls(torch.cat([w, -w], -1), index, -torch.finfo(dtype).max / 4, mask)

    def project(
        self, v: torch.Tensor, C: float, tau: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` and ``tau`` (``(..., 1)``) for ``v`` whose absent entries hold :attr:`low`.

        ``tau`` (a previous threshold) warm-starts the CPU method (:meth:`_project_newton`),
        used where :func:`~svattn.nn.common.host_reads` allows: on CPU a ``sort`` of
        many short rows costs more than a few Newton steps with an exit test, and the
        test's read is free there. Elsewhere the fixed sort-based op sequence runs.
        Both are exact (they agree to rounding).
        """
        if host_reads(v):
            return self._project_newton(v, C, tau)
        b, order = torch.cat([v, v - C], -1).sort(-1, descending=True)  # (..., 2n)
        sg = self.signs.gather(-1, order)
        slope = sg.cumsum(-1)  # |F|: free entries on the segment just below b_j
        s = (sg * b).cumsum(-1)  # Σ_F v + C·|U| on that segment
        f1 = s - slope * b  # f(b_j) + 1 (f is non-increasing in tau, so f1 grows along j)
        # The root lies on the last segment (below b_j) that starts with f < 0 and has a
        # slope: on it f(tau) = s_j − |F|·tau − 1. Requiring the slope skips a rounding-
        # level f < 0 at the start of a plateau (every entry at 0 or C), e.g. when n·C = 1.
        below = (f1 < 1.0) & (slope > 0.5)
        j = torch.where(below, self.index, 0).amax(-1, keepdim=True)  # (..., 1)
        nf = slope.gather(-1, j)  # >= 1
        tau0 = (s.gather(-1, j) - 1.0) / nf
        # One Newton step of f from tau0, exact on that segment: the cumsums' rounding
        # does not reach the result (f is summed directly).
        f0 = (v - tau0).clamp(0.0, C).sum(-1, keepdim=True) - 1.0
        tau = tau0 + f0 / nf
        return (v - tau).clamp(0.0, C), tau

    def _project_newton(self, v, C, tau=None, max_iter=100):
        """Safeguarded Newton on ``f`` inside ``[min v − C, max v]`` (CPU, eager).

        A Newton step from ``tau`` is the exact finish for the current free and
        upper sets, so once they are right it lands on the root; bisection when the
        step leaves the bracket. Warm-started, it typically ends in one or two steps.
        """
        mask = self.mask
        n = mask.sum(-1, keepdim=True, dtype=v.dtype)
        big = torch.finfo(v.dtype).max
        lo = torch.where(mask, v, big).amin(-1, keepdim=True) - C  # f(lo) = n·C − 1 >= 0
        hi = torch.where(mask, v, -big).amax(-1, keepdim=True)  # f(hi) = −1 < 0
        vm = torch.where(mask, v, 0.0)
        if tau is None:
            tau = (vm.sum(-1, keepdim=True) - 1.0) / n  # the root when no entry is clipped
        tau = torch.minimum(torch.maximum(tau, lo), hi)
        tol = 8.0 * torch.finfo(v.dtype).eps * n
        for _ in range(max_iter):
            u = v - tau
            f = torch.where(mask, u.clamp(0.0, C), 0.0).sum(-1, keepdim=True) - 1.0
            done = f.abs() <= tol
            if bool(done.all()):
                break
            lo = torch.where(f > 0, tau, lo)
            hi = torch.where(f < 0, tau, hi)
            free = mask & (u > 0) & (u < C)
            nf = free.sum(-1, keepdim=True, dtype=v.dtype)
            n_up = (mask & (u >= C)).sum(-1, keepdim=True, dtype=v.dtype)
            newton = ((vm * free).sum(-1, keepdim=True) + C * n_up - 1.0) / nf.clamp_min(1.0)
            ok = (nf > 0) & (newton > lo) & (newton < hi)
            tau = torch.where(done, tau, torch.where(ok, newton, 0.5 * (lo + hi)))
        return torch.where(mask, (v - tau).clamp(0.0, C), 0.0), tau


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
