"""Token-by-token linear attention: the reference for :mod:`svattn.ops.linear_attn.chunk`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from svattn.ops._checks import check_qkv, check_state


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Positive feature map ``elu(x) + 1`` (Katharopoulos et al., 2020)."""
    return F.elu(x) + 1.0


def naive_recurrent_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
    initial_state: torch.Tensor | None = None,
    initial_normalizer: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Causal linear attention, one token at a time.

    ``q`` and ``k`` are already feature-mapped (positive, e.g. by
    :func:`elu_feature_map`)::

        S_t = S_{t-1} + k_t v_t^T        z_t = z_{t-1} + k_t
        o_t = S_t^T q_t / (z_t·q_t + eps)     (or S_t^T q_t if not normalize)

    Parameters
    ----------
    q, k
        ``[B, H, T, Dk]`` feature-mapped queries and keys.
    v
        ``[B, H, T, Dv]``.
    normalize
        Divide by the normaliser ``z_t·q_t + eps``.
    eps
        Added to the normaliser.
    initial_state, initial_normalizer
        ``[B, H, Dk, Dv]`` and ``[B, H, Dk]`` or None (zeros).
    output_final_state
        Also return ``(S_T, z_T)``.

    Returns
    -------
    o : torch.Tensor
        ``[B, H, T, Dv]``.
    final : tuple of torch.Tensor or None
        ``(S_T [B, H, Dk, Dv], z_T [B, H, Dk])`` when ``output_final_state``.
    """
    b, h, t, dk, dv = check_qkv(q, k, v)
    check_state("initial_state", initial_state, (b, h, dk, dv))
    check_state("initial_normalizer", initial_normalizer, (b, h, dk))
    s = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    z = q.new_zeros(b, h, dk) if initial_normalizer is None else initial_normalizer.to(q.dtype)
    outs = []
    for i in range(t):
        k_i, q_i = k[:, :, i], q[:, :, i]  # (B, H, Dk)
        s = s + k_i[..., :, None] * v[:, :, i, None, :]  # (B, H, Dk, Dv)
        z = z + k_i
        o_i = torch.einsum("bhkv,bhk->bhv", s, q_i)
        if normalize:
            o_i = o_i / ((z * q_i).sum(-1, keepdim=True) + eps)
        outs.append(o_i)
    o = torch.stack(outs, dim=2) if outs else v.new_zeros(b, h, 0, dv)  # (B, H, T, Dv)
    return o, ((s, z) if output_final_state else None)
