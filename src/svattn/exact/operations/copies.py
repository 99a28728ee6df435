"""Copies of a key share one coefficient budget (``docs/design.md``, "Copies").

Keys the kernel cannot tell apart (``K_ii + K_jj − 2 K_ij <= 1e-13 (K_ii + K_jj)``; rbf:
``K_ij >= 1 − 1e-13``) have the same column of ``K`` and the same ``g``, so the SVDD dual
fixes only the sum of their coefficients: every split of a group's weight within the
bounds is an optimum. The memory keeps at most one member of a group free (the margin
set then stays positive definite) and the others at a bound: the batch paths spread a
group's weight in id order, the first members at ``C``, one remainder, the rest 0
(:func:`spread`; :func:`svattn.exact.operations.batch.spread_copies`,
:func:`svattn.exact.operations.solver.resolve_by_gram`).

Removing one of several copies then needs no solve when the others have room for its
weight (:func:`give_to_copies`): the group's sum, hence every ``g``, ``mu`` and the
decision function, is unchanged, and the weight is spread again over the members left.
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.protocol import Backend
from svattn.exact.core.cache import expand, free_col
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.core.kktsets import DRIVEN, ERROR, MARGIN, RESERVE
from svattn.exact.core.state import SlotState, scrub

# a pair is a copy when its kernel distance is at most this share of K_ii + K_jj
COPY_SHARE = 1e-13


def spread(weight: float, m: int, C: float) -> np.ndarray:
    """A group's ``weight`` over ``m`` members in order: ``C`` each while at least ``C``
    is left, then the remainder, then 0 (one free member at most).

    Examples
    --------
    >>> spread(2.5, 4, 1.0).tolist()
    [1.0, 1.0, 0.5, 0.0]
    """
    out = np.zeros(m)
    for i in range(m):
        if weight <= COPY_SHARE * C:
            break
        out[i] = C if weight >= C * (1 - COPY_SHARE) else weight
        weight -= out[i]
    return out


def kernel_copies(ss: SlotState, slot: int) -> np.ndarray:
    """The live slots other than ``slot`` whose keys the kernel cannot tell from
    ``slot``'s, in id order: one pass over ``slot``'s cache column (or its kernel row)."""
    live = ss.live_slots()
    col = int(ss.col_of_slot[slot])
    if col >= 0:
        kv = ss.KC[live, col]
    else:
        keys = ss.X[live]  # (a copy of keys: scrubbed)
        try:
            kv = kernel_matrix(ss.X[slot][None, :], keys, ss.kernel, ss.gamma_value)[0]
        finally:
            scrub(keys)
    dd = ss.diag[live] + ss.diag[slot]
    sib = live[(dd - 2.0 * kv <= COPY_SHARE * dd) & (live != slot)]
    return sib[np.argsort(ss.slot_id[sib], kind="stable")]


def give_to_copies(ss: SlotState, be: Backend, slot: int) -> int | None:
    """Hand support token ``slot``'s weight to its copies, when they have room for it:
    the group's weight is spread again over the members left (:func:`spread`, id
    order), so nothing else moves, and ``slot`` is left out of every set (DRIVEN, for
    the caller to wipe). Returns the tokens that changed set (with ``slot``'s exit),
    or None, changing nothing, where ``slot`` has no copy with room (the caller then
    removes it along the solution path). The caller's finish re-solves the margin
    system on the new partition and checks the KKT conditions on an exact ``g``."""
    a = float(ss.alpha[slot])
    if a <= 0.0:
        return None
    sib = kernel_copies(ss, slot)
    if not len(sib) or float(np.sum(ss.C - ss.alpha[sib])) < a * (1 - COPY_SHARE):
        return None
    new = spread(a + float(ss.alpha[sib].sum()), len(sib), ss.C)
    group = np.concatenate([[slot], sib])
    # every member on the margin leaves it first (descending columns: a contraction
    # moves only the last margin column), so the new free member joins a margin set
    # that holds none of its copies
    on_margin = group[(ss.state[group] == MARGIN) & (ss.col_of_slot[group] < ss.nS)]
    for s in sorted(on_margin.tolist(), key=lambda t: -int(ss.col_of_slot[t])):
        be.contract(ss, int(ss.col_of_slot[s]))
        ss.state[s] = ERROR if ss.alpha[s] > 0.5 * ss.C else RESERVE
    ss.state[slot] = DRIVEN  # (the caller wipes it)
    changed = 1
    for s, w in zip(sib.tolist(), new.tolist(), strict=True):
        st = ERROR if w >= ss.C else (RESERVE if w <= 0.0 else MARGIN)
        changed += int(ss.state[s] != st)
        ss.alpha[s] = w
        ss.state[s] = st
        if st == RESERVE:
            free_col(ss, s)
            continue
        if ss.col_of_slot[s] < 0:
            be.alloc_col(ss, s)
        if st == MARGIN:
            ss.g[s] = 0.0
            expand(ss, s)
    ss.sync_ac()
    ss.standby_stale = True
    return changed


__all__ = ["COPY_SHARE", "give_to_copies", "kernel_copies", "spread"]
