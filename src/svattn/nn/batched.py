"""Batched training path: FISTA, then the finish (the verified optimum, or the paper's path).

All (batch, head) problems of one call are solved together, on whatever device
the keys live on. Layout ``[B, H, T, D]``; inside, problems are flattened to
``P = B·H`` rows.

For each problem (docs/design.md §5; the margin solve is the bordered system of §2)

1. **FISTA** (no grad) on ``min a^T K a − diag(K)^T a`` over the capped simplex,
   step ``1/L`` with ``L = 2 λmax(K)`` from power iteration, momentum with the
   gradient-based adaptive restart of O'Donoghue & Candès, for exactly ``max_iter``
   iterations on every device. Each iteration is a fixed ~35 tensor ops (one
   ``baddbmm``, the sort-based projection of :mod:`svattn.nn.projection`, the momentum
   update), whatever the data, with no host synchronisation. On CPU in eager mode
   (:func:`~svattn.nn.common.host_reads`) the same iterations run as one compiled
   loop (:mod:`svattn.nn.partition_cpu`).
2. **Finish** (``SolverOptions.finish``):

   * ``"optimum"`` (default, :mod:`svattn.nn.finish`): the kernel matrices are formed
     in float64 from the keys, FISTA runs on them as a warm start, and each problem
     is solved to its SVDD optimum by an unridged active set (exact duplicate keys
     merged), verified (box, ``Σ alpha = 1``, KKT signs) and re-solved by the exact
     oracle where the check fails. One host round trip on accelerators.
   * ``"approximate"`` (the paper's path, for ablations): ``R = {a = 0}``,
     ``E = {a = C}``, ``S`` the rest read off FISTA's iterate, then exactly ``refine``
     primal-dual active-set rounds (no grad) on the ridged system: solve the margin
     system, move S tokens with ``alpha < 0`` to R and ``alpha > C`` to E, and R/E
     tokens whose ``g_i = 2 (K alpha)_i − K_ii + mu`` has the wrong sign to S. A round
     on a settled partition moves nothing and changes nothing, so running all rounds
     equals stopping at the first settled one; the margin solve below may still
     leave alpha outside the box. Problems still moving after the last round, or
     whose alpha leaves the box or misses ``Σ alpha = 1``, are counted in
     :attr:`BatchedInfo.unsettled`.
3. **Margin solve** (differentiable): with the partition fixed,
   ``[[2 K_SS + ridge·I, 1], [1^T, 0]] [alpha_S; mu] = [d_S − 2C K_SE 1; 1 − C|E|]``
   (``ridge = 0`` after the ``"optimum"`` finish, whose alpha is that system's
   solution). ``alpha_E = C``, ``alpha_R = 0``. Gradients reach the keys through
   ``K_SS``, ``K_SE`` and ``d_S``, by the closed-form backward of
   :mod:`svattn.nn.margin` on the factorization of the partition's own final system
   (nothing is solved twice): the implicit gradient of the KKT system.

**Dense and compact margin systems.** On accelerators, up to :data:`DENSE_MAX`
keys per problem (every boundary problem of the hybrid's ``"support"`` policy), the
margin system is written over all ``n`` keys: rows and columns outside ``S`` are
identity rows (``M = where(S×S, 2K + ridge·I, I)``), so its size is static and every
mask is one tensor op. Above it (eager only), the system is gathered to the largest
``|S|`` of the batch, which is cheaper (``O(|S|³)`` against ``O(n³)``) but a
data-dependent size: :func:`svattn.nn.common.gather_rows` reads it on the host,
the one host synchronisation of the approximate path. While :func:`torch.compile`
traces, the dense form is used at every size, so that path compiles as one graph. On
CPU in eager mode, where the read is free, the compact form is used from
:data:`DENSE_CPU_MAX` keys on (:func:`dense_ok`).

Linear solves use the ``*_ex`` variants with ``check_errors=False``: the checked
ones read the LAPACK status on the host. A singular system (the approximate path
is ridged, so it does not arise there) shows as non-finite alpha instead of an error.

The kernel matrix is rescaled by ``exp(−max log K_ii)`` per problem before
solving (the optimum ``alpha`` is invariant to scaling K), so the exp kernel
does not overflow.

The exact path (``mode="exact"``) is the reference both finishes are tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from svattn.exact.core.kernels import get_kernel
from svattn.nn.common import Partition, centre_keys, host_reads, log_kernel_diag
from svattn.nn.finish import finish_optimum, optimum_factors
from svattn.nn.margin import Factors, margin_solve, margin_solve_factored, rows, solve_system
from svattn.nn.options import SolverOptions
from svattn.nn.partition_cpu import MASS_SLACK, fista_loop, repair_loop
from svattn.nn.projection import ProjectionPlan

__all__ = [
    "DENSE_CPU_MAX",
    "DENSE_MAX",
    "BatchedInfo",
    "Solved",
    "exp_floor",
    "fista",
    "boundary_partition",
    "compiled_boundary_partition",
    "kernel_problem",
    "lambda_max",
    "margin_alpha",
    "matvec",
    "rows",
    "scaled_kernel_matrix",
    "solve_batched",
    "solve_partition",
]

# Most keys per problem for which the margin system is solved over all keys (static size).
DENSE_MAX = 256
# The same on CPU in eager mode, where the compact system's size is read for free.
DENSE_CPU_MAX = 32


@dataclass
class BatchedInfo:
    """Diagnostics of one :func:`solve_batched` call.

    The counts are 0-dim tensors on the keys' device (reading one, e.g. with
    ``int(info.unsettled)``, is the caller's host synchronisation, not the solver's).
    """

    fista_iters: int
    refine_rounds: int  # the approximate finish's repair rounds (0 after "optimum")
    max_kkt_violation: torch.Tensor  # over all problems, in units of the rescaled K
    box_violations: torch.Tensor  # alphas outside [0, C] (beyond the tolerance), all keys
    # problems not verified optimal: the repair still moving (approximate), alpha outside
    # the box or Σ alpha ≠ 1 beyond the tolerance, or a KKT check failed (optimum)
    unsettled: torch.Tensor
    fallbacks: torch.Tensor | int = 0  # "optimum": problems re-solved by the exact oracle


class Solved(NamedTuple):
    """Result of :func:`solve_partition` for ``P`` problems of ``n`` keys (no grad)."""

    margin: torch.Tensor  # bool (P, n)
    error: torch.Tensor  # bool (P, n)
    alpha: torch.Tensor  # (P, n), the margin solve on (margin, error)
    mu: torch.Tensor  # (P,)
    settled: torch.Tensor  # bool (P,): the last repair round moved nothing / verified optimal
    iters: int  # FISTA iterations run, the retry's included
    factors: Factors  # the final margin systems' factorization (margin_solve_factored)
    fallback: torch.Tensor | None = None  # bool (P,): "optimum" only, re-solved by the oracle


def dense_ok(t: torch.Tensor, n: int) -> bool:
    """Whether problems of ``n`` keys (tensors like ``t``) use the dense margin system.

    Where :func:`~svattn.nn.common.host_reads` allows (CPU, eager), reading the
    margin set's size costs nothing, so the compact system is used from
    :data:`DENSE_CPU_MAX` keys on (its ``O(|S|³)`` beats the dense ``O(n³)``; the two
    agree to rounding). Elsewhere the dense form runs up to :data:`DENSE_MAX` keys,
    and at every size while compiling.
    """
    if host_reads(t):
        return n <= DENSE_CPU_MAX
    return n <= DENSE_MAX or torch.compiler.is_compiling()


def matvec(K: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``K @ y`` for symmetric K (P, n, n), y (P, n) → (P, n).

    Computed as the row-vector product ``y^T K``: on CPU that batched GEMM streams
    K row by row and runs 1.5–2.7x faster than ``K @ y`` (through ``bmm`` or one
    ``torch.mv`` per problem), which is memory-bound gemv.
    """
    return torch.bmm(y.unsqueeze(1), K).squeeze(1)


def lambda_max(K: torch.Tensor, n_iter: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest eigenvalue of each PSD matrix of ``K`` (P, n, n) by power iteration.

    Starts from the all-ones vector (the Perron vector of a positive kernel
    matrix is positive, so a few steps suffice: the Rayleigh quotient is within
    a few % after 4); returns it inflated by 5% and capped by the max row sum
    (an upper bound, as both kernels are positive entrywise), and the row sums
    ``K 1`` themselves (the first step), which FISTA's first gradient reuses.
    """
    x = torch.ones(K.shape[:-1], dtype=K.dtype, device=K.device)
    y = rowsum = matvec(K, x)
    for step in range(max(n_iter, 1)):
        if step:
            y = matvec(K, x)
        lam = (x * y).sum(-1) / (x * x).sum(-1).clamp_min(1e-300)
        x = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return torch.minimum(1.05 * lam, rowsum.amax(-1)).clamp_min(1e-12), rowsum


def scaled_kernel_matrix(
    x: torch.Tensor, valid: torch.Tensor, shift: torch.Tensor, kernel: str, gamma: float
) -> torch.Tensor:
    """``exp(log k(x_i, x_j) − shift)`` per problem, zero on absent keys (no grad).

    x (P, n, D), valid (P, n), shift (P,) → (P, n, n). One ``baddbmm`` and one broadcast
    add: ``s x_i·x_j + h_i + h_j`` with the kernel's dot form ``(s, c)``
    (:meth:`~svattn.exact.core.kernels.Kernel.dot_form`) and ``h = −c‖x‖² − shift/2``: for rbf
    ``s = 2γ, c = γ``, for exp ``s = γ, c = 0``. An absent key gets ``x = 0, h = −3e4``. rbf is not
    clipped at 0: a rounding-level excess over 1 on the diagonal is harmless to the
    solver. :func:`svattn.nn.common.log_kernel` is the plain reference. (The product
    of keys augmented with ``[h, 1]`` and ``[1, h]``, which this replaced, has a width of
    ``D + 2``: several times slower on CPU than the ``baddbmm`` at ``D = 64``.)

    The exponent is clamped at :func:`exp_floor` before ``exp`` and absent rows and
    columns are then zeroed by two broadcast multiplies: an ``exp`` that underflows
    (to a subnormal, 0 or from ``−inf``) leaves the vectorised fast path on CPU and
    costs 10-100x more per entry, and the hybrid's padded slots made about half of
    every boundary matrix underflow. Present pairs below the floor get
    ``exp(floor)`` (about 1e-38 in float32, 1e-307 in float64) instead of a
    subnormal, against a largest entry of 1. Where every key is present and
    :func:`~svattn.nn.common.host_reads` allows (CPU, eager) the masking is skipped:
    it would leave every value as it is.
    """
    P, n, _ = x.shape
    scale, c = get_kernel(kernel).dot_form(gamma)
    # CPU, eager: with every key present the masking is the identity (same values)
    masked = not (host_reads(valid) and bool(valid.all()))
    h = -0.5 * shift.unsqueeze(-1).expand(P, n)
    if c:
        h = h - c * (x * x).sum(-1)
    if masked:
        h = torch.where(valid, h, -3e4)
        x = torch.where(valid.unsqueeze(-1), x, 0.0)
    K = torch.baddbmm(h.unsqueeze(-1), x, x.transpose(1, 2), alpha=scale)  # s x·x + h_i
    K = K.add_(h.unsqueeze(-2)).clamp_min_(exp_floor(K.dtype)).exp_()
    if not masked:
        return K
    w = valid.to(K.dtype)
    return K.mul_(w.unsqueeze(-1)).mul_(w.unsqueeze(-2))


def exp_floor(dtype: torch.dtype) -> float:
    """Smallest exponent whose ``exp`` is a normal number of ``dtype`` (with a margin of 1).

    CPU ``exp`` is 10-100x slower per entry where it underflows; clamping there first
    keeps it on the fast path (:func:`scaled_kernel_matrix`).
    """
    return math.log(torch.finfo(dtype).tiny) + 1.0


def kernel_problem(
    kd: torch.Tensor, valid: torch.Tensor, kernel: str, gamma: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rescaled kernel matrices ``K`` (P, n, n), diagonals ``d`` (P, n), shifts (P,) (no grad).

    ``shift`` is the largest present ``log K_ii`` of each problem; ``K`` and ``d``
    are ``exp(log k − shift)``, zero on absent keys.
    """
    with torch.no_grad():
        ldiag = log_kernel_diag(kd, kernel, gamma)  # (P, n)
        shift = torch.where(valid, ldiag, -torch.finfo(kd.dtype).max).amax(-1)  # (P,)
        K = scaled_kernel_matrix(kd, valid, shift, kernel, gamma)
        d = torch.where(valid, (ldiag - shift[:, None]).exp(), 0.0)
    return K, d, shift


def _sets(a: torch.Tensor, C: float, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return valid & (a > 0) & (a < C), valid & (a >= C)


def fista(
    K: torch.Tensor,
    d: torch.Tensor,
    C: float,
    valid: torch.Tensor,
    *,
    max_iter: int = 20,
    a0: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Accelerated projected gradient with adaptive restart, ``max_iter`` iterations (no grad).

    Parameters
    ----------
    K : Tensor (P, n, n)
        Kernel matrices (masked rows/columns zero).
    d : Tensor (P, n)
        ``diag(K)``.
    C : float
        Box.
    valid : bool Tensor (P, n)
        Keys present.
    max_iter : int
        Iterations; all of them run, on every device.
    a0 : Tensor (P, n), optional
        Feasible start; default uniform over the valid keys.

    Returns
    -------
    a : Tensor (P, n)
        Feasible iterate.
    iters : int
        Iterations run.
    """
    with torch.no_grad():
        P, n = valid.shape
        w = valid.to(K.dtype)
        a = w / w.sum(-1, keepdim=True) if a0 is None else a0  # (P, n)
        # Momentum: with r the iterations since the last (re)start, beta = (t_r − 1)/t_{r+1}
        # of t_0 = 1, t_{r+1} = (1 + sqrt(1 + 4 t_r²))/2: a table, indexed per problem.
        betas = [0.0]
        t = 1.0
        for _ in range(max_iter):
            t_next = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
            betas.append((t - 1.0) / t_next)
            t = t_next
        if host_reads(K):
            # CPU, eager: the same iterations as one compiled loop (nn/partition_cpu.py), a
            # fixed number of ops per solve
            return fista_loop(K, d, a, valid, C, betas, max_iter, 0)
        lam, _ = lambda_max(K)
        step = (0.5 / lam).view(P, 1, 1)  # 1 / (2 λmax)
        plan = ProjectionPlan.of(valid.unsqueeze(1), K.dtype)  # rows (P, 1, n) throughout
        a = a.unsqueeze(1)  # (P, 1, n)
        # y − step·(2 K y − d) = (y + step·d) − 2·step·(y K); absent entries land on the
        # projection's `low` (y and the K columns are 0 there).
        sd = torch.where(valid, step.view(P, 1) * d, plan.low).unsqueeze(1)
        Kstep = K * (-2.0 * step) if n <= DENSE_MAX else None  # one op less per iteration
        beta_of = torch.tensor(betas, dtype=K.dtype, device=K.device)  # beta_of[0] = 0
        r = torch.zeros(P, 1, 1, dtype=torch.long, device=K.device)
        zero = torch.zeros_like(r)
        y, tau = a, None
        for _ in range(max_iter):
            if Kstep is None:
                v = torch.addcmul(y + sd, 2.0 * step, torch.bmm(y, K), value=-1.0)
            else:
                v = torch.baddbmm(y + sd, y, Kstep)
            a_new, tau = plan.project(v, C, tau)
            diff = a_new - a
            # Adaptive restart (O'Donoghue & Candès): momentum off where it points uphill.
            restart = ((y - a_new) * diff).sum(-1, keepdim=True) > 0
            r = torch.where(restart, zero, r + 1)
            y = torch.addcmul(a_new, beta_of[r], diff)  # beta 0 right after a restart
            a = a_new
        a = a.squeeze(1)
    return a, max_iter


def _solve_fixed(K, d, S, E, C, ridge, ridge_steps):
    """Margin solve on K (no grad inside the repair): dense or compact by size."""
    return solve_system(K, d, S, E, C, ridge, ridge_steps, not dense_ok(K, K.shape[-1]))[:2]


def _kkt(K, d, alpha, mu, S, E):
    """g = 2 K alpha − d + mu (mu for an empty margin set: the largest feasible one)."""
    g0 = 2.0 * matvec(K, alpha) - d  # (P, n)
    big = torch.finfo(K.dtype).max
    mu_empty = torch.where(E, -g0, big).amin(-1)
    mu = torch.where(S.any(-1), mu, mu_empty)
    return g0 + mu.unsqueeze(-1)


def _hold_the_mass(S, E, valid, g, C):
    """Sets whose empty margin set leaves ``C·|E| != 1``: one token joins ``S``.

    With ``S`` empty nothing but ``E``'s count holds ``Σ alpha = 1``; a round moving
    S tokens out both ways (above C to E, below 0 to R) can leave ``C·|E| < 1``, and
    the sets' KKT test alone would call that settled. Then the R token of least
    ``g`` joins ``S`` (the E token of largest ``g`` when ``C·|E| > 1``), as
    :func:`svattn.nn.partition_cpu._hold_the_mass` does on CPU.
    """
    nE = C * E.sum(-1, keepdim=True)  # (P, 1)
    empty = ~S.any(-1, keepdim=True)
    short, over = empty & (nE < 1.0 - MASS_SLACK), empty & (nE > 1.0 + MASS_SLACK)
    big = torch.finfo(g.dtype).max
    to_s = torch.where(short, torch.where(valid & ~E, g, big), torch.where(E, -g, big))
    cols = torch.arange(S.shape[-1], device=S.device)
    pick = (cols == to_s.argmin(-1, keepdim=True)) & (short | over)  # (P, n); no one_hot: it reads
    return S | pick, E & ~pick


def default_kkt_tol(dtype: torch.dtype) -> float:
    """KKT tolerance of the repair rounds, in units of the rescaled K."""
    return 1e-4 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-9


class _RepairSystem:
    """The margin systems of the repair rounds on one fixed ``K`` (no grad, dense form).

    The bordered matrix ``[[2K + ridge·I, 1], [1ᵀ, 0]]`` is built once; a round only
    masks it (``where`` against the identity) for its partition. With an empty
    margin set the border is masked too, which pins ``mu = 0``.
    """

    def __init__(self, K, d, C, ridge, ridge_steps):
        P, n, _ = K.shape
        self.K, self.d, self.C, self.n, self.steps = K, d, C, n, ridge_steps if ridge > 0 else 0
        self.eye = torch.eye(n + 1, dtype=K.dtype, device=K.device)
        M0 = K.new_ones(P, n + 1, n + 1)
        M0[:, :n, :n] = 2.0 * K + ridge * self.eye[:n, :n]
        M0[:, n, n] = 0.0
        self.M0 = M0
        self.ridge_of = torch.cat([torch.full_like(d[:1], ridge), d.new_zeros(1, 1)], -1)

    def solve(self, S, E):
        n, C = self.n, self.C
        Sf, Ef = S.to(self.d.dtype), E.to(self.d.dtype)
        has = S.any(-1, keepdim=True)  # (P, 1)
        Se = torch.cat([S, has], -1)  # (P, n+1): rows and columns of the system
        M = torch.where(Se.unsqueeze(-1) & Se.unsqueeze(-2), self.M0, self.eye)
        KE = torch.bmm(Ef.unsqueeze(1), self.K).squeeze(1)  # K_·E 1
        rhs_S = torch.add(self.d, KE, alpha=-2.0 * C) * Sf
        rhs_mu = (1.0 - C * Ef.sum(-1, keepdim=True)) * has
        rhs = torch.cat([rhs_S, rhs_mu], -1).unsqueeze(-1)  # (P, n+1, 1)
        if self.steps:  # iterated ridge, as _dense_margin_solve
            LU, piv, _ = torch.linalg.lu_factor_ex(M, check_errors=False)
            sol = torch.linalg.lu_solve(LU, piv, rhs)
            pad = (Se * self.ridge_of).unsqueeze(-1)
            for _ in range(self.steps):
                sol = torch.linalg.lu_solve(LU, piv, torch.addcmul(rhs, pad, sol))
        else:
            sol, _ = torch.linalg.solve_ex(M, rhs, check_errors=False)
        sol = sol.squeeze(-1)
        return torch.addcmul(C * Ef, Sf, sol[:, :n]), sol[:, n]


def _repair(K, d, C, valid, a, solver, tol):
    """``solver.refine`` primal-dual active-set rounds from the sets of iterate ``a``."""
    S, E = _sets(a, C, valid)
    settled = torch.ones_like(valid[:, 0])
    if solver.refine == 0:
        return S, E, settled
    if host_reads(K):  # CPU, eager: the same rounds as one compiled loop (nn/partition_cpu.py)
        # (a ValueError naming the ridge where a margin system has a zero pivot)
        return repair_loop(K, d, valid, S, E, C, solver.ridge,
                           solver.ridge_steps if solver.ridge > 0 else 0, solver.refine, tol)
    dense = dense_ok(K, K.shape[-1])
    system = _RepairSystem(K, d, C, solver.ridge, solver.ridge_steps) if dense else None
    big = torch.finfo(K.dtype).max
    for _ in range(solver.refine):
        if system is None:
            alpha, mu = _solve_fixed(K, d, S, E, C, solver.ridge, solver.ridge_steps)
        else:
            alpha, mu = system.solve(S, E)
        g0 = 2.0 * matvec(K, alpha) - d
        has = S.any(-1)
        mu = torch.where(has, mu, torch.where(E, -g0, big).amin(-1))  # _kkt's mu
        g = g0 + mu.unsqueeze(-1)
        up, down = g > tol, g < -tol
        # S keeps its tokens inside the box; E tokens with g > 0 and R tokens with g < 0
        # join S; S tokens above C join E (below 0: R).
        S_next = torch.where(S, (alpha >= 0) & (alpha <= C), torch.where(E, up, down & valid))
        E_next = torch.where(E, ~up, S & (alpha > C))
        S_next, E_next = _hold_the_mass(S_next, E_next, valid, g0, C)
        settled = ((S_next == S) & (E_next == E)).all(-1)
        if host_reads(K) and bool(settled.all()):
            break  # a round on a settled partition changes nothing: same result, fewer ops
        S, E = S_next, E_next
    return S, E, settled


def solve_partition(
    K: torch.Tensor,
    d: torch.Tensor,
    C: float,
    valid: torch.Tensor,
    solver: SolverOptions,
    kkt_tol: float | None = None,
    keys: torch.Tensor | None = None,
) -> Solved:
    """FISTA, then the finish: the partition and its alpha (no grad).

    ``finish="optimum"``: :func:`svattn.nn.finish.finish_optimum` from FISTA's iterate;
    ``K``, ``d`` should be float64 (:func:`working_keys`) and ``keys`` (P, n, D), in
    their own dtype, are required (copies are found on them).

    ``finish="approximate"``: ``solver.refine`` repair rounds. With ``refine > 0``, one
    retry (FISTA resumed with ``2·max_iter`` iterations,
    repaired again) replaces the partition of every problem whose repair had not
    settled; it runs for all problems, as a data-dependent skip would need the host.

    ``K``, ``d`` from :func:`kernel_problem`; ``valid`` bool (P, n). Every call runs
    the same ops for given shapes and options (no data-dependent stop).
    """
    tol = default_kkt_tol(K.dtype) if kkt_tol is None else kkt_tol
    if solver.finish == "optimum":
        if keys is None:
            raise ValueError("solve_partition: finish='optimum' needs the keys (P, n, D): "
                             "copies are found on them")
        with torch.no_grad():  # FISTA, a warm start only, in the keys' own dtype
            a, iters = fista(K.to(keys.dtype), d.to(keys.dtype), C, valid,
                             max_iter=solver.max_iter)
            return _optimum(K, d, keys, valid, a, C, iters)
    with torch.no_grad():
        a, iters = fista(K, d, C, valid, max_iter=solver.max_iter)
        S, E, settled = _repair(K, d, C, valid, a, solver, tol)
        if solver.refine > 0 and not (host_reads(K) and bool(settled.all())):
            # The repair can cycle from a poor iterate (ill-conditioned K). Every problem
            # resumes FISTA from its iterate with twice the iterations and repairs again
            # (static work: a host-side "any unsettled?" would be a sync); the retry's
            # partition replaces the first one only where the first had not settled.
            a2, more = fista(K, d, C, valid, max_iter=2 * solver.max_iter, a0=a)
            iters += more
            S2, E2, settled2 = _repair(K, d, C, valid, a2, solver, tol)
            S = torch.where(settled.unsqueeze(-1), S, S2)
            E = torch.where(settled.unsqueeze(-1), E, E2)
            settled = settled | settled2
        alpha, mu, factors = solve_system(K, d, S, E, C, solver.ridge, solver.ridge_steps,
                                          not dense_ok(K, K.shape[-1]))
    return Solved(S, E, alpha, mu, settled, iters, factors)


def _optimum(K, d, keys, valid, a, C, iters) -> Solved:
    """The ``"optimum"`` finish from FISTA's iterate ``a``, with its backward's factors."""
    fin = finish_optimum(K, d, keys, valid, a, C)
    # the final margin sets are small (copies merged): on CPU in eager mode, where their
    # size is read for free, the compact system at every size
    compact = host_reads(K) or not dense_ok(K, K.shape[-1])
    f = optimum_factors(K, d, fin.margin, fin.error, C, fin.alpha, fin.mu, compact)
    return Solved(fin.margin, fin.error, fin.alpha, fin.mu, fin.settled, iters, f,
                  fin.fallback)


def working_keys(kd: torch.Tensor, solver: SolverOptions) -> torch.Tensor:
    """The keys the kernel matrices are formed from: float64 for the ``"optimum"``
    finish (its active set runs in float64), as they are for ``"approximate"``."""
    return kd.to(torch.float64) if solver.finish == "optimum" else kd


def _warm_start(kd, valid, C, kernel, gamma, max_iter):
    """Kernel problem in float64 and FISTA's iterate: the ``"optimum"`` finish's
    compilable part. FISTA (a warm start only) runs in the keys' own dtype."""
    K, d, shift = kernel_problem(kd.to(torch.float64), valid, kernel, gamma)
    a, iters = fista(K.to(kd.dtype), d.to(kd.dtype), C, valid, max_iter=max_iter)
    return K, d, shift, a, iters


def _optimum_partition(warm, kd, valid, C, kernel, gamma, solver):
    kd = centre_keys(kd, valid, kernel, gamma)  # eager, so the compiled warm start's too
    K, d, shift, a, iters = warm(kd, valid, C, kernel, gamma, solver.max_iter)
    with torch.no_grad():
        return _optimum(K, d, kd, valid, a, C, iters), K, d, shift


def boundary_partition(
    kd: torch.Tensor,
    valid: torch.Tensor,
    C: float,
    kernel: str,
    gamma: float,
    solver: SolverOptions,
) -> tuple[Solved, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partition, kernel matrices ``K``, diagonals ``d`` and shifts of the problems of
    keys ``kd`` (P, n, D) (no grad; ``K`` and ``d`` are what :func:`margin_alpha` reuses).

    :func:`kernel_problem` then :func:`solve_partition`; what one boundary of the
    hybrid's ``"support"`` policy solves. :func:`compiled_boundary_partition` is the
    same function compiled. With ``finish="optimum"``, ``K`` and ``d`` are float64.
    The keys of a translation-invariant kernel are centred first
    (:func:`~svattn.nn.common.centre_keys`), as in :func:`solve_batched`.
    """
    if solver.finish == "optimum":
        return _optimum_partition(_warm_start, kd, valid, C, kernel, gamma, solver)
    kd = centre_keys(kd, valid, kernel, gamma)
    K, d, shift = kernel_problem(kd, valid, kernel, gamma)
    return solve_partition(K, d, C, valid, solver), K, d, shift


_COMPILED: dict[str, object] = {}


def compiled_boundary_partition():
    """:func:`boundary_partition` under ``torch.compile(fullgraph=True, dynamic=False)``.

    Built once per process; compiled once per shape and options on first use
    (minutes on a CPU), then each call is a few fused kernels instead of
    thousands of ops. Compiled code takes the accelerator's schedule (no early
    exits, dense margin systems), so it matches eager to rounding. With
    ``finish="optimum"`` the kernel problem and FISTA are compiled and the finish
    (host code) runs after them.
    """
    if "partition" not in _COMPILED:
        approximate = torch.compile(boundary_partition, fullgraph=True, dynamic=False)
        warm = torch.compile(_warm_start, fullgraph=True, dynamic=False)

        def partition(kd, valid, C, kernel, gamma, solver):
            if solver.finish == "optimum":
                return _optimum_partition(warm, kd, valid, C, kernel, gamma, solver)
            return approximate(kd, valid, C, kernel, gamma, solver)

        _COMPILED["partition"] = partition
    return _COMPILED["partition"]


def margin_alpha(
    kf: torch.Tensor,
    valid: torch.Tensor,
    shift: torch.Tensor,
    S: torch.Tensor,
    E: torch.Tensor,
    C: float,
    kernel: str,
    gamma: float,
    solver: SolverOptions,
    K: torch.Tensor | None = None,
    d: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable margin solve on a fixed partition: alpha (P, n), mu (P,).

    ``kf`` (P, n, D) keys (with grad), ``valid``/``S``/``E`` bool (P, n), ``shift``
    (P,) from :func:`kernel_problem`. Gradients reach ``kf`` through ``K_SS``,
    ``K_SE`` and ``d_S``, by the closed-form backward of
    :func:`svattn.nn.margin.margin_solve`. ``K``, ``d``: the problems' kernel
    matrices and diagonals from :func:`kernel_problem` if the caller has them
    (computed here otherwise).
    """
    if K is None or d is None:
        with torch.no_grad():
            kd = kf.detach()
            K = scaled_kernel_matrix(kd, valid, shift, kernel, gamma)
            d = torch.where(valid, (log_kernel_diag(kd, kernel, gamma) - shift[:, None]).exp(),
                            0.0)
    return margin_solve(kf, K, d, S, E, C, kernel, gamma, solver.ridge, solver.ridge_steps,
                        not dense_ok(kf, kf.shape[1]))


def solve_batched(
    k: torch.Tensor,
    C: float,
    *,
    kernel: str,
    gamma: float,
    valid: torch.Tensor,
    solver: SolverOptions | None = None,
    kkt_tol: float | None = None,
    stand_in: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Partition, BatchedInfo]:
    """Batched SV memory: alpha ``[B, H, Tk]`` from keys ``k`` ``[B, H, Tk, D]``.

    Inputs are assumed checked (see :func:`svattn.nn.sv_attention`). ``alpha`` is
    differentiable w.r.t. ``k`` (through the final margin solve only). ``solver``
    holds ridge, ridge steps, FISTA iterations and repair rounds (default
    :class:`~svattn.nn.options.SolverOptions()`). No host synchronisation for
    ``Tk <=`` :data:`DENSE_MAX` or while compiling (module docstring).

    ``stand_in`` (bool ``[B, H]``): problems whose result the caller replaces (the
    short memories of :mod:`svattn.nn.masks`, given a feasible ``valid``). They are
    solved with ``K = I`` over their present keys (a well-conditioned problem with
    the uniform optimum, so the batch keeps its static shape without a host read)
    and their keys get no gradient.

    The keys of a translation-invariant kernel (rbf) are centred on the mean of each
    problem's valid keys first (:func:`~svattn.nn.common.centre_keys`, differentiable):
    the same memory, but the kernel matrix's dot form and the optimum finish's merge of
    copies (relative to the keys' norm) no longer lose the differences of keys far from
    the origin.
    """
    opts = SolverOptions() if solver is None else solver
    B, H, n, D = k.shape
    P = B * H
    vf = valid.reshape(P, n)
    # rbf sees only differences: centred keys give the same memory, without the
    # cancellation of keys far from the origin in K's dot form and the finish's merge
    kf = centre_keys(k.reshape(P, n, D), vf, kernel, gamma)  # (P, n, D), differentiable
    K, d, shift = kernel_problem(working_keys(kf.detach(), opts), vf, kernel, gamma)
    if stand_in is not None:
        s = stand_in.reshape(P, 1)
        w = vf.to(K.dtype)
        K = torch.where(s.unsqueeze(-1), torch.diag_embed(w), K)
        d = torch.where(s, w, d)
        kf = torch.where(s.unsqueeze(-1), 0.0, kf)
    sol = solve_partition(K, d, C, vf, opts, kkt_tol, keys=kf.detach())
    S, E = sol.margin, sol.error
    # The partition's final margin solve is the differentiable one: its factorization
    # serves the backward (nothing is solved twice).
    alpha, mu = margin_solve_factored(kf, sol.alpha, sol.mu, C, kernel, gamma,
                                      [(K, d, E, sol.factors)])
    R = vf & ~S & ~E
    with torch.no_grad():
        a, m = sol.alpha, sol.mu  # in K's dtype (float64 after the "optimum" finish)
        g = _kkt(K, d, a, m, S, E)
        viol = torch.where(R, (-g).clamp_min(0), torch.where(E, g.clamp_min(0), 0.0))
        viol = torch.where(S, g.abs(), viol).amax()
        tol = default_kkt_tol(K.dtype) if kkt_tol is None else kkt_tol
        out_of_box = vf & ((a < -tol) | (a > C + tol))
        # a problem whose alpha leaves the box or misses the sum is never settled
        feasible = ~out_of_box.any(-1) & ((a.sum(-1) - 1.0).abs() <= tol)
        unsettled = (~(sol.settled & feasible)).sum()
        fallbacks = sol.fallback.sum() if sol.fallback is not None else 0
    part = Partition(S.reshape(B, H, n), E.reshape(B, H, n), R.reshape(B, H, n))
    info = BatchedInfo(sol.iters, opts.refine if opts.finish == "approximate" else 0, viol,
                       out_of_box.sum(), unsettled, fallbacks)
    return alpha.reshape(B, H, n), part, info
