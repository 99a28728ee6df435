"""The sequence-mixer contract (zoology style).

A mixer is an ``nn.Module`` with ``forward(x: [B, T, D]) -> [B, T, D]``,
causal (output ``t`` depends on inputs ``<= t`` only), and
``state_floats(seq_len) -> int``: the floats of context state one sequence of
length ``seq_len`` needs per layer at inference (a KV cache, or a fixed
recurrent state), so memory-versus-accuracy plots compare like with like.

Inside, heads use the one layout ``[B, H, T, Dh]``.

**Incremental inference** (a mixer that declares ``streams = True``): ``init_state()``
returns the inference state of one sequence (:mod:`svattn.mixers.state`: a KV cache,
exact memories, a recurrent matrix), and ``extend(state, x [m, D]) -> [m, D]`` reads
the next ``m`` positions of that sequence into it and returns their outputs: rows
``n .. n + m − 1`` of ``forward`` on the whole sequence, however the sequence is split
across calls (``step(state, x [D])`` is ``extend`` of one row). Blocks rather than
single rows because a stream feeds text in pieces: one block runs each projection and
softmax once for all its rows, as the batched forward does.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from svattn.mixers.state import MixerState


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

    # ------------------------------------------------------------ incremental inference
    streams: ClassVar[bool] = False
    """Declared by a mixer whose ``init_state`` / ``mix_extend`` compute its ``mix``."""

    @classmethod
    def can_stream(cls) -> bool:
        """Whether this class streams: it declares ``streams = True`` in the class that
        defines ``mix`` or in a subclass of it (a subclass that changes ``mix`` without
        declaring it again does not inherit its parent's incremental form)."""

        def owner(name: str) -> type:
            return next(c for c in cls.__mro__ if name in vars(c))

        return bool(cls.streams) and issubclass(owner("streams"), owner("mix"))

    def _refuse_stream(self) -> None:
        if not self.can_stream():
            raise ValueError(f"mixer {type(self).__name__} is not streamed: it implements no "
                             "incremental inference (init_state / extend)")

    def stream_settings(self, *, full_policy: bool = False) -> dict:
        """Attributes a streaming copy of this mixer takes (``setattr``) so that its
        ``forward`` computes what ``extend`` does; ``{}`` for most mixers.

        Raises
        ------
        ValueError
            The mixer does not stream (or not with these settings).
        """
        self._refuse_stream()
        return {}

    def init_state(self) -> MixerState:
        """A fresh inference state for one sequence (no position read yet)."""
        self._refuse_stream()
        raise NotImplementedError  # pragma: no cover - a streaming mixer overrides this

    def extend(self, state: MixerState, x: torch.Tensor, *, reads=None) -> torch.Tensor:
        """Read the next ``m`` positions ``x`` ``[m, D]`` of the sequence into ``state``;
        return their outputs ``[m, D]`` (rows ``state.n ..`` of the full forward), computed
        without gradient (inference).

        ``reads``: an object whose methods replace how a mixer reads its state (the
        hybrid's ``key_log_weights`` and ``memory_readout``); None for the mixer's own.

        Bad input is refused before the state changes. A failure after that (inside an
        exact memory, a ``reads`` hook, an interrupt) leaves the state part-changed: it
        is marked (``state.broken``) and refuses every later extend and rewind.
        """
        self._refuse_stream()
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[-1] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have layout [m, D] with D = {self.d_model}, got {shape}")
        weight = next(self.parameters(), None)
        if weight is not None and x.dtype != weight.dtype:
            raise ValueError(f"x must have dtype {weight.dtype} (the mixer's weights), got "
                             f"{x.dtype}")
        if not isinstance(state, MixerState):
            raise ValueError(f"state must be a MixerState from init_state, got "
                             f"{type(state).__name__}")
        state.check_usable()
        try:
            with torch.no_grad():  # inference: the exact memories carry no gradient
                return self.mix_extend(state, x, reads)
        except BaseException as exc:
            state.broken = f"an extend failed midway ({type(exc).__name__}: {exc})"
            raise

    def step(self, state: MixerState, x: torch.Tensor, *, reads=None) -> torch.Tensor:
        """One position: ``x`` ``[D]`` → ``[D]`` (:meth:`extend` of one row)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.shape[0] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have layout [D] with D = {self.d_model}, got {shape}")
        return self.extend(state, x[None], reads=reads)[0]

    def mix_extend(self, state: MixerState, x: torch.Tensor, reads) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - abstract
