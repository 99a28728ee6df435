"""Token-by-token delta rule: the reference for :mod:`svattn.ops.deltanet.chunk`."""

from __future__ import annotations

import torch

from svattn.ops._checks import check_qkv, check_state


def check_beta(beta: torch.Tensor, b: int, h: int, t: int) -> None:
    """Raise ``ValueError`` unless ``beta`` is ``[B, H, T]``."""
    if not isinstance(beta, torch.Tensor) or tuple(beta.shape) != (b, h, t):
        shape = tuple(beta.shape) if isinstance(beta, torch.Tensor) else type(beta).__name__
        raise ValueError(f"beta must have shape [B, H, T] = {(b, h, t)}, got {shape}")


def naive_recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Delta rule, one token at a time.

    With the state ``S`` stored as ``[Dk, Dv]`` (the transpose of the paper's
    ``[Dv, Dk]``)::

        S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T
        o_t = scale * S_t^T q_t

    which is ``S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T`` in the paper's
    orientation. DeltaNet L2-normalises ``q`` and ``k`` before calling this
    (the mixer and the memory do); ``beta`` in ``(0, 2)`` then keeps the
    state bounded.

    Parameters
    ----------
    q, k
        ``[B, H, T, Dk]``.
    v
        ``[B, H, T, Dv]``.
    beta
        ``[B, H, T]`` write strengths.
    scale
        Query scale; ``Dk ** -0.5`` when None.
    initial_state
        ``[B, H, Dk, Dv]`` or None (zeros).
    output_final_state
        Also return the final state ``[B, H, Dk, Dv]``.

    Returns
    -------
    o : torch.Tensor
        ``[B, H, T, Dv]``.
    final_state : torch.Tensor or None
        ``[B, H, Dk, Dv]`` when ``output_final_state``.
    """
    b, h, t, dk, dv = check_qkv(q, k, v)
    check_beta(beta, b, h, t)
    check_state("initial_state", initial_state, (b, h, dk, dv))
    if scale is None:
        scale = dk**-0.5
    s = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for i in range(t):
        k_i = k[:, :, i]  # (B, H, Dk)
        v_i = v[:, :, i]  # (B, H, Dv)
        v_old = torch.einsum("bhkv,bhk->bhv", s, k_i)
        u_i = beta[:, :, i, None] * (v_i - v_old)  # (B, H, Dv)
        s = s + k_i[..., :, None] * u_i[..., None, :]  # (B, H, Dk, Dv)
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, :, i] * scale))
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(b, h, 0, dv)  # (B, H, T, Dv)
    return o, (s if output_final_state else None)
