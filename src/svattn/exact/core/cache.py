"""Numpy primitives on the kernel cache and the bordered inverse, shared by both backends.

These steps are rare or cheap (a margin expansion, a column move, a move of
``mu`` alone), so one numpy version serves the reference and the compiled
backend alike; the backends differ in the hot loops (see ``docs/design.md`` §6).
Each function takes the :class:`~svattn.exact.core.state.SlotState` and edits it in place.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.core.state import NeedResolve, SlotState


def outside_description(ss: SlotState, diag: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Which scored rows lie outside the description (g below zero beyond a rounding-level
    tie, relative to the terms g is made of, as the KKT residual measures it: a tie
    scaled by the largest diagonal in the memory let an exp-kernel outlier at 1e18 hide
    rows at g = -1)."""
    return g < -1e-13 * np.maximum(2.0 * diag + g - ss.mu + abs(ss.mu), 1.0)


def free_col(s: SlotState, slot: int) -> None:
    """Drop ``slot``'s cache column (zeroed); a margin token's only after contraction."""
    col = int(s.col_of_slot[slot])
    if col < 0:
        return
    assert col >= s.nS, "a margin token's column is freed only after contraction"
    s.KC[:, col] = 0.0
    s.XC[col] = 0.0
    s.slot_of_col[col] = -1
    s.col_of_slot[slot] = -1
    s.ac[col] = 0.0
    while s.chi > 0 and s.slot_of_col[s.chi - 1] < 0:
        s.chi -= 1


def swap_cols(s: SlotState, p: int, q: int) -> None:
    """Exchange two cache columns (contents and bookkeeping)."""
    if p == q:
        return
    hi = s.hi
    s.KC[:hi, [p, q]] = s.KC[:hi, [q, p]]
    s.XC[[p, q]] = s.XC[[q, p]]
    s.ac[[p, q]] = s.ac[[q, p]]
    soc = s.slot_of_col
    soc[[p, q]] = soc[[q, p]]
    for col in (p, q):
        if soc[col] >= 0:
            s.col_of_slot[soc[col]] = col


def expand(s: SlotState, k: int) -> None:
    """Add token ``k`` (which has a cache column) to the margin set (a border expansion)."""
    nS = s.nS
    col_k = int(s.col_of_slot[k])
    if nS == 0:
        s.Qinv = np.array([[-2.0 * s.diag[k], 1.0], [1.0, 0.0]])
    else:
        u = np.empty(nS + 1)
        u[0] = 1.0
        u[1:] = 2.0 * s.KC[s.slot_of_col[:nS], col_k]
        w = s.Qinv @ u
        schur = 2.0 * s.diag[k] - float(u @ w)
        if schur <= 1e-10 * s.scale:
            # a (near) copy of margin keys: Q would be singular. Neither jitter
            # (another problem) nor skipping (a corrupt inverse): re-solve.
            raise NeedResolve
        Qn = np.empty((nS + 2, nS + 2))
        Qn[: nS + 1, : nS + 1] = s.Qinv + np.outer(w, w) / schur
        Qn[: nS + 1, nS + 1] = -w / schur
        Qn[nS + 1, : nS + 1] = -w / schur
        Qn[nS + 1, nS + 1] = 1.0 / schur
        s.Qinv = Qn
    swap_cols(s, col_k, nS)
    s.nS = nS + 1


def refactorize(s: SlotState, *, count: bool = True) -> None:
    """Rebuild ``Qinv`` from the cached margin block (``count``: an event worth counting)."""
    nS = s.nS
    if nS == 0:
        s.Qinv = np.zeros((0, 0))
        return
    S = s.slot_of_col[:nS]
    Q = np.zeros((nS + 1, nS + 1))
    Q[0, 1:] = 1.0
    Q[1:, 0] = 1.0
    KSS = s.KC[S, :nS]
    Q[1:, 1:] = KSS + KSS.T
    s.Qinv = np.linalg.inv(Q)
    s.n_refactorizations += int(count)


def mu_move(s: SlotState, c: int, direction: int,
            alloc_col: Callable[[SlotState, int], int]) -> tuple[bool, int]:
    """Empty margin set: only mu moves. Return (drive done, token that joined).

    ``alloc_col`` is the backend's column allocation (a joining reserve token
    may need its column).
    """
    hi = s.hi
    st = s.state[:hi]
    g = s.g[:hi]
    if direction > 0:
        errs = np.flatnonzero(st == ERROR)
        t_c = max(-g[c], 0.0)
        t_e, who = math.inf, -1
        if len(errs):
            k = int(np.argmax(g[errs]))
            who, t_e = int(errs[k]), max(-float(g[errs[k]]), 0.0)
        if t_c <= t_e:
            s.mu += t_c
            g += t_c
            g[c] = 0.0
            if s.alpha[c] > 0:
                s.state[c] = MARGIN
                expand(s, c)
            else:
                s.state[c] = RESERVE
                free_col(s, c)
            return True, c
        s.mu += t_e
        g += t_e
    else:
        res = np.flatnonzero(st == RESERVE)
        if len(res) == 0:
            raise NeedResolve
        k = int(np.argmin(g[res]))
        who, t = int(res[k]), max(float(g[res[k]]), 0.0)
        s.mu -= t
        g -= t
        if s.col_of_slot[who] < 0:
            alloc_col(s, who)
    g[who] = 0.0
    s.state[who] = MARGIN
    expand(s, who)
    return False, who


__all__ = ["expand", "free_col", "mu_move", "refactorize", "swap_cols"]
