"""Sequence mixers behind one contract (see :mod:`svattn.mixers.base`).

``MIXERS[name](d_model=D, n_heads=H, **options)``; ``forward(x [B, T, D]) -> [B, T, D]``,
causal; ``state_size(seq_len)`` in floats.

=============  ===============================================  ===================
name           class                                            state_size(T)
=============  ===============================================  ===================
``softmax``    :class:`~svattn.mixers.softmax.SoftmaxAttention`   2·T·D
``sliding``    :class:`~svattn.mixers.softmax.SlidingWindowAttention`  2·min(W, T)·D
``deltanet``   :class:`~svattn.mixers.recurrent.DeltaNetMixer`   H·Dh²
``linear``     :class:`~svattn.mixers.recurrent.LinearAttentionMixer`  H·Dh² + H·Dh
=============  ===============================================  ===================

The hybrid SV mixer (DESIGN.md §5) registers here as ``"sv"`` when it lands
(it lives with the torch SV layer, :mod:`svattn.nn`); it must follow the
same contract.
"""

from torch import nn

from svattn.mixers.base import SequenceMixer
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
    # "sv": the hybrid SV mixer, added by svattn.nn (a later issue)
}

__all__ = [
    "MIXERS",
    "DeltaNetMixer",
    "LinearAttentionMixer",
    "SequenceMixer",
    "SlidingWindowAttention",
    "SoftmaxAttention",
    "sliding_window_attention",
]
