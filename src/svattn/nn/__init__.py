"""SV-Attention in PyTorch. One tensor layout throughout: ``[B, H, T, D]``.

* :func:`sv_attention` — memory over the keys + readout (``mode="batched"`` or ``"exact"``).
* :func:`sv_readout` — ``softmax(log alpha + log k(q, x)) · V`` on fused attention.
* :class:`SVAttention` — the multi-head layer on ``[B, T, d_model]``.
* :class:`SolverOptions` — the batched solver's options (FISTA iterations, the
  finish: the verified optimum or the paper's approximate path), one value every
  layer carries.

The chunked causal hybrid built on these, :class:`svattn.mixers.HybridSVAttention`,
is a sequence mixer and lives in :mod:`svattn.mixers`, which imports this package
(never the other way round).
"""

from svattn.nn.attention import sv_attention, sv_attention_state
from svattn.nn.common import Partition
from svattn.nn.layer import SVAttention
from svattn.nn.options import SolverOptions
from svattn.nn.projection import project_capped_simplex
from svattn.nn.readout import sv_readout, sv_readout_reference

__all__ = [
    "Partition",
    "SVAttention",
    "SolverOptions",
    "project_capped_simplex",
    "sv_attention",
    "sv_attention_state",
    "sv_readout",
    "sv_readout_reference",
]
