"""Token rows of per-head keys or values, gathered where they lie (CPU, eager; numba).

The hybrid's ``"support"`` policy reads, for every problem ``p = b·H + h`` and slot, the
row ``z[b, h, t]`` of a ``(B, H, T, D)`` tensor that is a view of the projection's
``(B, T, 3·H·D)`` output (heads split, no copy). In torch that is a reshape to
``(B·H·T, D)`` (a copy of the whole tensor: the view's rows are not evenly strided) and
an ``index_select``, whose backward is a zero-filled ``(B·H·T, D)`` tensor and an
``index_add``. :func:`token_rows` reads the rows from the strided view directly (one
compiled loop) and its backward adds the rows' gradients into a zero tensor laid out as
the projection's heads, ``(B, T, H, D)`` memory (one compiled loop, serial, so
deterministic). :func:`token_rows_reference` is the torch form (accelerators,
``torch.compile``, and the tests' reference, ``tests/nn/test_nn_gather_cpu.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from svattn.nn.common import host_reads

__all__ = ["token_rows", "token_rows_reference"]


@njit(cache=True, nogil=True)
def _gather(z, sb, sh, st, H, T, flat, out):  # pragma: no cover - compiled
    # z: the tensor's memory as one contiguous run, (sb, sh, st) its strides (the last is 1)
    D = out.shape[1]
    for i in range(flat.shape[0]):
        f = flat[i]
        p = f // T
        t = f - p * T
        b = p // H
        o = b * sb + (p - b * H) * sh + t * st
        for j in range(D):
            out[i, j] = z[o + j]


@njit(cache=True, nogil=True)
def _scatter_add(g, sb, sh, st, H, T, flat, grad):  # pragma: no cover - compiled
    D = grad.shape[1]
    for i in range(flat.shape[0]):
        f = flat[i]
        p = f // T
        t = f - p * T
        b = p // H
        o = b * sb + (p - b * H) * sh + t * st
        for j in range(D):
            g[o + j] += grad[i, j]


def _run(z: torch.Tensor) -> tuple[np.ndarray, int, int, int]:
    """``z``'s memory as one contiguous 1-D array and its first three strides (CPU)."""
    span = 1 + sum((n - 1) * s for n, s in zip(z.shape, z.stride(), strict=True))
    run = z.detach().as_strided((span,), (1,), z.storage_offset()).numpy()
    sb, sh, st, _ = z.stride()
    return run, sb, sh, st


def token_rows_reference(
    z: torch.Tensor, flat: torch.Tensor, sizes: list[int] | None = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Rows ``z.reshape(B·H·T, D)[flat]`` of ``z`` ``(B, H, T, D)``: ``(len(flat), D)``,
    or split into pieces of ``sizes`` rows."""
    B, H, T, D = z.shape
    out = z.reshape(B * H * T, D).index_select(0, flat)
    return out if sizes is None else out.split(sizes)


def _pieces(z, flat, sizes):
    (run, sb, sh, st), (_, H, T, _) = _run(z), z.shape
    outs, i = [], 0
    for s in sizes:
        out = z.new_empty(s, z.shape[-1])
        _gather(run, sb, sh, st, H, T, flat[i : i + s].numpy(), out.numpy())
        outs.append(out)
        i += s
    return tuple(outs)


class _TokenRows(torch.autograd.Function):
    """The pieces of ``sizes`` rows as separate outputs (their backward: no ``cat``)."""

    @staticmethod
    def forward(ctx, z, flat, sizes):
        outs = _pieces(z, flat, sizes)
        ctx.save_for_backward(flat)
        ctx.shape, ctx.sizes = z.shape, sizes
        return outs

    @staticmethod
    def backward(ctx, *grads):
        (flat,) = ctx.saved_tensors
        B, H, T, D = ctx.shape
        g = grads[0].new_zeros(B, T, H, D).transpose(1, 2)  # the heads' layout of the projection
        (run, sb, sh, st), i = _run(g), 0
        for s, gr in zip(ctx.sizes, grads, strict=True):
            if gr is not None:
                _scatter_add(run, sb, sh, st, H, T, flat[i : i + s].numpy(),
                             gr.contiguous().numpy())
            i += s
        return g, None, None


def token_rows(
    z: torch.Tensor, flat: torch.Tensor, sizes: list[int] | None = None
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Rows ``(len(flat), D)`` of ``z`` ``(B, H, T, D)``, row ``f = (b·H + h)·T + t`` being
    ``z[b, h, t]`` (:func:`token_rows_reference`), differentiable w.r.t. ``z``; with
    ``sizes``, the consecutive pieces of that many rows (a tuple).

    On CPU in eager mode (``z``'s last stride 1) read from ``z``'s own strides (no
    copy of ``z``), the pieces as separate tensors (so the backward needs no ``cat`` of
    their gradients); ``flat`` long, every entry in ``[0, B·H·T)`` (not checked there).
    """
    if (host_reads(z) and flat.dtype == torch.long and z.stride(-1) == 1
            and z.dtype in (torch.float32, torch.float64)):
        flat = flat.contiguous()
        one = sizes is None
        sizes = [flat.shape[0]] if one else [int(s) for s in sizes]
        if sum(sizes) != flat.shape[0]:
            raise ValueError(f"sizes {sizes} do not sum to {flat.shape[0]} rows")
        if not (z.requires_grad and torch.is_grad_enabled()):
            outs = _pieces(z, flat, sizes)
        else:
            outs = _TokenRows.apply(z, flat, sizes)
        return outs[0] if one else outs
    return token_rows_reference(z, flat, sizes)
