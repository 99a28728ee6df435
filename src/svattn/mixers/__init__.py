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

The hybrid SV mixer ``hybrid_sv``, :class:`~svattn.nn.hybrid.HybridSVAttention`
(DESIGN.md §5), lives
with the torch SV layer in :mod:`svattn.nn` and registers itself here when
imported (importing this package imports it): 2·T·D ("full" policy) or
2·min(T, budget + L)·D ("support").

Positions: ``softmax``, ``sliding`` and ``hybrid_sv`` take ``rope=True``
(rotary positions, :mod:`svattn.mixers.rope`; the hybrid rotates its local
path only). Without positions a sliding window cannot order the keys inside
its window.
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
}
# "hybrid_sv": svattn.nn.hybrid adds itself to MIXERS (it subclasses SoftmaxAttention,
# so a plain import here would be circular).
import svattn.nn.hybrid  # noqa: E402, F401

__all__ = [
    "MIXERS",
    "DeltaNetMixer",
    "LinearAttentionMixer",
    "SequenceMixer",
    "SlidingWindowAttention",
    "SoftmaxAttention",
    "sliding_window_attention",
]
