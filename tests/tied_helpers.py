"""Shared by the tests of the uniqueness test beside tied tokens and of what removals leave
in freed memory: the distinct rows of the ICU slice, and a near-copy of a margin token
added to sit tied beside it."""

from __future__ import annotations

import numpy as np

from svattn.data.icu import default_slice_path, load_mimic3_vitals
from svattn.exact import SVDDMemory


def distinct_icu_rows(n: int) -> np.ndarray:
    """The first ``n`` distinct rows of the MIMIC-III demo vitals slice shipped with
    svattn, as its loader gives them (z-scored), in file order."""
    keys = np.ascontiguousarray(load_mimic3_vitals(default_slice_path()).standardised().keys)
    _, first = np.unique(keys, axis=0, return_index=True)
    return keys[np.sort(first)][:n]


def add_tied_near_copy(mem: SVDDMemory, offset: float = 1e-9
                       ) -> tuple[np.ndarray, int, int]:
    """Add a near-copy (``offset``) of the first margin token's key: the row added, its
    id, and another margin token to forget (the near-copy then sits tied)."""
    ss = mem.solver_state
    m0 = int(ss.margin_slots()[0])
    row = ss.X[m0] + offset
    tw = mem.add(row)
    twin = ss.id_to_slot[tw]
    victim = next(int(ss.slot_id[s]) for s in ss.margin_slots() if s not in (twin, m0))
    return row, tw, victim
