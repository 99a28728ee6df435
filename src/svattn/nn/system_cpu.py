"""The margin systems' compact form on CPU in eager mode, built in one compiled pass (numba).

:func:`svattn.nn.margin.solve_system` gathers each problem's bordered system
``[[2 K_SS + ridge·I, 1], [1ᵀ, 0]]`` to the batch's largest ``|S|`` (identity rows and
columns on the padded slots, the border pinning ``mu = 0`` where ``S`` is empty). In
torch that is a sort for the slot order, a row gather of ``K``, a column gather, a
batched product for ``K_SE 1``, three passes writing the matrix and a handful of small
ops for the right-hand side, each a pass over ``(P, s, n)`` memory; on CPU, in eager
mode, :func:`build_compact_system` writes the same matrix and right-hand side in one
pass per problem. The matrix is exactly symmetric (each entry pair written from one
``K`` entry), so LAPACK may factor its transpose, which is its own column-major layout
(no transposing copy). ``tests/nn/test_nn_system_cpu.py`` compares it with the torch
form, entry by entry and through the margin solve's values and gradients.
"""

from __future__ import annotations

import torch
from numba import njit

__all__ = ["build_compact_system"]


@njit(cache=True, nogil=True)
def _build(K, d, S, E, C, ridge, s, identity, M, rhs, idx, sval):  # pragma: no cover
    P, n = S.shape
    for p in range(P):
        # slot order: S's keys ascending, then the others ascending (as gather_rows)
        if identity:
            for i in range(n):
                idx[p, i] = i
                sval[p, i] = S[p, i]
        else:
            c = 0
            for i in range(n):
                if S[p, i]:
                    idx[p, c] = i
                    c += 1
            cs = c
            for i in range(n):
                if c >= s:
                    break
                if not S[p, i]:
                    idx[p, c] = i
                    c += 1
            for a in range(s):
                sval[p, a] = a < cs
        nS = 0
        nE = 0
        for i in range(n):
            nS += S[p, i]
            nE += E[p, i]
        Kp = K[p]
        Mp = M[p]
        for a in range(s):
            ia = idx[p, a]
            if sval[p, a]:
                for b in range(a, s):
                    if sval[p, b]:
                        w = 2.0 * Kp[ia, idx[p, b]]
                    else:
                        w = 0.0
                    Mp[a, b] = w
                    Mp[b, a] = w
                Mp[a, a] += ridge
                ke = 0.0
                if nE:
                    for j in range(n):
                        if E[p, j]:
                            ke += Kp[ia, j]
                rhs[p, a] = d[p, ia] - 2.0 * C * ke
                Mp[a, s] = 1.0
                Mp[s, a] = 1.0
            else:
                for b in range(a, s):
                    Mp[a, b] = 0.0
                    Mp[b, a] = 0.0
                Mp[a, a] = 1.0
                rhs[p, a] = 0.0
                Mp[a, s] = 0.0
                Mp[s, a] = 0.0
        if nS:
            Mp[s, s] = 0.0
            rhs[p, s] = 1.0 - C * nE
        else:  # empty margin set: the border row pins mu = 0
            Mp[s, s] = 1.0
            rhs[p, s] = 0.0


def build_compact_system(
    K: torch.Tensor,
    d: torch.Tensor,
    S: torch.Tensor,
    E: torch.Tensor,
    C: float,
    ridge: float,
    s: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bordered margin systems of ``P`` problems gathered to ``s`` slots (CPU, no grad).

    Parameters
    ----------
    K : Tensor (P, n, n)
        Kernel matrices (symmetric; only the entries ``K[i, j]``, ``i`` before ``j`` in
        slot order, are read).
    d : Tensor (P, n)
        Their diagonals.
    S, E : bool Tensor (P, n)
        Margin and error sets.
    C, ridge : float
        Box and ridge.
    s : int
        Slots: at least the largest ``|S|`` (and at least 1), at most ``n``. With
        ``s = n`` every key is its own slot (the dense form, no gather).

    Returns
    -------
    M : Tensor (P, s+1, s+1)
        ``[[2 K_SS + ridge·I, 1], [1ᵀ, 0]]`` on the slots of ``S``, identity rows and
        columns elsewhere; exactly symmetric.
    rhs : Tensor (P, s+1)
        ``[d_S − 2C K_SE 1; 1 − C|E|]`` (0 off ``S``; 0 for ``mu`` where ``S`` is empty).
    idx : Tensor (P, s) long
        Key of each slot.
    sval : bool Tensor (P, s)
        Slots in ``S``.
    """
    P, n = S.shape
    if not 1 <= s <= n:
        raise ValueError(f"s must be in [1, n = {n}], got {s}")
    dt = K.dtype
    M = torch.empty(P, s + 1, s + 1, dtype=dt)
    rhs = torch.empty(P, s + 1, dtype=dt)
    idx = torch.empty(P, s, dtype=torch.long)
    sval = torch.empty(P, s, dtype=torch.bool)
    _build(K.contiguous().numpy(), d.to(dt).contiguous().numpy(), S.contiguous().numpy(),
           E.contiguous().numpy(), float(C), float(ridge), int(s), s == n, M.numpy(),
           rhs.numpy(), idx.numpy(), sval.numpy())
    return M, rhs, idx, sval
