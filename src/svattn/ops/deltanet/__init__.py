"""DeltaNet (delta rule) operators: naive recurrence and chunked WY form."""

from svattn.ops.deltanet.chunk import chunk_delta_rule
from svattn.ops.deltanet.naive import naive_recurrent_delta_rule

__all__ = ["chunk_delta_rule", "naive_recurrent_delta_rule"]
