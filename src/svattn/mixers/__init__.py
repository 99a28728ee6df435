"""Sequence mixers behind one contract (see :mod:`svattn.mixers.base`).

``MIXERS[name](d_model=D, n_heads=H, **options)``; ``forward(x [B, T, D]) -> [B, T, D]``,
causal; ``state_floats(seq_len)``: floats of context state per layer.

=============  ===============================================  ===================
name           class                                            state_floats(T)
=============  ===============================================  ===================
``softmax``    :class:`~svattn.mixers.softmax.SoftmaxAttention`   2·T·D
``sliding``    :class:`~svattn.mixers.softmax.SlidingWindowAttention`  2·min(W, T)·D
``deltanet``   :class:`~svattn.mixers.recurrent.DeltaNetMixer`   H·Dh²
``linear``     :class:`~svattn.mixers.recurrent.LinearAttentionMixer`  H·Dh² + H·Dh
``hybrid_sv``  :class:`~svattn.mixers.hybrid.HybridSVAttention`  2·T·D ("full"),
                                                                2·min(T, budget + L)·D
                                                                ("support")
=============  ===============================================  ===================

The hybrid SV mixer (docs/design.md §5) builds its memory with
:func:`svattn.nn.attention.sv_attention_state`; :mod:`svattn.nn` does not
import this package, so the import runs one way only (mixers → nn).

Incremental inference: every mixer here streams (``init_state()``, then
``extend(state, x [m, D])`` or ``step(state, x [D])``: the rows of its forward, one
sequence at a time; :mod:`svattn.mixers.base`, states in :mod:`svattn.mixers.state`).
:class:`svattn.lm.stream.LMStream` runs them through ``CharLM.extend``.

Positions: ``softmax``, ``sliding`` and ``hybrid_sv`` take ``rope=True``
(rotary positions, :mod:`svattn.mixers.rope`; the hybrid rotates its local
path only). Without positions a sliding window cannot order the keys inside
its window.
"""

from torch import nn

from svattn.mixers.base import SequenceMixer
from svattn.mixers.hybrid import HybridSVAttention
from svattn.mixers.recurrent import DeltaNetMixer, LinearAttentionMixer
from svattn.mixers.softmax import (
    SlidingWindowAttention,
    SoftmaxAttention,
    sliding_window_attention,
)

MIXERS: dict[str, type[nn.Module]] = {
    "softmax": SoftmaxAttention,
    "sliding": SlidingWindowAttention,
    "deltanet": DeltaNetMixer,
    "linear": LinearAttentionMixer,
    "hybrid_sv": HybridSVAttention,
}

__all__ = [
    "MIXERS",
    "DeltaNetMixer",
    "HybridSVAttention",
    "LinearAttentionMixer",
    "SequenceMixer",
    "SlidingWindowAttention",
    "SoftmaxAttention",
    "sliding_window_attention",
]
