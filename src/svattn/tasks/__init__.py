"""Synthetic recall tasks for trained models (numpy and torch only).

Each task is one module with a frozen config dataclass whose ``build(seed)``
returns a :class:`~svattn.tasks.base.RecallData` (train and test inputs,
targets with :data:`~svattn.tasks.base.IGNORE` at unscored positions, and
the role of every position).

* :mod:`svattn.tasks.mqar` — multi-query associative recall (zoology).
* :mod:`svattn.tasks.selective_copy` — selective copying (Mamba), trained.

Examples
--------
>>> sorted(TASKS)
['mqar', 'selective-copy']
>>> TASKS["mqar"](seq_len=64, num_kv_pairs=4, num_train=8, num_test=4).build(0).seq_len
64
"""

from svattn.tasks.base import IGNORE, ROLES, RecallData
from svattn.tasks.mqar import MQARConfig
from svattn.tasks.selective_copy import SelectiveCopyConfig

TASKS: dict[str, type] = {"mqar": MQARConfig, "selective-copy": SelectiveCopyConfig}

__all__ = ["IGNORE", "ROLES", "TASKS", "MQARConfig", "RecallData", "SelectiveCopyConfig"]
