"""The differentiable margin solve as one ``autograd.Function`` with a closed-form backward.

With the partition fixed (margin set ``S``, error set ``E``, the rest ``R``), the
batched solver's alpha is ``alpha_E = C``, ``alpha_R = 0`` and, on ``S``, the solution
of the bordered system (docs/design.md §2, §5)

    M z = b,  M = [[2 K_SS + r·I, 1], [1ᵀ, 0]],  b = [d_S − 2C K_SE 1; 1 − C|E|],

``z = [alpha_S; mu]``, with ``t = ridge_steps`` iterated-ridge steps
``z_{k+1} = M⁻¹ (b + r·I_S z_k)`` (``z_0 = M⁻¹ b``). The system is solved once per
problem over all ``n`` keys with identity rows off ``S`` (dense form: a static size) or
gathered to the batch's largest ``|S|`` (compact form, eager: its size is read on the
host, :func:`svattn.nn.common.gather_rows`).

**Backward.** ``M`` is symmetric, so with ``μ_t = g`` the loss gradient on the last
iterate and ``λ_k = M⁻¹ μ_k``, ``μ_{k−1} = r·I_S λ_k`` (the adjoint of the iteration, the
same LU factors), ``∂L/∂b = Σ_k λ_k`` and ``∂L/∂M = −Σ_k λ_k z_kᵀ``. Both reach ``K``
through ``2 K_SS`` and ``−2C K_SE 1``, which together are the rank-``(t+1)`` matrix

    G = ∂L/∂K = −2 Σ_k λ̃_k a_kᵀ,   λ̃_k = λ_k on S (0 elsewhere),  a_k = [z_k on S; C on E; 0],

and ``∂L/∂d_S = Σ_k λ_k``. Through ``K_ij = exp(log k(x_i, x_j) − shift)`` (shift
constant), with ``W = G ⊙ K`` and ``W_s = W + Wᵀ``:

    ∂L/∂x_i = s (W_s X)_i − 2c (W_s 1)_i x_i + 2e d_i (Σ_k λ_k)_i x_i

for a kernel of the dot form ``log k(x, y) = s·x·y − c‖x‖² − c‖y‖²``
(:meth:`~svattn.exact.core.kernels.Kernel.dot_form`: ``∂ log k(x_i, x_j)/∂x_i = s x_j − 2c x_i``)
with ``log d_i = e‖x_i‖²``, ``e = s − 2c`` (:func:`key_gradient`):

* rbf, ``log k = −γ‖x_i − x_j‖²`` (``s = 2γ, c = γ, e = 0``):
  ``∂L/∂x_i = −2γ [(W_s 1)_i x_i − (W_s X)_i]`` (``d`` is constant);
* exp, ``log k = γ x_i·x_j`` (``s = γ, c = 0, e = γ``):
  ``∂L/∂x_i = γ (W_s X)_i + 2γ d_i (Σ_k λ_k)_i x_i``.

``W X = −2 Σ_k λ̃_k ⊙ K (a_k ⊙ X)`` and ``Wᵀ X = −2 Σ_k a_k ⊙ K (λ̃_k ⊙ X)``: the whole
backward is ``t + 1`` triangular solves and **one** batched matmul of ``K`` with
``2(t + 1)(D + 1)`` columns, where autograd through the solve and the kernel matrix
ran a dozen passes over ``(P, |S|, n)`` tensors and their gathers.
:func:`margin_solve_reference` (autograd through plain tensor ops) is the reference
the tests compare values and gradients against.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from svattn.exact.core.kernels import get_kernel
from svattn.nn.common import flat_rows, gather_rows, host_reads, log_kernel, log_kernel_diag
from svattn.nn.factor_cpu import BorderedCholesky, factor_bordered
from svattn.nn.system_cpu import build_compact_system, kernel_weights

__all__ = [
    "Factors",
    "margin_solve",
    "margin_solve_factored",
    "margin_solve_reference",
    "rows",
    "solve_system",
]


def rows(K: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``K[p, idx[p]]`` of each problem, (P, n, m) and (P, s) → (P, s, m).

    One contiguous row copy each (``index_select`` on the flattened matrices; its
    backward is one ``index_add``), several times faster than ``gather`` with an
    expanded index (and its ``scatter_add``) on CPU.
    """
    P, n, m = K.shape
    return K.reshape(P * n, m).index_select(0, flat_rows(idx, n)).view(P, idx.shape[-1], m)


class Factors(NamedTuple):
    """What the backward needs of one batch of solved margin systems (no grad)."""

    LU: torch.Tensor | None  # (P, s+1, s+1) LU factors of M (None: ``chol`` holds them)
    piv: torch.Tensor | None  # (P, s+1)
    idx: torch.Tensor | None  # (P, s) key of each slot (compact form), None (dense: slot = key)
    sval: torch.Tensor  # bool (P, s): slots in S
    pad: torch.Tensor | None  # (P, s+1, 1) the iterated ridge r·I_S, None without steps
    zs: tuple[torch.Tensor, ...]  # iterates z_0 .. z_t, each (P, s+1, 1)
    chol: BorderedCholesky | None = None  # CPU eager: per-block Cholesky (nn/factor_cpu.py)

    def solve(self, b: torch.Tensor) -> torch.Tensor:
        """``M⁻¹ b`` for ``b`` (P, s+1, 1); ``M`` is symmetric, so also ``M⁻ᵀ b``."""
        if self.chol is not None:
            return self.chol.solve(b)
        return torch.linalg.lu_solve(self.LU, self.piv, b)


def solve_system(K, d, S, E, C, ridge, ridge_steps, compact):
    """Factor and solve the margin systems of ``K`` (P, n, n) on (``S``, ``E``) (no grad).

    Returns ``alpha`` (P, n), ``mu`` (P,) and the :class:`Factors` the backward reuses.
    ``compact``: gather the system to the largest ``|S|`` (reads that size on the host;
    the dense form where that is every key).
    """
    P, n = S.shape
    dt = K.dtype
    Ef = E.to(dt)
    if compact and host_reads(K):
        # CPU, eager: the same system in one compiled pass (nn/system_cpu.py), symmetric
        # up to K's rounding, so LAPACK factors its transpose (its column-major layout:
        # no copy; the backward treats M as symmetric anyway)
        counts = S.sum(-1)
        s = min(max(int(counts.max()), 1), n)  # host read: the compact system's size
        chol = None
        if ridge > 0:  # SPD blocks: each factored at its own |S| (nn/factor_cpu.py)
            M, rhs, idx, sval = build_compact_system(K, d, S, E, C, ridge, s, ordered=True)
            chol = factor_bordered(M, counts)
        if chol is None:  # no ridge, or a block not positive definite: pivoted LU
            M, rhs, idx, sval = build_compact_system(K, d, S, E, C, ridge, s)
            idx = idx if s < n else None  # every key a slot: the dense form
        sf = sval.to(dt)
        return _factor_and_solve(M.mT, rhs.unsqueeze(-1), idx, sval, sf, Ef, C, ridge,
                                 ridge_steps, n, in_place=True, chol=chol)
    if compact:
        idx, sval = gather_rows(S)  # host read: the compact system's size
        compact = idx.shape[-1] < n  # S holds every key somewhere: the dense form, no gather
    if compact:
        Krow = rows(K, idx)  # (P, s, n)
        A = Krow.gather(-1, idx.unsqueeze(1).expand(-1, idx.shape[-1], -1))  # (P, s, s)
        kse = torch.bmm(Krow, Ef.unsqueeze(-1)).squeeze(-1)  # (P, s): K_SE 1
        d_S = d.gather(-1, idx)
    else:
        idx, sval, A = None, S, K
        kse = torch.bmm(Ef.unsqueeze(1), K).squeeze(1)  # (P, n), K symmetric
        d_S = d
    s = sval.shape[-1]
    sf = sval.to(dt)
    empty = 1.0 - sf.amax(-1)  # (P,) 1 where S is empty: the border row then pins mu = 0
    # M = [[2A ⊙ (s sᵀ) + diag(ridge·s + 1 − s), s], [sᵀ, empty]] (P, s+1, s+1), symmetric:
    # identity rows and columns off S, written into one buffer (three passes over A).
    M = K.new_empty(P, s + 1, s + 1)
    top = M[:, :s, :s]
    top.copy_(A).mul_((2.0 * sf).unsqueeze(-1)).mul_(sf.unsqueeze(-2))
    top.diagonal(dim1=-2, dim2=-1).add_(sf * (ridge - 1.0) + 1.0)
    M[:, :s, s] = sf
    M[:, s, :s] = sf
    M[:, s, s] = empty
    rhs_S = torch.where(sval, d_S - 2.0 * C * kse, 0.0)
    rhs_mu = (1.0 - C * Ef.sum(-1)) * (1.0 - empty)
    rhs = torch.cat([rhs_S, rhs_mu.unsqueeze(-1)], -1).unsqueeze(-1)  # (P, s+1, 1)
    return _factor_and_solve(M, rhs, idx, sval, sf, Ef, C, ridge, ridge_steps, n)


def _factor_and_solve(M, rhs, idx, sval, sf, Ef, C, ridge, ridge_steps, n, in_place=False,
                      chol=None):
    """Factor the systems ``M`` (P, s+1, s+1), solve for ``rhs`` (P, s+1, 1), with the
    iterated-ridge steps: ``alpha`` (P, n), ``mu`` (P,) and the :class:`Factors`.
    ``in_place``: ``M`` is a column-major buffer of the caller's, factored in place;
    ``chol``: the systems are factored already (``M`` unused)."""
    P, s = sval.shape
    if chol is not None:
        LU = piv = None
    elif in_place:
        piv = torch.empty(P, s + 1, dtype=torch.int32, device=M.device)
        info = torch.empty(P, dtype=torch.int32, device=M.device)
        LU, piv, _ = torch.linalg.lu_factor_ex(M, check_errors=False, out=(M, piv, info))
    else:
        LU, piv, _ = torch.linalg.lu_factor_ex(M, check_errors=False)
    f = Factors(LU, piv, idx, sval, None, (), chol)
    zs = [f.solve(rhs)]
    pad = None
    if ridge > 0 and ridge_steps > 0:
        # Iterated ridge (proximal point): (M0 + r·I_S) z' = b + r·I_S z converges to the
        # unridged M0 z = b, each step reusing the one well-conditioned factorization.
        pad = torch.cat([ridge * sf, sf.new_zeros(P, 1)], -1).unsqueeze(-1)
        for _ in range(ridge_steps):
            zs.append(f.solve(torch.addcmul(rhs, pad, zs[-1])))
    z = zs[-1].squeeze(-1)
    alpha = _to_keys(z[:, :s] * sf, idx, n) + C * Ef
    return alpha, z[:, s], f._replace(pad=pad, zs=tuple(zs))


def _to_keys(x: torch.Tensor, idx: torch.Tensor | None, n: int) -> torch.Tensor:
    """Slot values (P, s) of the margin system back on the keys (P, n) (0 off the slots)."""
    if idx is None:
        return x
    return x.new_zeros(x.shape[0], n).scatter(-1, idx, x)


def _grad_keys(X, K, d, E, f: Factors, g_alpha, g_mu, C, kernel, gamma):
    """∂L/∂X (P, n, D) of one batch of margin systems (module docstring)."""
    P, n, D = X.shape
    dt = K.dtype
    compact = f.idx is not None
    s = f.sval.shape[-1]
    sf = f.sval.to(dt)
    Ef = E.to(dt)
    g_slots = g_alpha.gather(-1, f.idx) if compact else g_alpha
    adj = torch.cat([g_slots * sf, g_mu.unsqueeze(-1)], -1).unsqueeze(-1)  # (P, s+1, 1)
    lams, avs = [], []
    for k in range(len(f.zs) - 1, -1, -1):
        lam = f.solve(adj)  # M symmetric: M⁻ᵀ = M⁻¹
        lams.append(_to_keys(lam.squeeze(-1)[:, :s] * sf, f.idx, n))  # λ̃_k (P, n)
        avs.append(_to_keys(f.zs[k].squeeze(-1)[:, :s] * sf, f.idx, n) + C * Ef)  # a_k
        if k:
            adj = f.pad * lam
    lam_w, a_w = torch.stack(lams, -1), torch.stack(avs, -1)  # (P, n, t+1)
    if host_reads(K):  # CPU, eager: W_s itself on the kept block (nn/system_cpu.py)
        return _grad_from_weights(X, d, lam_w, *kernel_weights(K, X, lam_w, a_w), kernel,
                                  gamma)
    nz = lam_w.shape[-1]
    if compact:
        # W_s is zero outside the kept set S ∪ E (λ̃ lives on S, a on S ∪ E): the kernel
        # block of the kept keys suffices, gathered to the batch's largest.
        kept = (a_w != 0).any(-1) | (lam_w != 0).any(-1)
        kidx, kval = gather_rows(kept)  # host read
        compact = kidx.shape[-1] < n  # every key kept somewhere: K as it is
    if compact:
        Kk = rows(K, kidx).gather(-1, kidx.unsqueeze(1).expand(-1, kidx.shape[-1], -1))
        take = kidx.unsqueeze(-1)
        Xk = rows(X, kidx)
        lam_w = lam_w.gather(1, take.expand(-1, -1, nz))
        a_w = a_w.gather(1, take.expand(-1, -1, nz))
        dk = d.gather(-1, kidx)
    else:
        Kk, Xk, dk = K, X, d
    m = Kk.shape[-1]
    # One bmm: K @ [a_k ⊙ X1, λ̃_k ⊙ X1]_k with X1 = [X, 1]; then
    # H = Σ_k λ̃_k ⊙ K(a_k ⊙ X1) + a_k ⊙ K(λ̃_k ⊙ X1) = −(W_s X1)/2.
    X1 = torch.cat([Xk, Xk.new_ones(P, m, 1)], -1)  # (P, m, D + 1)
    wts = torch.cat([a_w, lam_w], -1)  # (P, m, 2(t+1))
    Y = torch.bmm(Kk, (wts.unsqueeze(-1) * X1.unsqueeze(2)).view(P, m, -1))
    Y = Y.view(P, m, 2, nz, D + 1)
    H = (Y[:, :, 0] * lam_w.unsqueeze(-1) + Y[:, :, 1] * a_w.unsqueeze(-1)).sum(2)
    WsX, Ws1 = -2.0 * H[..., :D], -2.0 * H[..., D:]
    g_x = key_gradient(WsX, Ws1, Xk, dk, lam_w, kernel, gamma)
    if compact:
        g_x = X.new_zeros(P * n, D).index_copy_(  # padded slots hold distinct keys
            0, flat_rows(kidx, n), (g_x * kval.unsqueeze(-1).to(dt)).reshape(-1, D)).view(P, n, D)
    return g_x


def key_gradient(WsX, Ws1, X, d, lam_w, kernel, gamma):
    """``∂L/∂X = s·W_s X − 2c·(W_s 1) ⊙ X + 2e·(d ⊙ Σ_k λ̃_k) ⊙ X`` (module docstring)
    from ``W_s X`` (P, m, D), ``W_s 1`` (P, m, 1), the keys ``X`` (P, m, D), the diagonal
    ``d`` and the adjoints ``lam_w`` (P, m, t+1), for the kernel's dot form ``(s, c)``,
    ``e = s − 2c``. A translation-invariant kernel (``s = 2c``: rbf) takes
    ``−s·[(W_s 1) ⊙ X − W_s X]``; every product is the one the formula names, in its
    order, so rbf and exp give their derivations' values bit for bit."""
    kern = get_kernel(kernel)
    s, c = kern.dot_form(gamma)
    if c and s == 2.0 * c:  # log k = −c‖x − y‖²: e = 0
        return -s * (Ws1 * X - WsX)
    g_x = s * WsX
    if c:
        g_x = g_x - (2.0 * c) * Ws1 * X
    e = kern.diag_scale(gamma)
    if e:
        g_x = g_x + (2.0 * e) * (d * lam_w.sum(-1)).unsqueeze(-1) * X
    return g_x


def _grad_from_weights(X, d, lam_w, W, X1, idx, kernel, gamma):
    """∂L/∂X (P, n, D) from ``W_s`` and ``X1`` on the kept slots (:func:`kernel_weights`):
    :func:`key_gradient` with fused updates (``addcmul``; rbf and exp bit for bit as
    there)."""
    P, n, D = X.shape
    Y = torch.bmm(W, X1)  # (P, m, D + 1): [W_s X, W_s 1]
    Xk = X1[..., :D]
    kern = get_kernel(kernel)
    s, c = kern.dot_form(gamma)
    if c and s == 2.0 * c:  # log k = −c‖x − y‖²: e = 0
        g_x = torch.addcmul(Y[..., :D], Y[..., D:], Xk, value=-1.0).mul_(s)
    else:
        g_x = s * Y[..., :D]
        if c:
            g_x = torch.addcmul(g_x, Y[..., D:], Xk, value=-2.0 * c)
        e = kern.diag_scale(gamma)
        if e:
            dl = d * lam_w.sum(-1) if idx is None else (d * lam_w.sum(-1)).gather(-1, idx)
            g_x = torch.addcmul(g_x, dl.unsqueeze(-1), Xk, value=2.0 * e)
    if idx is None:
        return g_x
    # padded slots hold distinct unkept keys, whose rows of W_s (hence of g_x) are zero
    return X.new_zeros(P * n, D).index_copy_(0, flat_rows(idx, n), g_x.reshape(-1, D)).view(
        P, n, D)


class _MarginSolve(torch.autograd.Function):
    """alpha, mu of solved margin systems (passed in), with the closed-form backward.

    ``kf`` (P·M, n, D) holds ``M`` batches of ``P`` problems in (P, M) order; ``parts``
    the ``M`` batches' ``(K, d, E, Factors)``. Every tensor of ``parts`` is saved with
    ``save_for_backward``; ``ctx.layout`` is their static structure.
    """

    @staticmethod
    def forward(ctx, kf, alpha, mu, C, kernel, gamma, parts):
        flat, layout = [], []
        for K, d, E, f in parts:
            ts = [K, d, E, *((f.LU, f.piv) if f.chol is None else f.chol), f.sval, *f.zs]
            ts += [f.idx] if f.idx is not None else []
            ts += [f.pad] if f.pad is not None else []
            flat += ts
            layout.append((len(f.zs), f.idx is not None, f.pad is not None,
                           f.chol is not None))
        ctx.save_for_backward(kf, *flat)
        ctx.layout, ctx.meta = tuple(layout), (C, kernel, gamma)
        return alpha.clone(), mu.clone()

    @staticmethod
    def backward(ctx, g_alpha, g_mu):
        C, kernel, gamma = ctx.meta
        kf, *flat = ctx.saved_tensors
        M = len(ctx.layout)
        PM, n, D = kf.shape
        P = PM // M
        X = kf.detach().view(P, M, n, D)
        ga, gm = g_alpha.view(P, M, n), g_mu.view(P, M)
        out, i = [], 0
        for m, (nz, has_idx, has_pad, has_chol) in enumerate(ctx.layout):
            K, d, E = flat[i : i + 3]
            i += 3
            nf = 3 if has_chol else 2
            chol = BorderedCholesky(*flat[i : i + nf]) if has_chol else None
            LU, piv = (None, None) if has_chol else flat[i : i + 2]
            sval = flat[i + nf]
            zs = tuple(flat[i + nf + 1 : i + nf + 1 + nz])
            i += nf + 1 + nz
            idx = flat[i] if has_idx else None
            i += has_idx
            pad = flat[i] if has_pad else None
            i += has_pad
            f = Factors(LU, piv, idx, sval, pad, zs, chol)
            out.append(_grad_keys(X[:, m], K, d, E, f, ga[:, m], gm[:, m], C, kernel, gamma))
        g_x = out[0] if M == 1 else torch.stack(out, 1)
        return g_x.reshape(PM, n, D), None, None, None, None, None, None


def margin_solve_factored(
    kf: torch.Tensor,
    alpha: torch.Tensor,
    mu: torch.Tensor,
    C: float,
    kernel: str,
    gamma: float,
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, Factors]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The margin systems' ``alpha`` (P·M, n) and ``mu`` (P·M,), already solved, made
    differentiable w.r.t. the keys ``kf`` (P·M, n, D).

    ``parts``: for each of the ``M`` batches of ``P`` problems (``kf``, ``alpha``, ``mu``
    in (P, M) order), its kernel matrices ``K`` (P, n, n), diagonals ``d`` (P, n) (no grad,
    shift constant), error set ``E`` and the :class:`Factors` of :func:`solve_system`
    (``alpha``, ``mu`` are what it returned). Nothing is solved again: the backward
    reuses the factorizations (module docstring).

    Where the systems are in another dtype than the keys (float64 after the
    ``"optimum"`` finish, :mod:`svattn.nn.finish`), the solve and its backward run in
    theirs and ``alpha``, ``mu`` come back in the keys' dtype.
    """
    work = parts[0][0].dtype
    if kf.dtype != work:
        a, m = _MarginSolve.apply(kf.to(work), alpha.to(work), mu.to(work), float(C), kernel,
                                  float(gamma), parts)
        return a.to(kf.dtype), m.to(kf.dtype)
    return _MarginSolve.apply(kf, alpha, mu, float(C), kernel, float(gamma), parts)


def margin_solve(
    kf: torch.Tensor,
    K: torch.Tensor,
    d: torch.Tensor,
    S: torch.Tensor,
    E: torch.Tensor,
    C: float,
    kernel: str,
    gamma: float,
    ridge: float,
    ridge_steps: int,
    compact: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """alpha (P, n) and mu (P,) of the margin systems, differentiable w.r.t. the keys ``kf``.

    ``kf`` (P, n, D) keys; ``K`` (P, n, n) and ``d`` (P, n) their rescaled kernel matrices
    and diagonals (no grad, zero on absent keys, from
    :func:`svattn.nn.batched.kernel_problem` with the shift treated as a constant);
    ``S``, ``E`` bool (P, n). ``compact``: gather the system to the largest ``|S|`` (reads
    that size on the host). :func:`solve_system`, then :func:`margin_solve_factored`.
    """
    with torch.no_grad():
        alpha, mu, f = solve_system(K, d, S, E, C, ridge, ridge_steps, compact)
    return margin_solve_factored(kf, alpha, mu, C, kernel, gamma, [(K, d, E, f)])


def margin_solve_reference(kf, valid, shift, S, E, C, kernel, gamma, ridge, ridge_steps):
    """:func:`margin_solve` by autograd through plain ops (dense system; tests only)."""
    P, n, _ = kf.shape
    vv = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    K = torch.where(vv, (log_kernel(kf, kf, kernel, gamma) - shift[:, None, None]).exp(), 0.0)
    d = torch.where(valid, (log_kernel_diag(kf, kernel, gamma) - shift[:, None]).exp(), 0.0)
    Sf, Ef = S.to(kf.dtype), E.to(kf.dtype)
    eye = torch.eye(n, dtype=kf.dtype, device=kf.device)
    A = torch.where(S.unsqueeze(-1) & S.unsqueeze(-2), 2.0 * K + ridge * eye, eye)
    empty = 1.0 - Sf.amax(-1)
    M = torch.cat([torch.cat([A, Sf.unsqueeze(-1)], -1),
                   torch.cat([Sf, empty.unsqueeze(-1)], -1)[:, None]], -2)
    rhs = torch.cat([Sf * (d - 2.0 * C * (K @ Ef.unsqueeze(-1)).squeeze(-1)),
                     ((1.0 - C * Ef.sum(-1)) * (1.0 - empty)).unsqueeze(-1)], -1).unsqueeze(-1)
    z = torch.linalg.solve(M, rhs)
    if ridge > 0:
        pad = torch.cat([ridge * Sf, torch.zeros_like(Sf[:, :1])], -1).unsqueeze(-1)
        for _ in range(ridge_steps):
            z = torch.linalg.solve(M, rhs + pad * z)
    z = z.squeeze(-1)
    return Sf * z[:, :n] + C * Ef, z[:, n]
