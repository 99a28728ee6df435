"""The optimum finish on long memories without the ``n × n`` kernel matrix (CPU, eager).

:func:`svattn.nn.batched.solve_batched` with ``finish="optimum"`` forms every
problem's kernel matrix in float64, runs FISTA over it and then the active set of
:mod:`svattn.nn.finish_cpu` on all ``n`` keys: ``O(n²)`` memory and ``O(n²·D)`` work
per problem before the first active-set round, where the optimum itself is carried by a
few hundred keys. From :data:`WORKING_SET_MIN` keys on (CPU, eager: the sizes below
are read on the host) the same optimum is found on a **working set** instead, as SVM
decomposition methods do (Osuna et al., 1997):

1. **Copies merged over all keys** (:func:`svattn.nn.groups_cpu.copy_groups`, the
   reference's groups); the reduced problem over the representatives is the one solved,
   exactly as the full finish solves it.
2. **Start**: the :data:`WORKING_SET_START` representatives farthest from the centre of
   a uniform memory over an even sample of the keys (largest ``d_i − 2·mean_j K_ij``:
   the keys an SVDD keeps lie on the outside). FISTA (``max_iter`` iterations, the
   keys' own dtype) runs on the working set's keys, batched over the problems, as the
   full finish's warm start.
3. **Solve and check**: the reduced problem on the working set (keys outside it at 0)
   is solved by the full finish's active set (:func:`svattn.nn.finish_cpu.solve_reduced`,
   the exact oracle where it fails); then ``g = 2Kβ − d + μ`` is computed for **every**
   key from the kernel columns of the kept keys only (``n × |kept|``). A key outside
   the working set with ``g < −tol`` violates its KKT condition (it is at 0 and would
   lower the objective): up to :data:`WORKING_SET_GROW` of the worst join, and the
   working set is solved again from its last partition. When none violates, the
   working set's optimum satisfies the KKT conditions of the whole problem to the
   finish's tolerance: it is the problem's optimum (the same problem, the same
   tolerance, the same verification as the full finish).
4. **Verified** on every key (box, sum, KKT signs over all representatives); a problem
   that fails, or has not converged within :data:`WORKING_SET_ROUNDS` rounds, is solved
   by the exact oracle on its full kernel matrix, as the full finish's fallback.

Every later step needs the kept keys only (reserve keys have ``alpha = 0``, their
rows of the margin system are identities, their readout weight is 0): the final
partition's bordered system and the differentiable margin solve
(:func:`svattn.nn.margin.margin_solve_factored`) run on the kept keys gathered from the
keys (a differentiable gather), and ``alpha`` is scattered back to ``(P, n)``. The
kernel of the kept columns uses the same shift (the largest ``log K_ii`` over all keys)
and formula as :func:`svattn.nn.batched.scaled_kernel_matrix`.

:func:`solve_memory` is what :func:`svattn.nn.sv_attention` and
:class:`svattn.nn.SVAttention` call: this path where :func:`use_working_set` says so,
:func:`svattn.nn.batched.solve_batched` (the full finish) elsewhere. (The hybrid mixer's
boundary problems call the full finish: the ``"support"`` policy's hold at most
``budget + L`` keys.) The full path is the reference: ``tests/nn/test_nn_working_set.py``
compares alpha, the partition, the diagnostics and the gradients of both.
"""

from __future__ import annotations

import numpy as np
import torch

from svattn.exact.core.kernels import get_kernel
from svattn.nn.batched import (
    BatchedInfo,
    default_kkt_tol,
    exp_floor,
    fista,
    scaled_kernel_matrix,
    solve_batched,
)
from svattn.nn.common import (
    Partition,
    centre_keys,
    flat_rows,
    gather_rows,
    host_reads,
    log_kernel_diag,
)
from svattn.nn.finish import FINISH_TOL, optimum_factors, oracle_solve
from svattn.nn.finish_cpu import MERGE_EPS, solve_reduced, spread_groups
from svattn.nn.groups_cpu import copy_groups
from svattn.nn.margin import margin_solve_factored
from svattn.nn.options import SolverOptions

__all__ = ["WORKING_SET_GROW", "WORKING_SET_MIN", "WORKING_SET_ROUNDS", "WORKING_SET_START",
           "WorkingSetResult", "solve_memory", "solve_working_set", "use_working_set",
           "working_set_optimum"]

# Keys per problem from which CPU eager solves the optimum on a working set.
WORKING_SET_MIN = 1024
# Representatives in the first working set (at least 2·⌈1/C⌉).
WORKING_SET_START = 384
# Most violators that join per round.
WORKING_SET_GROW = 256
# Rounds before a problem is handed to the exact oracle on its full kernel matrix.
WORKING_SET_ROUNDS = 64
# Keys of the even sample whose uniform memory ranks the first working set.
_SAMPLE = 256


def use_working_set(k: torch.Tensor, solver: SolverOptions, stand_in: torch.Tensor | None
                    ) -> bool:
    """Whether :func:`solve_memory` takes this path: CPU, eager,
    ``finish="optimum"``, no stand-in problems, at least :data:`WORKING_SET_MIN` keys
    (read at call time: a test sets it to compare with the full path)."""
    return (solver.finish == "optimum" and stand_in is None and host_reads(k)
            and k.shape[-2] >= WORKING_SET_MIN)


def solve_memory(
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
    """:func:`svattn.nn.batched.solve_batched` (same arguments and results), on working
    sets where :func:`use_working_set` says so: what :func:`svattn.nn.sv_attention`
    calls."""
    opts = SolverOptions() if solver is None else solver
    if use_working_set(k, opts, stand_in):
        return solve_working_set(k, C, kernel=kernel, gamma=gamma, valid=valid, solver=opts,
                                 kkt_tol=kkt_tol)
    return solve_batched(k, C, kernel=kernel, gamma=gamma, valid=valid, solver=opts,
                         kkt_tol=kkt_tol, stand_in=stand_in)


class _Kernel:
    """Blocks ``exp(s x_i·x_j + h_i + h_j)`` of one problem's rescaled kernel matrix
    (float64), as :func:`svattn.nn.batched.scaled_kernel_matrix` computes its entries."""

    def __init__(self, X: torch.Tensor, h: torch.Tensor, scale: float, floor: float):
        self.X, self.h, self.scale, self.floor = X, h, scale, floor

    def block(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        K = torch.addmm(self.h[rows].unsqueeze(-1), self.X[rows], self.X[cols].T,
                        alpha=self.scale)
        return K.add_(self.h[cols].unsqueeze(-2)).clamp_min_(self.floor).exp_()


class WorkingSetResult:
    """What :func:`working_set_optimum` finds for ``P`` problems of ``n`` keys (float64,
    numpy): as :class:`svattn.nn.finish.Finished`, plus per problem the rounds run."""

    def __init__(self, P: int, n: int):
        self.alpha = np.zeros((P, n))
        self.mu = np.zeros(P)
        self.margin = np.zeros((P, n), dtype=bool)
        self.error = np.zeros((P, n), dtype=bool)
        self.settled = np.zeros(P, dtype=bool)
        self.fallback = np.zeros(P, dtype=bool)
        self.violation = np.zeros(P)
        self.rounds = np.zeros(P, dtype=np.int64)
        self.working = np.zeros(P, dtype=np.int64)  # final working-set size (representatives)


def _start(kern: _Kernel, reps: np.ndarray, d_r: np.ndarray, size: int) -> np.ndarray:
    """Positions (into ``reps``) of the first working set, ascending: the ``size``
    representatives of largest ``d_i − 2·mean_j K_ij`` over an even sample ``j``."""
    m = len(reps)
    if size >= m:
        return np.arange(m)
    sample = reps[np.unique(np.linspace(0, m - 1, min(_SAMPLE, m)).round().astype(np.int64))]
    Ks = kern.block(torch.from_numpy(reps), torch.from_numpy(sample)).mean(-1).numpy()
    score = d_r - 2.0 * Ks  # distance² to the sample's centre, up to a constant
    return np.sort(np.argpartition(-score, size - 1)[:size])


def _states(x: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The partition of a feasible point, as the finish starts from one (0 R, 1 S, 2 E)."""
    return np.where(x >= cap, 2, np.where(x > 0.0, 1, 0)).astype(np.int8)


def _mu_convention(st: np.ndarray, g0: np.ndarray, mu: float) -> float:
    """``mu`` with an empty margin set: the largest with every ``g_E <= 0``
    (:func:`svattn.nn.finish_cpu._empty_mu`), 0 without E; ``mu`` itself otherwise."""
    if (st == 1).any():
        return mu
    e = st == 2
    return float((-g0[e]).min()) if e.any() else 0.0


def _gradient(kern: _Kernel, rows: np.ndarray, cols: np.ndarray, w: np.ndarray,
              d_rows: np.ndarray) -> np.ndarray:
    """``2 K[rows, cols] w − d`` (float64), from the kernel columns of ``cols`` only."""
    if len(cols) == 0:
        return -d_rows
    Kc = kern.block(torch.from_numpy(rows), torch.from_numpy(cols))
    return 2.0 * (Kc @ torch.from_numpy(w)).numpy() - d_rows


def _oracle_on(kern: _Kernel, keys: np.ndarray, rep: np.ndarray, C: float):
    """The exact oracle (:func:`svattn.nn.finish.oracle_solve`) on ``keys`` (ascending, their
    groups complete), as the full finish's fallback: ``(alpha, mu, S, E)`` over ``keys``,
    or None where it raised."""
    t = torch.from_numpy(keys)
    local = np.searchsorted(keys, rep[keys])  # each key's representative, as a local index
    return oracle_solve(kern.block(t, t).numpy(), local, np.ones(len(keys), dtype=bool), C)


def _verify(kern: _Kernel, d: np.ndarray, valid: np.ndarray, rep: np.ndarray,
            reps: np.ndarray, alpha: np.ndarray, S: np.ndarray, E: np.ndarray, C: float,
            mu: float) -> tuple[float, float]:
    """:func:`svattn.nn.finish_cpu.verify_loop` for one problem, ``K`` from the kept
    columns: ``(largest primal or dual violation, mu)`` (``mu`` of an empty margin set
    set to the convention)."""
    a = alpha[valid]
    prim = max(float(np.max(-a, initial=0.0)), float(np.max(a - C, initial=0.0)),
               abs(float(a.sum()) - 1.0), float(np.abs(alpha[~valid]).max(initial=0.0)))
    beta = np.zeros(len(rep))
    np.add.at(beta, rep[valid], a)
    kept = reps[beta[reps] != 0.0]
    g = _gradient(kern, reps, kept, beta[kept], d[reps])  # per representative
    g_at = np.zeros(len(rep))
    g_at[reps] = g
    if not S.any():
        mu = float((-g_at[rep[E]]).min()) if E.any() else 0.0
    in_s = np.zeros(len(rep), dtype=bool)
    in_e = np.zeros(len(rep), dtype=bool)
    in_s[rep[S]] = True
    in_e[rep[E]] = True
    gi = g + mu
    dual = np.where(in_s[reps], np.abs(gi), np.where(in_e[reps], gi, -gi))
    return max(prim, float(dual.max(initial=0.0))), mu


def _problem(kern: _Kernel, d: np.ndarray, valid: np.ndarray, groups,
             in_w: np.ndarray, x_all: np.ndarray, C: float, tol: float,
             res: WorkingSetResult, p: int) -> None:
    """One problem's optimum into ``res`` (module docstring, steps 3 and 4), from the
    working set ``in_w`` (bool over the representatives) and the group sums ``x_all``
    of FISTA's iterate on it."""
    rep, mult, reps = groups
    m = len(reps)
    d_r, cap = d[reps], mult[reps] * C
    pos = np.full(len(rep), -1)
    pos[reps] = np.arange(m)
    present = np.flatnonzero(valid)
    st_all = _states(x_all, cap)
    done, used_oracle, mu, rounds = False, False, 0.0, 0
    while rounds < WORKING_SET_ROUNDS:
        rounds += 1
        W = np.flatnonzero(in_w)
        idx = torch.from_numpy(reps[W])
        st = st_all[W].copy()
        x, mu, ok = solve_reduced(kern.block(idx, idx).numpy(), d_r[W], cap[W], x_all[W], st,
                                  tol)
        if not ok:  # the oracle on the working set's keys, as the full finish falls back
            wkeys = present[in_w[pos[rep[present]]]]
            got = _oracle_on(kern, wkeys, rep, C)
            if got is None:
                break
            used_oracle = True
            a_k, mu = got[0], got[1]
            x = np.zeros(len(W))
            np.add.at(x, np.searchsorted(W, pos[rep[wkeys]]), a_k)
            st = _states(x, cap[W])
        x_all[:] = 0.0
        x_all[W] = x
        st_all[W] = st
        on = x > 0.0
        g0 = _gradient(kern, reps, reps[W[on]], x[on], d_r)
        mu = _mu_convention(st, g0[W], mu)
        g = g0 + mu
        worst = np.flatnonzero(~in_w & (g < -tol))
        if len(worst) == 0:
            done = True
            break
        if len(worst) > WORKING_SET_GROW:
            worst = worst[np.argpartition(g[worst], WORKING_SET_GROW - 1)[:WORKING_SET_GROW]]
        in_w[worst] = True  # they join at 0, in the reserve set
    res.rounds[p], res.working[p] = rounds, int(in_w.sum())
    viol = np.inf
    if done:
        beta = np.zeros(len(rep))
        beta[reps] = x_all
        alpha, S, E = spread_groups(beta, rep, valid, C)
        viol, mu = _verify(kern, d, valid, rep, reps, alpha, S, E, C, mu)
    if not viol <= tol:  # the full finish's fallback: the oracle on the whole problem
        used_oracle = True
        alpha = np.zeros(len(rep))
        S, E = np.zeros(len(rep), dtype=bool), np.zeros(len(rep), dtype=bool)
        got = _oracle_on(kern, present, rep, C)
        if got is not None:
            alpha[present], mu, S[present], E[present] = got
            viol, mu = _verify(kern, d, valid, rep, reps, alpha, S, E, C, mu)
    res.alpha[p], res.margin[p], res.error[p], res.mu[p] = alpha, S, E, mu
    res.violation[p], res.settled[p], res.fallback[p] = viol, viol <= tol, used_oracle


def working_set_optimum(kd: torch.Tensor, valid: torch.Tensor, C: float, kernel: str,
                        gamma: float, max_iter: int, tol: float = FINISH_TOL
                        ) -> tuple[WorkingSetResult, torch.Tensor, torch.Tensor]:
    """The optimum of each problem of keys ``kd`` (P, n, D) (no grad; module docstring).

    Returns the result (numpy, float64), the diagonals ``d`` (P, n) and the shifts (P,)
    of the rescaled kernel matrices (float64), as
    :func:`svattn.nn.batched.kernel_problem` gives them.
    """
    P, n, D = kd.shape
    X = kd.to(torch.float64)
    ldiag = log_kernel_diag(X, kernel, gamma)  # (P, n)
    shift = torch.where(valid, ldiag, -torch.finfo(torch.float64).max).amax(-1)  # (P,)
    d = torch.where(valid, (ldiag - shift[:, None]).exp(), 0.0)
    scale, c = get_kernel(kernel).dot_form(gamma)
    h = -0.5 * shift.unsqueeze(-1).expand(P, n)
    if c:
        h = h - c * (X * X).sum(-1)
    rel = MERGE_EPS * torch.finfo(kd.dtype).eps
    Xn, vn, dn = X.numpy(), valid.numpy(), d.numpy()
    kerns = [_Kernel(X[p], h[p], scale, exp_floor(torch.float64)) for p in range(P)]
    start = max(WORKING_SET_START, 2 * int(np.ceil(1.0 / C - 1e-9)))
    groups, works, keys = [], [], []
    for p in range(P):
        rep, mult, reps = copy_groups(Xn[p], vn[p], rel)
        in_w = np.zeros(len(reps), dtype=bool)
        in_w[_start(kerns[p], reps, dn[p, reps], start)] = True
        present = np.flatnonzero(vn[p])
        pos = np.full(n, -1)
        pos[reps] = np.arange(len(reps))
        groups.append((rep, mult, reps))
        works.append(in_w)
        keys.append(present[in_w[pos[rep[present]]]])
    # FISTA on the first working sets' keys, batched (padded), as the full finish's warm start
    w = max(len(k) for k in keys)
    idx = torch.zeros(P, w, dtype=torch.long)
    vw = torch.zeros(P, w, dtype=torch.bool)
    for p, k in enumerate(keys):
        idx[p, : len(k)] = torch.from_numpy(k)
        vw[p, : len(k)] = True
    Xw = X.gather(1, idx.unsqueeze(-1).expand(P, w, D))
    Kw = scaled_kernel_matrix(Xw, vw, shift, kernel, gamma)
    dw = torch.where(vw, d.gather(1, idx), 0.0)
    a0, _ = fista(Kw.to(kd.dtype), dw.to(kd.dtype), C, vw, max_iter=max_iter)
    a0 = a0.to(torch.float64).numpy()
    res = WorkingSetResult(P, n)
    for p in range(P):
        rep, mult, reps = groups[p]
        pos = np.full(n, -1)
        pos[reps] = np.arange(len(reps))
        x_all = np.zeros(len(reps))
        np.add.at(x_all, pos[rep[keys[p]]], a0[p, : len(keys[p])])
        _problem(kerns[p], dn[p], vn[p], groups[p], works[p], x_all, C, tol, res, p)
    return res, d, shift


def solve_working_set(
    k: torch.Tensor,
    C: float,
    *,
    kernel: str,
    gamma: float,
    valid: torch.Tensor,
    solver: SolverOptions,
    kkt_tol: float | None = None,
):
    """:func:`svattn.nn.batched.solve_batched` with ``finish="optimum"`` on working sets
    (module docstring): alpha ``[B, H, n]`` (differentiable w.r.t. ``k`` through the
    kept keys' margin solve), the :class:`~svattn.nn.common.Partition` and the
    :class:`~svattn.nn.batched.BatchedInfo`, as that function returns them."""
    B, H, n, D = k.shape
    P = B * H
    vf = valid.reshape(P, n)
    kf = centre_keys(k.reshape(P, n, D), vf, kernel, gamma)  # as solve_batched
    with torch.no_grad():
        res, d, shift = working_set_optimum(kf.detach(), vf, C, kernel, gamma,
                                            solver.max_iter)
        S, E = torch.from_numpy(res.margin), torch.from_numpy(res.error)
        a, mu = torch.from_numpy(res.alpha), torch.from_numpy(res.mu)
        idx, vc = gather_rows(S | E)  # the kept keys, padded with distinct unkept ones
        flat = flat_rows(idx, n)
        Xc = kf.detach().to(torch.float64).reshape(P * n, D).index_select(0, flat).view(
            P, -1, D)
        Kc = scaled_kernel_matrix(Xc, vc, shift, kernel, gamma)
        dc = torch.where(vc, d.gather(1, idx), 0.0)
        Sc, Ec, ac = S.gather(1, idx) & vc, E.gather(1, idx) & vc, a.gather(1, idx)
        f = optimum_factors(Kc, dc, Sc, Ec, C, ac, mu, True)
    kc = kf.reshape(P * n, D).index_select(0, flat).view(P, -1, D)  # with grad
    alpha_c, _ = margin_solve_factored(kc, ac, mu, C, kernel, gamma, [(Kc, dc, Ec, f)])
    alpha = alpha_c.new_zeros(P * n).index_copy(0, flat, alpha_c.reshape(-1))
    R = vf & ~S & ~E
    with torch.no_grad():
        g = _key_gradient(kf.detach(), vf, a, mu, S, E, d, shift, kernel, gamma)
        viol = torch.where(R, (-g).clamp_min(0), torch.where(E, g.clamp_min(0), 0.0))
        viol = torch.where(S, g.abs(), viol).amax()
        tol = default_kkt_tol(torch.float64) if kkt_tol is None else kkt_tol
        out_of_box = vf & ((a < -tol) | (a > C + tol))
        feasible = ~out_of_box.any(-1) & ((a.sum(-1) - 1.0).abs() <= tol)
        unsettled = (~(torch.from_numpy(res.settled) & feasible)).sum()
    part = Partition(S.view(B, H, n), E.view(B, H, n), R.view(B, H, n))
    info = BatchedInfo(solver.max_iter, 0, viol, out_of_box.sum(), unsettled,
                       torch.from_numpy(res.fallback).sum())
    return alpha.view(B, H, n), part, info


def _key_gradient(kd, valid, a, mu, S, E, d, shift, kernel, gamma) -> torch.Tensor:
    """``g = 2 K alpha − d + mu`` on every key (P, n), as the full path's diagnostics
    (``mu`` of an empty margin set: the largest feasible one), from the kernel columns
    of the keys with ``alpha > 0`` (one batched product of ``n × |kept|``)."""
    P, n, D = kd.shape
    X = kd.to(torch.float64)
    idx, vc = gather_rows(a > 0)
    Xc = X.gather(1, idx.unsqueeze(-1).expand(P, idx.shape[1], D))
    scale, c = get_kernel(kernel).dot_form(gamma)
    h = -0.5 * shift.unsqueeze(-1).expand(P, n)
    if c:
        h = h - c * (X * X).sum(-1)
    K = torch.baddbmm(h.unsqueeze(-1), X, Xc.mT, alpha=scale)  # (P, n, kept)
    K = K.add_(h.gather(1, idx).unsqueeze(-2)).clamp_min_(exp_floor(K.dtype)).exp_()
    w = torch.where(vc, a.gather(1, idx), 0.0)  # padded columns weigh 0
    g0 = 2.0 * torch.bmm(K, w.unsqueeze(-1)).squeeze(-1) - d
    g0 = torch.where(valid, g0, -d)  # absent keys: K is 0 there
    big = torch.finfo(torch.float64).max
    mu_empty = torch.where(E, -g0, big).amin(-1)
    mu = torch.where(S.any(-1), mu, mu_empty)
    return g0 + mu.unsqueeze(-1)
