"""Builders shared by the memory tests."""

from __future__ import annotations

import numpy as np

from svattn.memory import MEMORIES, StreamingMemory

NAMES = sorted(MEMORIES)


def stream(seed: int, t: int, d: int, dv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded keys ``[t, d]``, values ``[t, dv]``, queries ``[t, d]``."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(t, d)), rng.normal(size=(t, dv)), rng.normal(size=(t, d))


def build(name: str, d: int = 8, dv: int = 5, budget: int = 12, **options) -> StreamingMemory:
    """``MEMORIES[name]`` with the options each needs (oracle queries for ``h2o_oracle``)."""
    if name == "h2o_oracle" and "oracle_queries" not in options:
        options["oracle_queries"] = np.random.default_rng(99).normal(size=(4, d))
    return MEMORIES[name](dim=d, value_dim=dv, budget=budget, **options)
