"""Linear attention operators: naive recurrence and chunked form."""

from svattn.ops.linear_attn.chunk import chunk_linear_attn
from svattn.ops.linear_attn.naive import elu_feature_map, naive_recurrent_linear_attn

__all__ = ["chunk_linear_attn", "elu_feature_map", "naive_recurrent_linear_attn"]
