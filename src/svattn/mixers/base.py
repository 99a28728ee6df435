"""The sequence-mixer contract (zoology style).

A mixer is an ``nn.Module`` with ``forward(x: [B, T, D]) -> [B, T, D]``,
causal (output ``t`` depends on inputs ``<= t`` only), and
``state_floats(seq_len) -> int``: the floats of context state one sequence of
length ``seq_len`` needs per layer at inference (a KV cache, or a fixed
recurrent state), so memory-versus-accuracy plots compare like with like.

Inside, heads use the one layout ``[B, H, T, Dh]``.
"""

from __future__ import annotations

import torch
from torch import nn


def check_heads(d_model: int, n_heads: int) -> int:
    """Head width ``d_model // n_heads``, or a precise ``ValueError``."""
    for name, val in (("d_model", d_model), ("n_heads", n_heads)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be an int >= 1, got {val!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    return d_model // n_heads


class SequenceMixer(nn.Module):
    """Base: input checks and head reshapes. Subclasses implement ``mix`` and ``state_floats``.

    Parameters
    ----------
    d_model
        Model width ``D``.
    n_heads
        Heads ``H``; ``D`` must be a multiple.
    """

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = check_heads(d_model, n_heads)
        self.d_model, self.n_heads = d_model, n_heads

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, H·Dh] -> [B, H, T, Dh]``."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dh)

    @staticmethod
    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, Dh] -> [B, T, H·Dh]``."""
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, D] -> [B, T, D]``, causal."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have layout [B, T, D] with D = {self.d_model}, got {shape}")
        return self.mix(x)

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def state_floats(self, seq_len: int) -> int:  # pragma: no cover - abstract
        """Floats of context state for one sequence of ``seq_len`` tokens, per layer."""
        raise NotImplementedError
