"""Exact path: float64 SVDD solve per (batch, head), implicit-differentiation backward.

Layout ``[B, H, T, D]``. :class:`ExactAlpha` maps keys ``k`` ``[B, H, Tk, D]`` to the
exact memory coefficients ``alpha`` ``[B, H, Tk]``; the readout is then the
ordinary differentiable :func:`svattn.nn.readout.readout_fused`.

Forward: for each (batch, head), the certified solver
:class:`svattn.exact.memory.SVDDMemory` (numpy float64) over the present keys,
keeping its :meth:`margin_system` — the partition (S, E, R), ``mu`` and the
inverse of the bordered KKT matrix ``Q = [[0, 1^T], [1, 2 K_SS]]``.

Backward: with the partition fixed (locally constant where the optimum is
unique and non-degenerate), ``alpha_E = C``, ``alpha_R = 0`` and
``z = [mu; alpha_S] = Q^{-1} r`` with ``r = [1 − C|E|; d_S − 2C K_SE 1]``. For an
upstream gradient ``ga`` on alpha, with ``w = Q^{-1} [0; ga_S]`` (Q is symmetric,
so this reuses the forward's inverse — no second solve):

* ``dL/dd_S = w_S``
* ``dL/dK_SE = −2C w_S 1^T``
* ``dL/dK_SS = −2 w_S alpha_S^T``  (from ``dz = −Q^{-1} dQ z``, ``dQ_SS = 2 dK_SS``)

and these are pulled back to the keys through the kernel by autograd on the
``S ∪ E`` rows only.

Device: the certified solver is numpy float64 on the host, by design. The forward
copies the keys and the mask there explicitly (``k.detach().to("cpu", torch.float64)``)
and ``alpha`` and the partition back to ``k``'s device and dtype; the backward does
the same with the upstream gradient and ``grad_k``. On an accelerator every call
therefore synchronises with the device: it is the inference and certification path,
and training uses ``mode="batched"``, which stays on the device (docs/design.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from svattn.exact.core.conventions import warmup_threshold
from svattn.nn.common import Partition, log_kernel, log_kernel_diag

__all__ = ["ExactAlpha", "exact_alpha", "MarginState", "exact_margin_state", "uniform_state"]


@dataclass
class MarginState:
    """One solved problem: index arrays into the present keys, alpha, mu, Q^{-1}."""

    margin: np.ndarray  # (s,) in the order of Qinv rows 1..
    error: np.ndarray
    reserve: np.ndarray
    alpha: np.ndarray  # (n,)
    mu: float
    Qinv: np.ndarray  # (s+1, s+1), index 0 = mu; (0, 0) when the margin set is empty


def _via_memory(X: np.ndarray, C: float, kernel: str, gamma: float) -> MarginState:
    from svattn.exact.memory import SVDDMemory

    mem = SVDDMemory(C, kernel, gamma)
    ids = mem.extend(X)
    pos = {int(t): i for i, t in enumerate(ids)}
    ms = mem.margin_system()
    alpha = np.zeros(len(ids))
    for t, a in zip(mem.ids, np.asarray(ms.alpha), strict=True):
        alpha[pos[int(t)]] = a

    def where(tids):
        return np.array([pos[int(t)] for t in tids], dtype=np.int64)

    return MarginState(
        where(ms.margin),
        where(ms.error),
        where(ms.reserve),
        alpha,
        float(ms.mu),
        np.asarray(ms.Qinv, dtype=np.float64),
    )


def _via_oracle(X: np.ndarray, C: float, kernel: str, gamma: float) -> MarginState:
    from svattn.exact.core.kernels import kernel_matrix
    from svattn.exact.oracle import partition, solve_svdd

    K = kernel_matrix(X, X, kernel, gamma)
    alpha, mu = solve_svdd(K, C, return_mu=True)
    part = partition(alpha, C)
    S = np.array(part["margin"], dtype=np.int64)
    if S.size:
        Q = np.zeros((S.size + 1, S.size + 1))
        Q[0, 1:] = Q[1:, 0] = 1.0
        Q[1:, 1:] = 2.0 * K[np.ix_(S, S)]
        Qinv = np.linalg.inv(Q)
    else:
        Qinv = np.zeros((0, 0))
    return MarginState(
        S,
        np.array(part["error"], dtype=np.int64),
        np.array(part["reserve"], dtype=np.int64),
        np.asarray(alpha, dtype=np.float64),
        float(mu),
        Qinv,
    )


def exact_margin_state(X: np.ndarray, C: float, kernel: str, gamma: float) -> MarginState:
    """Solve one problem exactly in float64 (keys ``X`` (n, D)).

    Uses :class:`svattn.exact.memory.SVDDMemory` when it is importable, else the
    independent oracle :func:`svattn.exact.oracle.solve_svdd` with the bordered
    inverse formed on its partition.
    """
    try:
        return _via_memory(X, C, kernel, gamma)
    except ImportError:
        return _via_oracle(X, C, kernel, gamma)


def uniform_state(n: int) -> MarginState:
    """A short memory of ``n < ⌈1/C⌉`` keys (:mod:`svattn.nn.masks`): its box raised to
    ``1/n``, every key at it (error set), no margin set (so no gradient through alpha)."""
    none = np.zeros(0, dtype=np.int64)
    return MarginState(none, np.arange(n, dtype=np.int64), none, np.full(n, 1.0 / max(n, 1)),
                       0.0, np.zeros((0, 0)))


class ExactAlpha(torch.autograd.Function):
    """``alpha = ExactAlpha.apply(k, valid, C, kernel, gamma)``: k ``[B, H, Tk, D]`` →
    alpha ``[B, H, Tk]`` (k's dtype); masked keys get 0. See the module docstring."""

    @staticmethod
    def forward(ctx, k, valid, C, kernel, gamma, sink=None):  # noqa: D102
        B, H, n, _ = k.shape
        X = k.detach().to("cpu", torch.float64).numpy()
        vnp = valid.to("cpu").numpy()
        alpha = np.zeros((B, H, n))
        states = []
        short = warmup_threshold(C)
        for b in range(B):
            for h in range(H):
                pos = np.flatnonzero(vnp[b, h])
                if pos.size < short:  # box raised to 1/n (svattn.nn.masks): no solve
                    st = uniform_state(pos.size)
                else:
                    st = exact_margin_state(X[b, h, pos], C, kernel, gamma)
                alpha[b, h, pos] = st.alpha
                states.append((pos, st))
        ctx.states = states
        if sink is not None:
            sink.extend(states)
        ctx.C, ctx.kernel, ctx.gamma = C, kernel, gamma
        ctx.save_for_backward(k)
        return torch.from_numpy(alpha).to(device=k.device, dtype=k.dtype)

    @staticmethod
    def backward(ctx, grad_alpha):  # noqa: D102
        (k,) = ctx.saved_tensors
        B, H, n, D = k.shape
        C, kernel, gamma = ctx.C, ctx.kernel, ctx.gamma
        ga = grad_alpha.detach().to("cpu", torch.float64).numpy()
        grad_k = torch.zeros(B, H, n, D, dtype=torch.float64)
        kcpu = k.detach().to("cpu", torch.float64)
        for p, (pos, st) in enumerate(ctx.states):
            b, h = divmod(p, H)
            S, E = st.margin, st.error
            if S.size == 0:
                continue  # alpha = C on E, locally constant
            rhs = np.concatenate([[0.0], ga[b, h, pos[S]]])
            w_S = (st.Qinv @ rhs)[1:]  # reuse the forward's inverse
            a_S = st.alpha[S]
            SE = np.concatenate([S, E])
            # dL/dK on the rows of S and the columns S ∪ E
            G = np.empty((S.size, SE.size))
            G[:, : S.size] = -2.0 * np.outer(w_S, a_S)
            G[:, S.size :] = -2.0 * C * w_S[:, None]
            cols = torch.from_numpy(pos[SE])
            xs = kcpu[b, h, cols].clone().requires_grad_(True)  # (|S|+|E|, D)
            with torch.enable_grad():
                xS = xs[: S.size]
                K_rows = log_kernel(xS, xs, kernel, gamma).exp()  # (|S|, |S|+|E|)
                d_S = log_kernel_diag(xS, kernel, gamma).exp()
                surrogate = (torch.from_numpy(G) * K_rows).sum() + (
                    torch.from_numpy(w_S) * d_S
                ).sum()
                (gx,) = torch.autograd.grad(surrogate, xs)
            grad_k[b, h, cols] += gx
        return grad_k.to(device=k.device, dtype=k.dtype), None, None, None, None, None


def exact_alpha(
    k: torch.Tensor, valid: torch.Tensor, C: float, kernel: str, gamma: float
) -> tuple[torch.Tensor, Partition]:
    """Exact alpha ``[B, H, Tk]`` (differentiable w.r.t. ``k``) and its partition."""
    states: list = []
    alpha = ExactAlpha.apply(k, valid, C, kernel, gamma, states)
    B, H, n, _ = k.shape
    sets = torch.zeros(3, B * H, n, dtype=torch.bool)
    for p, (pos, st) in enumerate(states):
        for j, ids in enumerate((st.margin, st.error, st.reserve)):
            sets[j, p, torch.from_numpy(pos[ids])] = True
    sets = sets.reshape(3, B, H, n).to(k.device)
    return alpha, Partition(sets[0], sets[1], sets[2])
