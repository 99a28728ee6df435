"""Streaming memories behind one contract (see :mod:`svattn.memory.base`).

``MEMORIES[name](dim=d, value_dim=dv, budget=b, **options)``:

==============  ===========================================  ===========
name            class                                        hard budget
==============  ===========================================  ===========
``sv``          :class:`~svattn.memory.sv.SVMemory`          no (C sets the support)
``h2o``         :class:`~svattn.memory.h2o.H2OMemory`        yes
``h2o_oracle``  :class:`~svattn.memory.h2o.H2OOracleMemory`  yes
``snapkv``      :class:`~svattn.memory.snapkv.SnapKVMemory`  yes
``sliding``     :class:`~svattn.memory.kv.SlidingWindowMemory`  yes
``full``        :class:`~svattn.memory.kv.FullMemory`        ignored
``deltanet``    :class:`~svattn.memory.recurrent.DeltaNetMemory`  ignored (fixed state)
``linear``      :class:`~svattn.memory.recurrent.LinearAttentionMemory`  ignored (fixed state)
==============  ===========================================  ===========
"""

from svattn.memory.base import StreamingMemory, causal_outputs
from svattn.memory.h2o import H2OMemory, H2OOracleMemory
from svattn.memory.kv import FullMemory, SlidingWindowMemory
from svattn.memory.recurrent import DeltaNetMemory, LinearAttentionMemory
from svattn.memory.snapkv import SnapKVMemory, snapkv_select
from svattn.memory.sv import SVMemory

MEMORIES: dict[str, type[StreamingMemory]] = {
    "sv": SVMemory,
    "h2o": H2OMemory,
    "h2o_oracle": H2OOracleMemory,
    "snapkv": SnapKVMemory,
    "sliding": SlidingWindowMemory,
    "full": FullMemory,
    "deltanet": DeltaNetMemory,
    "linear": LinearAttentionMemory,
}

__all__ = [
    "MEMORIES",
    "DeltaNetMemory",
    "FullMemory",
    "H2OMemory",
    "H2OOracleMemory",
    "LinearAttentionMemory",
    "SVMemory",
    "SlidingWindowMemory",
    "SnapKVMemory",
    "StreamingMemory",
    "causal_outputs",
    "snapkv_select",
]
