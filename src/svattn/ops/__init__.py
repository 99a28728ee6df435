"""Pure sequence operators for the fixed-state baselines (torch).

Layout
------
Every operator here takes and returns tensors in the one layout
``[B, H, T, D]`` (batch, heads, time, head dim); per-token scalars such as
the DeltaNet ``beta`` are ``[B, H, T]``. Recurrent states are ``[B, H, Dk, Dv]``.

Each mechanism has a package ``ops/<name>/`` with

* ``naive.py``: the token-by-token recurrence, the obviously-correct reference;
* ``chunk.py``: the chunked parallel form, checked against the reference on
  values and every gradient (``tests/ops``);
* ``README.md``: the derivation of the chunked form.
"""

from svattn.ops.deltanet import chunk_delta_rule, naive_recurrent_delta_rule
from svattn.ops.linear_attn import (
    chunk_linear_attn,
    elu_feature_map,
    naive_recurrent_linear_attn,
)

__all__ = [
    "chunk_delta_rule",
    "chunk_linear_attn",
    "elu_feature_map",
    "naive_recurrent_delta_rule",
    "naive_recurrent_linear_attn",
]
