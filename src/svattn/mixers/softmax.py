"""Causal softmax attention mixers: full, and a sliding window (local attention)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from svattn.mixers.base import SequenceMixer
from svattn.mixers.rope import apply_rotary_qk
from svattn.mixers.state import KVCache, attend_cached


class SoftmaxAttention(SequenceMixer):
    """Full causal multi-head softmax attention (``scaled_dot_product_attention``).

    ``state_floats(T) = 2·T·D`` (the KV cache).

    Parameters
    ----------
    d_model, n_heads
        Width and heads.
    bias
        Bias in the projections.
    rope
        Rotate queries and keys by position (:mod:`svattn.mixers.rope`) before
        the softmax. Off by default: the full causal mask already orders tokens.

    Examples
    --------
    >>> import torch
    >>> mix = SoftmaxAttention(d_model=16, n_heads=2)
    >>> mix(torch.randn(2, 10, 16)).shape
    torch.Size([2, 10, 16])
    """

    def __init__(
        self, d_model: int, n_heads: int, *, bias: bool = False, rope: bool = False
    ) -> None:
        super().__init__(d_model, n_heads)
        if not isinstance(rope, bool):
            raise ValueError(f"rope must be a bool, got {rope!r}")
        if rope and self.head_dim % 2:
            raise ValueError(
                f"rope needs an even head width d_model / n_heads, got {d_model} / {n_heads} "
                f"= {self.head_dim}"
            )
        self.rope = rope
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).split(self.d_model, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, T, Dh)

    def positioned(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, k)`` rotated by position when ``rope`` is on, else unchanged."""
        if not self.rope:
            return q, k
        return apply_rotary_qk(q, k)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)
        q, k = self.positioned(q, k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        return self.out(self.merge_heads(o))

    def state_floats(self, seq_len: int) -> int:
        return 2 * seq_len * self.d_model

    streams = True

    def init_state(self) -> KVCache:
        """An empty KV cache (:class:`~svattn.mixers.state.KVCache`) in the weights' dtype."""
        self._refuse_stream()
        return KVCache("softmax", self.n_heads, self.head_dim, self.rope,
                       self.qkv.weight.dtype)

    def first_key(self, t):
        """The first position query ``t`` reads (causal: 0)."""
        return 0 * t

    def mix_extend(self, state: KVCache, x: torch.Tensor, reads) -> torch.Tensor:
        t0 = state.n
        qr, keys, vals = state.append(*self.qkv_heads(x[None]))  # (1, H, ·, Dh)
        o = attend_cached(qr, keys, vals, t0, self.first_key)
        return self.out(self.merge_heads(o))[0]  # (m, D)


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
) -> torch.Tensor:
    """Causal softmax attention over the last ``window`` tokens (self included).

    Blocked: queries in blocks of ``W = window`` see their own and the
    previous key block, masked to the band, so memory is ``O(T·W)``.
    ``q, k, v`` are ``[B, H, T, Dh]``; returns ``[B, H, T, Dh]``.
    """
    b, h, t, dh = q.shape
    w = window
    pad = (-t) % w
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    n = (t + pad) // w
    # (B, H, N, W, Dh): query blocks; keys/values: previous block ++ own block, (B, H, N, 2W, Dh)
    qb = q.reshape(b, h, n, w, dh)
    kb = k.reshape(b, h, n, w, dh)
    vb = v.reshape(b, h, n, w, dh)
    k2 = torch.cat([F.pad(kb, (0, 0, 0, 0, 1, 0))[:, :, :-1], kb], dim=3)
    v2 = torch.cat([F.pad(vb, (0, 0, 0, 0, 1, 0))[:, :, :-1], vb], dim=3)
    i = torch.arange(w, device=q.device)[:, None]
    j = torch.arange(2 * w, device=q.device)[None, :]
    band = (j > i) & (j <= i + w)  # key j of the 2W at distance 0..W-1 behind query i
    mask = band.expand(n, w, 2 * w).clone()  # (N, W, 2W)
    mask[0, :, :w] = False  # block 0 has no previous block
    o = F.scaled_dot_product_attention(qb, k2, v2, attn_mask=mask, scale=1.0 / math.sqrt(dh))
    return o.reshape(b, h, n * w, dh)[:, :, :t]  # (B, H, T, Dh)


class SlidingWindowAttention(SoftmaxAttention):
    """Causal softmax attention restricted to the last ``window`` tokens.

    ``state_floats(T) = 2·min(W, T)·D``.

    Parameters
    ----------
    d_model, n_heads, bias, rope
        As in :class:`SoftmaxAttention`. Without ``rope`` (or ``pos_emb`` in the
        model) a full window is an unordered set to the softmax.
    window
        Tokens each query sees, self included (``>= 1``).

    Examples
    --------
    >>> import torch
    >>> mix = SlidingWindowAttention(d_model=16, n_heads=2, window=4)
    >>> mix(torch.randn(1, 10, 16)).shape
    torch.Size([1, 10, 16])
    """

    def __init__(
        self, d_model: int, n_heads: int, *, window: int, bias: bool = False, rope: bool = False
    ) -> None:
        super().__init__(d_model, n_heads, bias=bias, rope=rope)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        self.window = window

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)
        q, k = self.positioned(q, k)
        return self.out(self.merge_heads(sliding_window_attention(q, k, v, self.window)))

    def state_floats(self, seq_len: int) -> int:
        return 2 * min(self.window, seq_len) * self.d_model

    streams = True

    def init_state(self) -> KVCache:
        """An empty KV cache. It keeps every position: a rewind may need any of them."""
        state = super().init_state()
        state.kind = "sliding"
        return state

    def first_key(self, t):
        """The first position query ``t`` reads: ``t − W + 1``."""
        return t - self.window + 1
