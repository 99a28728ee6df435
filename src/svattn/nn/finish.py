"""``finish_optimum``: the batched solver's answer made the SVDD optimum, verified per problem.

The batched solver's default finish (``SolverOptions(finish="optimum")``,
docs/design.md §5): FISTA's iterate is only a warm start; every problem is then
solved to its optimum in float64 by the compiled active set of
:mod:`svattn.nn.finish_cpu` (keys equal up to their rounding merged, no ridge), its answer checked
(box, ``Σ alpha = 1``, KKT signs), and a problem that fails the check is solved again
by the exact oracle :func:`svattn.exact.oracle.solve_svdd` (Clarabel, then an exact
active-set polish). What a problem ends with is verified once more; one that still
fails (the oracle raised) is counted as unsettled, never reported as settled.

This runs on the host, as one opaque operator (``svattn::finish_optimum``, so
``torch.compile(fullgraph=True)`` keeps the solver in one graph): on an accelerator
the kernel matrices and keys make one round trip (the finish's one host
synchronisation; the paper's ``"approximate"`` finish has none). The final
partition's bordered system is factored in float64
(:func:`svattn.nn.margin.solve_system` without ridge) for the backward, which is the
implicit gradient of that system (:mod:`svattn.nn.margin`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from svattn.exact.oracle import solve_svdd
from svattn.nn.finish_cpu import MERGE_EPS, finish_loop, spread_groups, verify_loop
from svattn.nn.margin import Factors, solve_system

__all__ = ["FINISH_TOL", "Finished", "finish_optimum", "optimum_factors", "oracle_solve"]

# KKT and feasibility tolerance of the finish, in units of the rescaled K (float64): held
# near rounding, since on trained keys 1e-6 apart (cond(K) ~1e16) a finish stopped at a KKT
# residual of 1e-9 was up to 4.5e-6 (L1) from the optimum
# (tests/nn/test_nn_finish.py, the near-copy boundary problems of a retrained model).
FINISH_TOL = 1e-12


class Finished(NamedTuple):
    """What :func:`finish_optimum` returns for ``P`` problems of ``n`` keys (float64)."""

    alpha: torch.Tensor  # (P, n) the optimum (duplicates split as a vertex of their box)
    mu: torch.Tensor  # (P,)
    margin: torch.Tensor  # bool (P, n)
    error: torch.Tensor  # bool (P, n)
    settled: torch.Tensor  # bool (P,): verified optimal to FINISH_TOL
    fallback: torch.Tensor  # bool (P,): re-solved by the exact oracle
    violation: torch.Tensor  # (P,) largest primal or dual violation after the finish


def oracle_solve(Kp: np.ndarray, rep: np.ndarray, vp: np.ndarray, C: float):
    """One problem by :func:`svattn.exact.oracle.solve_svdd`: the reduced problem the
    finish solves (every key of a group at its first key, so copies are exact
    duplicates of one another), spread over the copies as the finish spreads them;
    None if the oracle raised."""
    pos = np.flatnonzero(vp)
    at = rep[pos]  # each present key's representative
    Ks = Kp[np.ix_(at, at)]
    Ks = 0.5 * (Ks + Ks.T)
    try:
        a, mu = solve_svdd(Ks, C, return_mu=True)
    except (RuntimeError, ValueError):
        return None
    beta = np.zeros(vp.shape[0])
    np.add.at(beta, at, a)
    alpha, S, E = spread_groups(beta, rep, vp, C)
    return alpha, float(mu), S, E


@torch.library.custom_op("svattn::finish_optimum", mutates_args=())
def _finish_op(K: torch.Tensor, d: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor,
               a0: torch.Tensor, C: float, rel: float, tol: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                          torch.Tensor, torch.Tensor]:
    """The finish as one opaque operator: ``torch.compile`` keeps it in the graph as a
    single call (no graph break) and runs it as written."""
    dev = K.device
    Kn = K.detach().to("cpu", torch.float64).numpy()
    dn = d.detach().to("cpu", torch.float64).numpy()
    Xn = keys.detach().to("cpu").numpy()
    vn = valid.to("cpu").numpy()
    an = a0.detach().to("cpu", torch.float64).numpy()
    alpha, mu, S, E, ok, rep = finish_loop(Kn, dn, Xn, vn, rel, an, C, tol)
    viol = verify_loop(Kn, dn, vn, rep, alpha, mu, S, E, C).max(-1)
    fallback = ~ok | ~(viol <= tol)
    for p in np.flatnonzero(fallback):
        got = oracle_solve(Kn[p], rep[p], vn[p], C)
        if got is not None:
            alpha[p], mu[p], S[p], E[p] = got
    if fallback.any():
        viol = verify_loop(Kn, dn, vn, rep, alpha, mu, S, E, C).max(-1)
    settled = viol <= tol

    def back(x):
        return torch.from_numpy(x).to(dev)

    return (back(alpha), back(mu), back(S), back(E), back(settled), back(fallback),
            back(viol))


@_finish_op.register_fake
def _finish_shapes(K, d, keys, valid, a0, C, rel, tol):
    P, n = valid.shape
    f64, flag = dict(dtype=torch.float64), dict(dtype=torch.bool)
    return (K.new_empty(P, n, **f64), K.new_empty(P, **f64), valid.new_empty(P, n, **flag),
            valid.new_empty(P, n, **flag), valid.new_empty(P, **flag),
            valid.new_empty(P, **flag), K.new_empty(P, **f64))


def finish_optimum(
    K: torch.Tensor,
    d: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    a0: torch.Tensor,
    C: float,
    tol: float = FINISH_TOL,
) -> Finished:
    """The optimum of each problem from FISTA's iterate ``a0`` (no grad).

    Parameters
    ----------
    K : Tensor (P, n, n)
        Rescaled kernel matrices in float64 (:func:`svattn.nn.batched.kernel_problem` of
        the keys in float64), zero on absent keys.
    d : Tensor (P, n)
        Their diagonals.
    keys : Tensor (P, n, D)
        The keys in their own dtype: keys equal up to its rounding count as copies
        (:data:`svattn.nn.finish_cpu.MERGE_EPS`).
    valid : bool Tensor (P, n)
        Keys present.
    a0 : Tensor (P, n)
        A feasible point (FISTA's iterate).
    C : float
        Box.
    tol : float
        Verification tolerance (box, sum and KKT signs), in units of the rescaled K.

    Returns
    -------
    Finished
        On ``K``'s device, float64.
    """
    rel = MERGE_EPS * torch.finfo(keys.dtype).eps
    with torch.no_grad():
        out = _finish_op(K.detach(), d.detach(), keys.detach(), valid, a0.detach(), float(C),
                         float(rel), float(tol))
    return Finished(*out)


def optimum_factors(K, d, S, E, C, alpha, mu, compact: bool) -> Factors:
    """The final partition's bordered system factored for the backward (no ridge), its
    iterate set to the finish's own ``alpha``, ``mu`` (not the re-solve's)."""
    _, _, f = solve_system(K, d, S, E, C, 0.0, 0, compact)
    if f.idx is None:
        slots = alpha * f.sval.to(alpha.dtype)
    else:
        slots = alpha.gather(-1, f.idx) * f.sval.to(alpha.dtype)
    z = torch.cat([slots, mu.unsqueeze(-1)], -1).unsqueeze(-1)  # (P, s+1, 1)
    return f._replace(zs=(z,))
