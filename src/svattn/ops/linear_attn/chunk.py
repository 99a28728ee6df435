"""Chunked parallel linear attention.

Within a chunk of ``C`` tokens starting from state ``(S_0, z_0)``::

    O_num = Q S_0 + tril(Q K^T) V          (diagonal included)
    O_den = Q z_0 + tril(Q K^T) 1
    S_C = S_0 + K^T V,   z_C = z_0 + K^T 1

Cost ``O(T·C·D + T·D²)``, memory ``O(T·D + C²)`` per (batch, head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from svattn.ops._checks import check_chunk_size, check_qkv, check_state


def chunk_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    normalize: bool = True,
    eps: float = 1e-6,
    initial_state: torch.Tensor | None = None,
    initial_normalizer: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Causal linear attention in chunked form; same contract as the naive reference.

    Parameters
    ----------
    q, k, v, normalize, eps, initial_state, initial_normalizer, output_final_state
        As in :func:`svattn.ops.linear_attn.naive.naive_recurrent_linear_attn`.
    chunk_size
        Tokens per chunk; ``T`` need not be a multiple (zero padding).

    Returns
    -------
    o : torch.Tensor
        ``[B, H, T, Dv]``.
    final : tuple of torch.Tensor or None
        ``(S_T, z_T)`` when ``output_final_state``.

    Examples
    --------
    >>> import torch
    >>> from svattn.ops import chunk_linear_attn, elu_feature_map, naive_recurrent_linear_attn
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    >>> q, k = elu_feature_map(q), elu_feature_map(k)
    >>> o1, _ = chunk_linear_attn(q, k, v, chunk_size=4)
    >>> o2, _ = naive_recurrent_linear_attn(q, k, v)
    >>> bool(torch.allclose(o1, o2, atol=1e-12))
    True
    """
    b, h, t, dk, dv = check_qkv(q, k, v)
    check_state("initial_state", initial_state, (b, h, dk, dv))
    check_state("initial_normalizer", initial_normalizer, (b, h, dk))
    c = check_chunk_size(chunk_size)
    pad = (-t) % c
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    n = (t + pad) // c
    # (B, H, N, C, D): split time into N chunks of C tokens
    qc = q.reshape(b, h, n, c, dk)
    kc = k.reshape(b, h, n, c, dk)
    vc = v.reshape(b, h, n, c, dv)
    incl = torch.tril(torch.ones(c, c, dtype=torch.bool, device=q.device))
    qk = (qc @ kc.transpose(-1, -2)).masked_fill(~incl, 0.0)  # (B, H, N, C, C)
    intra_num = qk @ vc  # (B, H, N, C, Dv)
    intra_den = qk.sum(-1)  # (B, H, N, C)

    s = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    z = q.new_zeros(b, h, dk) if initial_normalizer is None else initial_normalizer.to(q.dtype)
    nums, dens = [], []
    for i in range(n):
        q_i, k_i = qc[:, :, i], kc[:, :, i]  # (B, H, C, Dk)
        nums.append(q_i @ s + intra_num[:, :, i])
        dens.append(q_i @ z[..., None] + intra_den[:, :, i, :, None])
        s = s + k_i.transpose(-1, -2) @ vc[:, :, i]  # (B, H, Dk, Dv)
        z = z + k_i.sum(-2)  # (B, H, Dk)
    o = torch.stack(nums, dim=2)  # (B, H, N, C, Dv)
    if normalize:
        o = o / (torch.stack(dens, dim=2) + eps)
    o = o.reshape(b, h, n * c, dv)[:, :, :t]  # (B, H, T, Dv)
    return o, ((s, z) if output_final_state else None)
