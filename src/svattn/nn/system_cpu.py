"""The margin systems on CPU in eager mode: their compiled passes (numba).

**Forward.**
:func:`svattn.nn.margin.solve_system` gathers each problem's bordered system
``[[2 K_SS + ridge·I, 1], [1ᵀ, 0]]`` to the batch's largest ``|S|`` (identity rows and
columns on the padded slots, the border pinning ``mu = 0`` where ``S`` is empty). In
torch that is a sort for the slot order, a row gather of ``K``, a column gather, a
batched product for ``K_SE 1``, three passes writing the matrix and a handful of small
ops for the right-hand side, each a pass over ``(P, s, n)`` memory; on CPU, in eager
mode, :func:`build_compact_system` writes the same matrix and right-hand side in one
pass per problem, row by row. The matrix is symmetric up to ``K``'s rounding (``K_ij``
and ``K_ji`` come from two sums), so LAPACK may factor its transpose, which is its
column-major layout (no transposing copy): the solve then differs from the torch
form's by rounding. ``tests/nn/test_nn_system_cpu.py`` compares it with the torch
form, entry by entry and through the margin solve's values and gradients.

**Backward.** The closed-form backward of :mod:`svattn.nn.margin` needs
``W_s X1`` with ``W_s = −2 Σ_k (λ̃_k a_kᵀ + a_k λ̃_kᵀ) ⊙ K`` over the kept keys (``λ̃`` lives
on ``S``, ``a`` on ``S ∪ E``) and ``X1 = [X, 1]``. The torch form gathers ``K``'s kept
block and multiplies it with ``2(t + 1)(D + 1)`` weighted columns; on CPU, in eager mode,
:func:`kernel_weights` writes ``W_s`` itself on the kept block (and the kept ``X1``) in
one pass, so the product has ``D + 1`` columns: half the arithmetic, and no gathers.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["build_compact_system", "kernel_weights"]


@njit(cache=True, nogil=True)
def _order_slots(mark, out, m):  # pragma: no cover - compiled
    """``out[:m]``: the marked keys ascending, then the others ascending (as
    ``gather_rows``); returns the number of marked keys (at most ``m``)."""
    c = 0
    for i in range(mark.shape[0]):
        if mark[i]:
            out[c] = i
            c += 1
    marked = c
    for i in range(mark.shape[0]):
        if c >= m:
            break
        if not mark[i]:
            out[c] = i
            c += 1
    return marked


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
            cs = _order_slots(S[p], idx[p], s)
            for a in range(s):
                sval[p, a] = a < cs
        nS = 0
        nE = 0
        for i in range(n):
            nS += S[p, i]
            nE += E[p, i]
        Kp = K[p]
        Mp = M[p]
        ip = idx[p]
        sp = sval[p]
        for a in range(s):  # row by row: contiguous writes, reads from one row of K
            ia = ip[a]
            Mrow = Mp[a]
            if sp[a]:
                Krow = Kp[ia]
                if identity:
                    for b in range(s):
                        Mrow[b] = 2.0 * Krow[b] if sp[b] else 0.0
                else:  # S's slots come first
                    for b in range(nS):
                        Mrow[b] = 2.0 * Krow[ip[b]]
                    for b in range(nS, s):
                        Mrow[b] = 0.0
                Mrow[a] += ridge
                ke = 0.0
                if nE:
                    for j in range(n):
                        if E[p, j]:
                            ke += Krow[j]
                rhs[p, a] = d[p, ia] - 2.0 * C * ke
                Mrow[s] = 1.0
                Mp[s, a] = 1.0
            else:
                for b in range(s):
                    Mrow[b] = 0.0
                Mrow[a] = 1.0
                rhs[p, a] = 0.0
                Mrow[s] = 0.0
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
    *,
    ordered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bordered margin systems of ``P`` problems gathered to ``s`` slots (CPU, no grad).

    Parameters
    ----------
    K : Tensor (P, n, n)
        Kernel matrices (symmetric up to rounding).
    d : Tensor (P, n)
        Their diagonals.
    S, E : bool Tensor (P, n)
        Margin and error sets.
    C, ridge : float
        Box and ridge.
    s : int
        Slots: at least the largest ``|S|`` (and at least 1), at most ``n``. With
        ``s = n`` every key is its own slot (the dense form, no gather), unless
        ``ordered``.
    ordered : bool
        Always put ``S``'s slots first (the form :mod:`svattn.nn.factor_cpu` factors),
        ``s = n`` included.

    Returns
    -------
    M : Tensor (P, s+1, s+1)
        ``[[2 K_SS + ridge·I, 1], [1ᵀ, 0]]`` on the slots of ``S``, identity rows and
        columns elsewhere; row ``a`` from row ``idx[a]`` of ``K``.
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
    identity = s == n and not ordered  # every key its own slot, in key order
    _build(K.contiguous().numpy(), d.to(dt).contiguous().numpy(), S.contiguous().numpy(),
           E.contiguous().numpy(), float(C), float(ridge), int(s), identity, M.numpy(),
           rhs.numpy(), idx.numpy(), sval.numpy())
    return M, rhs, idx, sval


@njit(cache=True, nogil=True)
def _weights(K, X, lam, av, kept, m, identity, W, X1, kidx):  # pragma: no cover - compiled
    P, n = kept.shape
    nz = lam.shape[2]
    D = X.shape[2]
    lk = np.empty((nz, m), dtype=W.dtype)
    ak = np.empty((nz, m), dtype=W.dtype)
    for p in range(P):
        # compact: the kept keys fill the first c slots, W_s is zero on the others
        c = m
        if identity:
            for i in range(n):
                kidx[p, i] = i
        else:  # the kept keys ascending, then the others ascending
            c = _order_slots(kept[p], kidx[p], m)
        for k in range(nz):  # the slots' weights, contiguous per iterate
            for a in range(m):
                lk[k, a] = lam[p, kidx[p, a], k]
                ak[k, a] = av[p, kidx[p, a], k]
        Kp = K[p]
        Wp = W[p]
        ip = kidx[p]
        for a in range(m):
            ia = ip[a]
            for j in range(D):
                X1[p, a, j] = X[p, ia, j]
            X1[p, a, D] = 1.0
            Wrow = Wp[a]
            if a >= c:
                for b in range(m):
                    Wrow[b] = 0.0
                continue
            Krow = Kp[ia]
            if nz == 1:
                la = lk[0, a]
                aa = ak[0, a]
                lrow = lk[0]
                arow = ak[0]
                if identity:
                    for b in range(m):
                        Wrow[b] = -2.0 * Krow[b] * (la * arow[b] + aa * lrow[b])
                else:
                    for b in range(c):
                        Wrow[b] = -2.0 * Krow[ip[b]] * (la * arow[b] + aa * lrow[b])
            else:
                for b in range(c):
                    Wrow[b] = 0.0
                for k in range(nz):
                    la = lk[k, a]
                    aa = ak[k, a]
                    lrow = lk[k]
                    arow = ak[k]
                    for b in range(c):
                        Wrow[b] += la * arow[b] + aa * lrow[b]
                for b in range(c):
                    Wrow[b] *= -2.0 * Krow[ip[b]]
            for b in range(c, m):
                Wrow[b] = 0.0


def kernel_weights(
    K: torch.Tensor, X: torch.Tensor, lam: torch.Tensor, av: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``W_s`` and ``X1 = [X, 1]`` on the kept keys of ``P`` problems (CPU, no grad).

    Parameters
    ----------
    K : Tensor (P, n, n)
        Kernel matrices (symmetric; one triangle is read).
    X : Tensor (P, n, D)
        Keys.
    lam, av : Tensor (P, n, t+1)
        The adjoints ``λ̃_k`` (zero off ``S``) and iterates ``a_k`` (zero off ``S ∪ E``).

    Returns
    -------
    W : Tensor (P, m, m)
        ``W_s = −2 Σ_k (λ̃_k a_kᵀ + a_k λ̃_kᵀ) ⊙ K`` on ``m`` slots, ``m`` the largest kept
        count (zero rows and columns on the padded slots), row by row (symmetric to
        ``K``'s rounding).
    X1 : Tensor (P, m, D + 1)
        ``[X, 1]`` on the slots.
    idx : Tensor (P, m) long, or None
        Key of each slot (kept keys first, ascending); None where ``m = n`` (slot = key).
    """
    P, n, D = X.shape
    dt = K.dtype
    kept = (lam != 0).any(-1) | (av != 0).any(-1)
    m = min(max(int(kept.sum(-1).max()), 1), n)  # host read: the kept block's size
    W = torch.empty(P, m, m, dtype=dt)
    X1 = torch.empty(P, m, D + 1, dtype=dt)
    idx = torch.empty(P, m, dtype=torch.long)
    _weights(K.contiguous().numpy(), X.to(dt).contiguous().numpy(),
             lam.to(dt).contiguous().numpy(), av.to(dt).contiguous().numpy(),
             kept.contiguous().numpy(), m, m == n, W.numpy(), X1.numpy(), idx.numpy())
    return W, X1, (idx if m < n else None)
