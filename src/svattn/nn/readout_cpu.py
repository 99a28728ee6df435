"""The SV readout for training on CPU: one autograd Function with explicit products.

``o = softmax_j(s·q·x_j + b_j) · V`` with the kernel's dot form ``(s, c)``
(:meth:`~svattn.exact.core.kernels.Kernel.dot_form`) and the per-key bias
``b = log alpha − c‖x‖²`` (rbf: ``s = 2·gamma, c = gamma``; exp: ``s = gamma, c = 0``), as
:func:`svattn.nn.readout.readout_fused` computes it with
``scaled_dot_product_attention``. With a bias that needs a gradient, CPU attention runs
its math path: the mask broadcast to ``(B, H, Tq, Tk)`` and added, a "safe" softmax
that checks every row for ``−inf`` (three times a plain softmax), ``q`` and ``k``
scaled by ``sqrt(s)`` and autograd through ``log alpha`` and ``‖x‖²``.
:class:`_ExplicitReadout` runs the same arithmetic as five batched products and one
softmax, and writes the backward out:

* where every memory's support is at most ``COMPACT`` of the keys, the keys, values
  and alphas of the supports (padded to the largest) are gathered first and the
  gradients scattered back (zero elsewhere: a key with ``alpha = 0`` has weight 0);
* ``S = s·Q Xᵀ + b`` (one ``baddbmm``), ``P = softmax(S)``, ``O = P V``;
* ``dV = Pᵀ dO``, ``dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙ O))``, ``dQ = s·dS X``,
  ``dX = s·dSᵀ Q − 2c·(Σ_i dS_ij)·x_j``, ``db_j = Σ_i dS_ij`` and
  ``d alpha = db / alpha`` where ``alpha > 0`` (0 elsewhere, as ``log_alpha``).

:func:`svattn.nn.readout.sv_readout_reference` is the reference the tests compare values
and gradients against (``tests/nn/test_nn_readout.py``).
"""

from __future__ import annotations

import torch

from svattn.exact.core.kernels import get_kernel
from svattn.nn.common import flat_rows, gather_rows, host_reads

__all__ = ["COMPACT", "explicit_readout", "readout_bias"]

#: Read only the support where the largest support is at most this share of the keys.
COMPACT = 0.75


def readout_bias(log_a: torch.Tensor, k: torch.Tensor, kernel: str, gamma: float
                 ) -> tuple[torch.Tensor, float]:
    """The readout's per-key bias and query scale from ``log alpha`` ``(B, H, Tk)`` and
    the kernel's dot form ``(s, c)``: ``(log alpha − c‖x‖², s)`` (the query's own
    ``−c‖q‖²`` is constant along each softmax row and cancels): rbf
    ``(log alpha − gamma‖x‖², 2·gamma)``, exp ``(log alpha, gamma)``."""
    s, c = get_kernel(kernel).dot_form(gamma)
    if c:
        return log_a - c * (k * k).sum(-1), s
    return log_a, s


class _ExplicitReadout(torch.autograd.Function):
    """Readout ``(B, H, Tq, Dv)`` of ``q`` ``(B, H, Tq, D)``, ``k`` ``(B, H, Tk, D)``,
    ``v`` ``(B, H, Tk, Dv)``, ``alpha`` ``(B, H, Tk)``; module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, kernel, gamma):
        B, H, Tq, D = q.shape
        Tk, Dv = k.shape[2], v.shape[-1]
        qf, kf, vf = q.reshape(B * H, Tq, D), k.reshape(B * H, Tk, D), v.reshape(B * H, Tk, Dv)
        af = alpha.reshape(B * H, Tk)
        flat = _support_rows(af)
        if flat is not None:  # the memories' support only: the products at its width
            m = flat.numel() // (B * H)
            kf = kf.reshape(-1, D).index_select(0, flat).view(B * H, m, D)
            vf = vf.reshape(-1, Dv).index_select(0, flat).view(B * H, m, Dv)
            af = af.reshape(-1).index_select(0, flat).view(B * H, m)
        pos = af > 0
        bias, scale = readout_bias(
            torch.where(pos, af, 1.0).log_().masked_fill_(~pos, -torch.inf), kf, kernel, gamma)
        S = torch.baddbmm(bias.unsqueeze(1), qf, kf.mT, alpha=scale)  # (BH, Tq, m)
        P = torch.softmax(S, -1)
        out = torch.bmm(P, vf)  # (BH, Tq, Dv)
        ctx.save_for_backward(qf, kf, vf, af, P, out, flat)
        ctx.meta = (kernel, gamma, scale, (B, H, Tk))
        return out.view(B, H, Tq, Dv)

    @staticmethod
    def backward(ctx, g_out):
        qf, kf, vf, alpha, P, out, flat = ctx.saved_tensors
        kernel, gamma, scale, (B, H, Tk) = ctx.meta
        go = g_out.reshape(out.shape)
        dv = torch.bmm(P.mT, go)  # (BH, Tk, Dv)
        dS = torch.bmm(go, vf.mT)  # dP (BH, Tq, Tk)
        dS.sub_((go * out).sum(-1, keepdim=True)).mul_(P)  # P ⊙ (dP − rowsum(dO ⊙ O))
        db = dS.sum(-2)  # (BH, Tk): the bias gradient
        dq = torch.bmm(dS, kf).mul_(scale)
        dk = torch.bmm(dS.mT, qf).mul_(scale)
        c = get_kernel(kernel).dot_form(gamma)[1]
        if c:  # b_j = log alpha_j − c‖x_j‖²
            dk.addcmul_(db.unsqueeze(-1), kf, value=-2.0 * c)
        da = torch.where(alpha > 0, db / alpha, 0.0)
        Tq, D = qf.shape[1:]
        if flat is not None:  # back on every key (zero off the support)
            dk = dk.new_zeros(B * H * Tk, D).index_copy_(0, flat, dk.reshape(-1, D))
            dv = dv.new_zeros(B * H * Tk, dv.shape[-1]).index_copy_(0, flat,
                                                                     dv.reshape(flat.numel(), -1))
            da = da.new_zeros(B * H * Tk).index_copy_(0, flat, da.reshape(-1))
        return (dq.view(B, H, Tq, D), dk.view(B, H, Tk, D), dv.view(B, H, Tk, -1),
                da.view(B, H, Tk), None, None)


def _support_rows(alpha: torch.Tensor) -> torch.Tensor | None:
    """Flat row indices (BH·m,) of each memory's support (``alpha > 0``; the largest
    count ``m``, padded with distinct zero-alpha keys), or None where ``m`` is more
    than ``COMPACT`` of the keys (the gathers would cost more than they save)."""
    if not host_reads(alpha):  # the accelerator's schedule (no_host_reads): all keys
        return None
    pos = alpha > 0
    if int(pos.sum(-1).max()) > COMPACT * alpha.shape[-1]:  # host read (CPU, eager)
        return None
    return flat_rows(gather_rows(pos)[0], alpha.shape[-1])


def explicit_readout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: torch.Tensor,
    kernel: str,
    gamma: float,
) -> torch.Tensor:
    """``softmax(log alpha + log k(q, x)) · V`` with the explicit backward (module docstring).

    Parameters
    ----------
    q, k, v : Tensor ``[B, H, Tq, D]``, ``[B, H, Tk, D]``, ``[B, H, Tk, Dv]``
        Queries, keys and values of the memory (one floating dtype).
    alpha : Tensor ``[B, H, Tk]``
        Memory coefficients (``>= 0``; zero entries get no weight and no gradient).
    kernel : str
        Kernel of the readout (a registered name, :func:`~svattn.exact.core.kernels.get_kernel`;
        one of the dot form).
    gamma : float
        Its bandwidth.

    Returns
    -------
    Tensor ``[B, H, Tq, Dv]``
    """
    return _ExplicitReadout.apply(q, k, v, alpha, kernel, float(gamma))
