"""Input validation shared by the operators (layout ``[B, H, T, D]``)."""

from __future__ import annotations

import torch


def check_bhtd(name: str, x: torch.Tensor) -> tuple[int, int, int, int]:
    """Return the shape of ``x`` if it is a 4-D ``[B, H, T, D]`` tensor, else raise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(
            f"{name} must have layout [B, H, T, D] (4 dims), got shape {tuple(x.shape)}"
        )
    b, h, t, d = x.shape
    return b, h, t, d


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[int, int, int, int, int]:
    """Check ``q, k`` ``[B, H, T, Dk]`` and ``v`` ``[B, H, T, Dv]``; return ``B, H, T, Dk, Dv``."""
    bq, hq, tq, dq = check_bhtd("q", q)
    bk, hk, tk, dk = check_bhtd("k", k)
    bv, hv, tv, dv = check_bhtd("v", v)
    if (bq, hq, tq, dq) != (bk, hk, tk, dk):
        raise ValueError(
            f"q and k must have the same shape [B, H, T, Dk], got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    if (bv, hv, tv) != (bq, hq, tq):
        raise ValueError(
            f"v must be [B, H, T, Dv] with B, H, T of q {tuple(q.shape[:3])}, "
            f"got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return bq, hq, tq, dq, dv


def check_state(
    name: str, s: torch.Tensor | None, shape: tuple[int, ...]
) -> None:
    """Raise ``ValueError`` if an initial state ``s`` is given with a shape other than ``shape``."""
    if s is not None and tuple(s.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(s.shape)}")


def check_chunk_size(chunk_size: int) -> int:
    """Return ``chunk_size`` if it is a positive int, else raise ``ValueError``."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return chunk_size
