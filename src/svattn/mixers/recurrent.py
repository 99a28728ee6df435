"""Fixed-state mixers: DeltaNet and linear attention, on the operators of :mod:`svattn.ops`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from svattn.mixers.base import SequenceMixer
from svattn.mixers.state import MixerState
from svattn.ops import (
    chunk_delta_rule,
    chunk_linear_attn,
    elu_feature_map,
    naive_recurrent_delta_rule,
    naive_recurrent_linear_attn,
)


class RecurrentState(MixerState):
    """The fixed state of a recurrent mixer for one sequence: ``S`` ``[H, Dk, Dv]`` (and
    the linear mixer's normaliser ``z`` ``[H, Dk]``) after ``n`` positions.

    It holds no position separately, so it can be cut back only to the start
    (:meth:`rewind_point`); a stream replays the positions after that.
    """

    def __init__(self, kind: str, n_heads: int, head_dim: int, dtype: torch.dtype,
                 normalizer: bool) -> None:
        super().__init__(n_heads)
        self.kind = kind
        self.S = torch.zeros(n_heads, head_dim, head_dim, dtype=dtype)
        self.z = torch.zeros(n_heads, head_dim, dtype=dtype) if normalizer else None
        self.count = 0

    @property
    def n(self) -> int:
        return self.count

    def arrays(self) -> dict[str, torch.Tensor]:
        return {"S": self.S} if self.z is None else {"S": self.S, "z": self.z}

    def load_arrays(self, arrays: dict[str, torch.Tensor], n: int) -> None:
        for name, want in self.arrays().items():
            got = arrays[name]
            if got.shape != want.shape:
                raise ValueError(f"{name} has shape {tuple(got.shape)}, the mixer's is "
                                 f"{tuple(want.shape)}")
            setattr(self, name, got.to(want.dtype).clone())
        self.count = n

    def rewind_point(self, a: int) -> int:
        """The furthest position ``<= a`` this state can be cut back to: ``a`` when
        nothing is cut, else 0."""
        return a if a == self.count else 0

    def rewind(self, a: int, *, resume: bool = False, layer: int = 0) -> list[dict]:
        self.check_usable()
        if a != self.rewind_point(a):
            raise ValueError(f"a recurrent state cuts back to position 0 or keeps its "
                             f"{self.count} positions, not {a} (rewind_point)")
        if a == 0:
            self.S.zero_()
            if self.z is not None:
                self.z.zero_()
            self.count = 0
        return []


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

    streams = True

    def init_state(self) -> RecurrentState:
        """A zero state ``S`` (:class:`RecurrentState`) in the weights' dtype."""
        return RecurrentState("deltanet", self.n_heads, self.head_dim,
                              self.qkv.weight.dtype, normalizer=False)

    def mix_extend(self, state: RecurrentState, x: torch.Tensor, reads) -> torch.Tensor:
        """The recurrent form (:func:`~svattn.ops.naive_recurrent_delta_rule`) from ``S``."""
        x = x[None]  # (1, m, D)
        q, k, v = (self.split_heads(z) for z in self.qkv(x).split(self.d_model, dim=-1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(self.beta(x)).transpose(1, 2)  # (1, H, m)
        o, s = naive_recurrent_delta_rule(q, k, v, beta, initial_state=state.S[None],
                                          output_final_state=True)
        state.S.copy_(s[0])  # in place: no earlier state stays in a released tensor
        state.count += x.shape[1]
        return self.out(self.merge_heads(o))[0]  # (m, D)


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

    streams = True

    def init_state(self) -> RecurrentState:
        """Zero ``S`` and ``z`` (:class:`RecurrentState`) in the weights' dtype."""
        return RecurrentState("linear", self.n_heads, self.head_dim,
                              self.qkv.weight.dtype, normalizer=True)

    def mix_extend(self, state: RecurrentState, x: torch.Tensor, reads) -> torch.Tensor:
        """The recurrent form (:func:`~svattn.ops.naive_recurrent_linear_attn`) from
        ``S`` and ``z``."""
        q, k, v = (self.split_heads(z) for z in self.qkv(x[None]).split(self.d_model, dim=-1))
        q, k = elu_feature_map(q), elu_feature_map(k)
        o, (s, z) = naive_recurrent_linear_attn(
            q, k, v, initial_state=state.S[None], initial_normalizer=state.z[None],
            output_final_state=True)
        state.S.copy_(s[0])  # in place: no earlier state stays in a released tensor
        state.z.copy_(z[0])
        state.count += x.shape[0]
        return self.out(self.merge_heads(o))[0]  # (m, D)
