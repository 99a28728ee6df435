"""Fixed-state mixers: DeltaNet and linear attention, on the operators of :mod:`svattn.ops`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from svattn.mixers.base import SequenceMixer
from svattn.ops import (
    chunk_delta_rule,
    chunk_linear_attn,
    elu_feature_map,
    naive_recurrent_delta_rule,
    naive_recurrent_linear_attn,
)


class DeltaNetMixer(SequenceMixer):
    """DeltaNet: L2-normalised q, k; per-token ``beta = sigmoid(W_b x)`` per head.

    ``state_floats(T) = H·Dh·Dh`` (fixed).

    Parameters
    ----------
    d_model, n_heads
        Width and heads.
    chunk_size
        Chunk of the parallel form.
    naive
        Use the token-by-token reference instead (slow, for checks).

    Examples
    --------
    >>> import torch
    >>> mix = DeltaNetMixer(d_model=16, n_heads=2)
    >>> mix(torch.randn(2, 10, 16)).shape
    torch.Size([2, 10, 16])
    """

    def __init__(
        self, d_model: int, n_heads: int, *, chunk_size: int = 64, naive: bool = False
    ) -> None:
        super().__init__(d_model, n_heads)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.beta = nn.Linear(d_model, n_heads, bias=True)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.chunk_size, self.naive = chunk_size, naive

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(z) for z in self.qkv(x).split(self.d_model, dim=-1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)  # (B, H, T)
        if self.naive:
            o, _ = naive_recurrent_delta_rule(q, k, v, beta)
        else:
            o, _ = chunk_delta_rule(q, k, v, beta, chunk_size=self.chunk_size)
        return self.out(self.merge_heads(o))

    def state_floats(self, seq_len: int) -> int:
        return self.n_heads * self.head_dim * self.head_dim


class LinearAttentionMixer(SequenceMixer):
    """Linear attention with the ``elu + 1`` feature map and normaliser.

    ``state_floats(T) = H·Dh·Dh + H·Dh`` (state and normaliser, fixed).

    Parameters
    ----------
    d_model, n_heads, chunk_size, naive
        As in :class:`DeltaNetMixer`.

    Examples
    --------
    >>> import torch
    >>> mix = LinearAttentionMixer(d_model=16, n_heads=2)
    >>> mix(torch.randn(2, 10, 16)).shape
    torch.Size([2, 10, 16])
    """

    def __init__(
        self, d_model: int, n_heads: int, *, chunk_size: int = 64, naive: bool = False
    ) -> None:
        super().__init__(d_model, n_heads)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.chunk_size, self.naive = chunk_size, naive

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split_heads(z) for z in self.qkv(x).split(self.d_model, dim=-1))
        q, k = elu_feature_map(q), elu_feature_map(k)
        if self.naive:
            o, _ = naive_recurrent_linear_attn(q, k, v)
        else:
            o, _ = chunk_linear_attn(q, k, v, chunk_size=self.chunk_size)
        return self.out(self.merge_heads(o))

    def state_floats(self, seq_len: int) -> int:
        return self.n_heads * self.head_dim * (self.head_dim + 1)
