"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

Queries and keys are rotated pairwise by an angle proportional to their
position, so ``rope(q, m) · rope(k, n)`` depends on ``q``, ``k`` and ``m − n``
only. A softmax whose window has a fixed size (a sliding window, or the keys
inside one chunk) cannot tell positions apart without it: the causal mask
is what gives a position-free ("NoPE") full-causal model its sense of order,
and inside a full window every key looks the same to it.

Layout ``[B, H, T, Dh]`` with ``Dh`` even; the pairs are the two halves of
the head (GPT-NeoX convention): ``(x_i, x_{i + Dh/2})`` is rotated by
``pos · base^(−2i/Dh)``.
"""

from __future__ import annotations

import torch

__all__ = ["ROPE_BASE", "rotary_angles", "apply_rotary", "apply_rotary_qk"]

ROPE_BASE = 10_000.0


def rotary_angles(
    positions: torch.Tensor, head_dim: int, base: float = ROPE_BASE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[T, Dh/2]``, for integer ``positions`` ``[T]``.

    Computed in float64; :func:`apply_rotary` casts them to the input's dtype.

    Examples
    --------
    >>> import torch
    >>> cos, sin = rotary_angles(torch.arange(5), 8)
    >>> cos.shape, float(cos[0, 0]), float(sin[1, 0])  # angle 1 rad at pos 1, pair 0
    (torch.Size([5, 4]), 1.0, 0.8414709848078965)
    """
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head width, got head_dim = {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, offset: int = 0, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, Dh]`` for positions ``offset .. offset + T − 1``.

    Examples
    --------
    >>> import torch
    >>> q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    >>> a = apply_rotary(q, offset=3) @ apply_rotary(k, offset=1).mT
    >>> b = apply_rotary(q, offset=12) @ apply_rotary(k, offset=10).mT
    >>> torch.allclose(a, b, atol=1e-5)  # only the distance 2 matters
    True
    """
    if x.dim() != 4:
        raise ValueError(f"x must have layout [B, H, T, Dh], got shape {tuple(x.shape)}")
    return _rotate(x, *_angles_for(x, offset, base))


def apply_rotary_qk(
    q: torch.Tensor, k: torch.Tensor, base: float = ROPE_BASE
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(apply_rotary(q), apply_rotary(k))`` from one table of angles (positions from 0).

    Examples
    --------
    >>> import torch
    >>> q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    >>> rq, rk = apply_rotary_qk(q, k)
    >>> torch.equal(rq, apply_rotary(q)) and torch.equal(rk, apply_rotary(k))
    True
    """
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must have one layout [B, H, T, Dh], got shapes "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    cos, sin = _angles_for(q, 0, base)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _angles_for(x: torch.Tensor, offset: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, Dh/2]`` for the positions of ``x``, in its dtype."""
    T, dh = x.shape[2], x.shape[3]
    cos, sin = rotary_angles(torch.arange(offset, offset + T, device=x.device), dh, base)
    return cos.to(x.dtype), sin.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
