"""What compaction costs exactness: compact-then-erase against never-compacted, on a stream.

A bounded memory calls :meth:`SVDDMemory.compact` as it streams: every reserve token
(alpha = 0) goes, and the readout is unchanged at that moment. Erasing a data subject
later is then exact relative to the tokens kept, not to the stream: a dropped token
might have re-entered the support had it been kept. This measures how often, and by
how much, on ICU vitals arriving hour by hour across stays (``forgetting`` report).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svattn.exact import SVDDMemory


@dataclass(frozen=True)
class CompactionTrial:
    """One stay erased from a compacted memory and from its never-compacted twin.

    Attributes
    ----------
    stay : int
        The erased stay's id.
    erased : int
        Its tokens live in the never-compacted memory (all of the stay's rows).
    reentered : int
        Tokens compaction had dropped that the never-compacted memory holds in its
        support after the erasure (they would have re-entered).
    alpha_dev : float
        Max |Δalpha| over the tokens both memories keep.
    decision_dev : float
        Max |f − f_never_compacted| over probes (the never-compacted memory's keys).
    """

    stay: int
    erased: int
    reentered: int
    alpha_dev: float
    decision_dev: float

    @property
    def differs(self) -> bool:
        return self.reentered > 0 or self.decision_dev > 1e-9


def stream_order(stay_id: np.ndarray, hour: np.ndarray) -> np.ndarray:
    """Row order of a live ICU stream: by hour, stays interleaved."""
    return np.lexsort((stay_id, hour))


def build(keys: np.ndarray, C: float, every: int) -> tuple[SVDDMemory, SVDDMemory, int]:
    """The never-compacted memory, the one compacted every ``every`` tokens, and how many
    tokens compaction dropped in all."""
    full, bounded = SVDDMemory(C=C), SVDDMemory(C=C)
    dropped = 0
    for start in range(0, len(keys), every):
        block = keys[start:start + every]
        full.extend(block)
        bounded.extend(block)
        dropped += len(bounded.compact())
    return full, bounded, dropped


def erase_trial(full: SVDDMemory, bounded: SVDDMemory, stay: int,
                row_ids: np.ndarray) -> CompactionTrial:
    """Erase the tokens ``row_ids`` (one stay's) from copies of both memories."""
    a, b = full.copy(), bounded.copy()
    a.remove_many([int(t) for t in row_ids])
    kept_b = set(b.ids)
    b.remove_many([int(t) for t in row_ids if int(t) in kept_b])
    alpha_a = dict(zip(a.ids, a.alpha, strict=True))
    alpha_b = dict(zip(b.ids, b.alpha, strict=True))
    common = [t for t in b.ids if t in alpha_a]
    alpha_dev = max((abs(alpha_a[t] - alpha_b[t]) for t in common), default=0.0)
    reentered = sum(1 for t in a.support_ids() if t not in alpha_b)
    probes = a.keys
    decision_dev = float(np.max(np.abs(a.decision_function(probes)
                                       - b.decision_function(probes))))
    return CompactionTrial(stay=int(stay), erased=len(row_ids), reentered=reentered,
                           alpha_dev=float(alpha_dev), decision_dev=decision_dev)
