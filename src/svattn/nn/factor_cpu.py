"""The bordered margin systems solved through a Cholesky of each one's own block (CPU).

:func:`svattn.nn.system_cpu.build_compact_system` writes, per problem ``p``, the system

    M = [[A, 0, 1], [0, I, 0], [1ᵀ, 0, e]],   A = 2 K_SS + ridge·I  (c_p × c_p),

padded to the batch's largest margin set with identity rows (``c_p = |S_p|`` real slots
first, the border last; ``e = 1`` only where ``S_p`` is empty). ``torch.linalg.lu_factor``
pays for the padded size of every problem and pivots a matrix whose leading block is
symmetric positive definite (``ridge > 0``). Here each problem's block is factored at
its own size with LAPACK's ``potrf`` (scipy's ``cython_lapack``, called from compiled
code), ``A = G Gᵀ``, and a solve is block elimination at that size:

    y = G⁻¹ 1 (once),  t = G⁻¹ b₁,  mu = (yᵀt − b_border) / yᵀy,  z₁ = G⁻ᵀ (t − y·mu),

identity rows copied (the Schur complement ``−yᵀy`` of an SPD block needs no pivoting).
Where ``potrf`` finds a block not positive definite in the working precision the
caller falls back to the pivoted LU. ``tests/nn/test_nn_factor_cpu.py`` holds the solves
to ``torch.linalg.solve`` of the same systems.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch
from numba import njit
from numba.extending import get_cython_function_address

__all__ = ["BorderedCholesky", "factor_bordered"]

_PTR = ctypes.c_void_p
# potrf(uplo, n, a, lda, info): passed to the compiled loop as an argument, so the loop
# stays cacheable (a ctypes pointer among its globals would not be)
_POTRF = {
    dt: ctypes.CFUNCTYPE(None, _PTR, _PTR, _PTR, _PTR, _PTR)(
        get_cython_function_address("scipy.linalg.cython_lapack", name))
    for dt, name in ((torch.float32, "spotrf"), (torch.float64, "dpotrf"))
}


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _forward(Mp, z, c):  # pragma: no cover - compiled
    """``z[:c] ← G⁻¹ z[:c]`` in place, by columns (G(i, k) = Mp[k, i]: contiguous rows)."""
    for k in range(c):
        zk = z[k] / Mp[k, k]
        z[k] = zk
        row = Mp[k]
        for i in range(k + 1, c):
            z[i] -= row[i] * zk


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _factor(M, counts, yw, potrf):  # pragma: no cover - compiled
    """Cholesky of every problem's block in place (row-major buffer ``M``: LAPACK's
    column-major view is the logical matrix, G(i, k) for i >= k at ``M[p, k, i]``) and
    ``yw[p] = [G⁻¹ 1; 0…; 1ᵀA⁻¹1]``; False where a block is not positive definite."""
    P, N, _ = M.shape
    s = N - 1  # the border
    uplo = np.array([76], dtype=np.uint8)  # 'L' of the logical matrix
    lda = np.array([N], dtype=np.int32)
    size = np.zeros(1, dtype=np.int32)
    info = np.zeros(1, dtype=np.int32)
    for p in range(P):
        c = counts[p]
        y = yw[p]
        for i in range(N):
            y[i] = 0.0
        if c == 0:
            continue  # identity with the border pinned: nothing to factor
        Mp = M[p]
        size[0] = c
        potrf(uplo.ctypes, size.ctypes, Mp.ctypes, lda.ctypes, info.ctypes)
        if info[0] != 0:
            return False
        for i in range(c):
            y[i] = 1.0
        _forward(Mp, y, c)  # y = G⁻¹ 1
        yy = 0.0
        for k in range(c):
            yy += y[k] * y[k]
        y[s] = yy
    return True


# reassociation lets the dot products and axpys vectorize (no NaN/Inf assumptions)
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _solve(M, counts, yw, b, out):  # pragma: no cover - compiled
    """``out[p] = M_p⁻¹ b[p]`` from the factors of :func:`_factor` (block elimination:
    ``t = G⁻¹ b₁``, ``mu = (yᵀt − b_s) / yᵀy``, ``z₁ = G⁻ᵀ (t − y mu)``)."""
    P, N, _ = M.shape
    s = N - 1
    for p in range(P):
        c = counts[p]
        bp = b[p]
        z = out[p]
        for i in range(c, N):
            z[i] = bp[i]  # identity rows; the pinned border where S is empty
        if c == 0:
            continue
        Mp = M[p]
        y = yw[p]
        for i in range(c):
            z[i] = bp[i]
        _forward(Mp, z, c)  # t = G⁻¹ b₁
        yt = 0.0
        for k in range(c):
            yt += y[k] * z[k]
        mu = (yt - bp[s]) / y[s]
        z[s] = mu
        for k in range(c):
            z[k] -= y[k] * mu
        for i in range(c - 1, -1, -1):  # backward: Gᵀ z₁ = r by rows (G(k, i) = Mp[i, k])
            row = Mp[i]
            acc = z[i]
            for k in range(i + 1, c):
                acc -= row[k] * z[k]
            z[i] = acc / row[i]


class BorderedCholesky(NamedTuple):
    """Factors of the bordered systems: ``G`` in ``M``'s buffer, ``yw`` and ``counts``."""

    M: torch.Tensor  # (P, s+1, s+1): each block's Cholesky factor (LAPACK's lower triangle)
    yw: torch.Tensor  # (P, s+1): G⁻¹ 1 on the block, 1ᵀA⁻¹1 last
    counts: torch.Tensor  # (P,) int64: |S| of each problem

    def solve(self, b: torch.Tensor) -> torch.Tensor:
        """``M⁻¹ b`` for ``b`` (P, s+1, 1) in ``M``'s dtype (M symmetric: also ``M⁻ᵀ b``)."""
        P, N, _ = self.M.shape
        if b.shape != (P, N, 1) or b.dtype != self.M.dtype:
            raise ValueError(f"b must be ({P}, {N}, 1) {self.M.dtype}, got {tuple(b.shape)} "
                             f"{b.dtype}")
        out = torch.empty(P, N, 1, dtype=b.dtype)
        _solve(self.M.numpy(), self.counts.numpy(), self.yw.numpy(),
               b.detach().squeeze(-1).contiguous().numpy(), out.squeeze(-1).numpy())
        return out


def factor_bordered(M: torch.Tensor, counts: torch.Tensor) -> BorderedCholesky | None:
    """Factor the bordered systems in ``M`` in place; their factors, or None.

    Parameters
    ----------
    M : Tensor (P, s+1, s+1), float32 or float64, contiguous, CPU
        The buffer of :func:`svattn.nn.system_cpu.build_compact_system` with the slots
        ordered (``S`` first).
    counts : Tensor (P,)
        ``|S|`` of each problem (its real slots).

    Returns
    -------
    BorderedCholesky or None
        The factors (``.solve(b)``); None where a block is not positive definite in
        ``M``'s precision (``M`` is then overwritten: rebuild it).
    """
    if M.dtype not in _POTRF or not M.is_contiguous() or M.device.type != "cpu":
        raise ValueError(f"M must be a contiguous float32/float64 CPU tensor, got "
                         f"{M.dtype} on {M.device} (contiguous: {M.is_contiguous()})")
    P, N, _ = M.shape
    counts = counts.to(torch.int64).contiguous()
    yw = torch.empty(P, N, dtype=M.dtype)
    ok = _factor(M.numpy(), counts.numpy(), yw.numpy(), _POTRF[M.dtype])
    return BorderedCholesky(M, yw, counts) if ok else None
