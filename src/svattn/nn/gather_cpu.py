"""Token rows of per-head keys or values in pieces, without a ``cat`` in the backward.

The hybrid's ``"support"`` policy reads, for every problem ``p = b·H + h`` and slot, the
row ``t`` of ``z`` ``(B, H, T, D)``, for several runs of boundaries at once: one
``index_select`` on the flattened heads, split into the runs' pieces. The split's
backward concatenates the pieces' gradients (a copy of every gathered row) before the
``index_add``. :func:`token_rows` (CPU, eager) returns the pieces as separate outputs of
one autograd Function: each is gathered by its own ``index_select`` and its gradient
added by its own ``index_add_`` into one zero tensor, with no concatenation.
:func:`token_rows_reference` is the torch form (accelerators, ``torch.compile``, and the
tests' reference, ``tests/nn/test_nn_gather_cpu.py``).

(Gathering from the projection's strided view instead of one compact copy of ``z`` was
tried: its scattered rows made every gather slower than the copy saves.)
"""

from __future__ import annotations

import torch

from svattn.nn.common import host_reads

__all__ = ["token_rows", "token_rows_reference"]


def token_rows_reference(
    z: torch.Tensor, flat: torch.Tensor, sizes: list[int] | None = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Rows ``z.reshape(B·H·T, D)[flat]`` of ``z`` ``(B, H, T, D)``: ``(len(flat), D)``,
    or split into pieces of ``sizes`` rows."""
    B, H, T, D = z.shape
    out = z.reshape(B * H * T, D).index_select(0, flat)
    return out if sizes is None else out.split(sizes)


class _TokenRows(torch.autograd.Function):
    """The pieces of ``sizes`` rows as separate outputs (their backward: no ``cat``)."""

    @staticmethod
    def forward(ctx, z, flat, sizes):
        rows = z.reshape(-1, z.shape[-1])
        outs = tuple(rows.index_select(0, f) for f in flat.split(sizes))
        ctx.save_for_backward(flat)
        ctx.shape, ctx.sizes = z.shape, sizes
        return outs

    @staticmethod
    def backward(ctx, *grads):
        (flat,) = ctx.saved_tensors
        B, H, T, D = ctx.shape
        g = grads[0].new_zeros(B * H * T, D)
        for f, gr in zip(flat.split(ctx.sizes), grads, strict=True):
            if gr is not None and f.numel():
                g.index_add_(0, f, gr)
        return g.view(B, H, T, D), None, None


def token_rows(
    z: torch.Tensor, flat: torch.Tensor, sizes: list[int] | None = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Rows ``(len(flat), D)`` of ``z`` ``(B, H, T, D)``, row ``f = (b·H + h)·T + t`` being
    ``z[b, h, t]`` (:func:`token_rows_reference`), differentiable w.r.t. ``z``; with
    ``sizes``, the consecutive pieces of that many rows (a tuple).

    On CPU in eager mode, with ``sizes`` and a gradient, the pieces are separate outputs
    of one Function (module docstring); otherwise the torch form.
    """
    if (sizes is not None and host_reads(z) and z.requires_grad
            and torch.is_grad_enabled()):
        sizes = [int(s) for s in sizes]
        if sum(sizes) != flat.shape[0]:
            raise ValueError(f"sizes {sizes} do not sum to {flat.shape[0]} rows")
        return _TokenRows.apply(z, flat, sizes)
    return token_rows_reference(z, flat, sizes)
