"""Chunked parallel delta rule (WY / UT-transform form).

See ``README.md`` in this folder for the derivation. Within a chunk of
length ``C`` everything is matrix products plus one unit-lower-triangular
solve; across chunks a recurrence on the ``[Dk, Dv]`` state remains. Cost
``O(T·C·D + T·D²)``, memory ``O(T·D + C²)`` per (batch, head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from svattn.ops._checks import check_chunk_size, check_qkv, check_state
from svattn.ops.deltanet.naive import check_beta


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Delta rule in chunked parallel form; same contract as the naive reference.

    Parameters
    ----------
    q, k, v, beta, scale, initial_state, output_final_state
        As in :func:`svattn.ops.deltanet.naive.naive_recurrent_delta_rule`.
    chunk_size
        Tokens per chunk ``C``; ``T`` need not be a multiple (zero padding with
        ``beta = 0`` leaves the state unchanged).

    Returns
    -------
    o : torch.Tensor
        ``[B, H, T, Dv]``.
    final_state : torch.Tensor or None
        ``[B, H, Dk, Dv]`` when ``output_final_state``.

    Examples
    --------
    >>> import torch
    >>> from svattn.ops import chunk_delta_rule, naive_recurrent_delta_rule
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64) for _ in "qkv")
    >>> k = torch.nn.functional.normalize(k, dim=-1)
    >>> beta = torch.rand(1, 2, 10, generator=g, dtype=torch.float64)
    >>> o1, _ = chunk_delta_rule(q, k, v, beta, chunk_size=4)
    >>> o2, _ = naive_recurrent_delta_rule(q, k, v, beta)
    >>> bool(torch.allclose(o1, o2, atol=1e-12))
    True
    """
    b, h, t, dk, dv = check_qkv(q, k, v)
    check_beta(beta, b, h, t)
    check_state("initial_state", initial_state, (b, h, dk, dv))
    c = check_chunk_size(chunk_size)
    if scale is None:
        scale = dk**-0.5
    pad = (-t) % c
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
    n = (t + pad) // c
    # (B, H, N, C, D): split time into N chunks of C tokens
    qc = q.reshape(b, h, n, c, dk) * scale
    kc = k.reshape(b, h, n, c, dk)
    vc = v.reshape(b, h, n, c, dv)
    bc = beta.reshape(b, h, n, c, 1)

    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    strict = torch.tril(torch.ones(c, c, dtype=torch.bool, device=q.device), -1)
    incl = torch.tril(torch.ones(c, c, dtype=torch.bool, device=q.device))
    # (I + A) with A_ij = beta_i k_i·k_j for j < i, per chunk: (B, H, N, C, C)
    a = (bc * kc) @ kc.transpose(-1, -2)
    lower = eye + a.masked_fill(~strict, 0.0)
    # W = T K, U = T V with T = (I + A)^{-1} diag(beta)
    w = torch.linalg.solve_triangular(lower, bc * kc, upper=False, unitriangular=True)
    u = torch.linalg.solve_triangular(lower, bc * vc, upper=False, unitriangular=True)
    # intra-chunk causal scores, diagonal included: (B, H, N, C, C)
    qk = (qc @ kc.transpose(-1, -2)).masked_fill(~incl, 0.0)

    s = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for i in range(n):
        u_i = u[:, :, i] - w[:, :, i] @ s  # (B, H, C, Dv): corrected pseudo-values
        outs.append(qc[:, :, i] @ s + qk[:, :, i] @ u_i)
        s = s + kc[:, :, i].transpose(-1, -2) @ u_i  # (B, H, Dk, Dv)
    o = torch.stack(outs, dim=2).reshape(b, h, n * c, dv)[:, :, :t]  # (B, H, T, Dv)
    return o, (s if output_final_state else None)
