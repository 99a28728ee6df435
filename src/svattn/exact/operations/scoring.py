"""New keys scored against the state, and their error sums: the error tokens keep no
kernel column (issue #51), so their share is read from their keys, one compiled pass
per key that copies none (:func:`svattn.exact.backends.compiled.reserve.error_share`)."""

from __future__ import annotations

import numpy as np

from svattn.exact.backends import reference
from svattn.exact.backends.compiled.reserve import error_share
from svattn.exact.backends.protocol import Backend
from svattn.exact.core.conventions import mu_for_empty_margin
from svattn.exact.core.kernels import (
    biased_softmax_readout,
    decision_values,
    get_kernel,
    kernel_matrix,
)
from svattn.exact.core.kktsets import ERROR, RESERVE
from svattn.exact.core.state import SlotState, scrub


def score_rows(ss: SlotState, xs: np.ndarray, diag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kernel rows of new keys against the cached columns, and their g (the error
    tokens that keep no column by their keys, :func:`error_shares`)."""
    chi = ss.chi
    share, _ = error_shares(ss, xs)
    if chi == 0:
        return np.zeros((len(xs), 0)), ss.mu - diag + 2.0 * ss.C * share
    rows = kernel_matrix(xs, ss.XC[:chi], ss.kernel, ss.gamma_value)
    g = 2.0 * (rows @ ss.ac[:chi]) + 2.0 * ss.C * share - diag + ss.mu
    return rows, g


def error_shares(ss: SlotState, xs) -> tuple[np.ndarray, np.ndarray]:
    """For each key of ``xs``, its kernel values against the tokens without a cache
    column in the error set (every error token between operations) and in the error
    sum's members, summed over each: one compiled pass per key that copies no key
    (:func:`svattn.exact.backends.compiled.reserve.error_share`)."""
    m = len(xs)
    share, member = np.zeros(m), np.zeros(m)
    if ss.dim is None or not ss.hi:
        return share, member
    gamma, rbf = ss.gamma_value, ss.is_rbf
    for i in range(m):
        x = xs[i]
        plain = x.dtype == np.float64 and x.flags.c_contiguous
        x = x if plain else np.ascontiguousarray(x, dtype=np.float64)
        try:
            gp, es, top = error_share(x, ss.X, ss.state, ss.esum_member, ss.col_of_slot,
                                      ss.hi, gamma, rbf)
        finally:
            if not plain:
                scrub(x)  # a copy of the key
        if not rbf:
            get_kernel(ss.kernel).check_overflow(float(top), "log k(x, y)")
        share[i], member[i] = gp, es
    return share, member


def esum_rows(ss: SlotState, slots: np.ndarray, rows: np.ndarray) -> None:
    """The error sum on newly stored rows: their kernel rows over the members' cached
    columns, plus the members without one by their keys (:func:`error_shares`)."""
    ss.esum[slots] = 0.0
    if not ss.esum_valid:
        return
    members = np.flatnonzero(ss.esum_member[: ss.hi])
    cols = ss.col_of_slot[members]
    cols = cols[(cols >= 0) & (cols < rows.shape[1])]
    uncached = len(cols) < len(members)
    if len(cols):
        ss.esum[slots] = rows[:, cols].sum(axis=1)
    if uncached:
        ss.esum[slots] += error_shares(ss, [ss.X[s] for s in slots.tolist()])[1]


def mu_interval(ss: SlotState) -> tuple[float, float]:
    """The optimal values of ``mu``, ``(low, high)``.

    One point, ``(mu, mu)``, while the margin set is non-empty (and in warm-up). With an
    empty margin set every ``mu`` with ``g_E <= 0 <= g_R`` is optimal: from
    ``mu − min_R g`` (the reserve token nearest the boundary on it) up to ``ss.mu``, the
    largest, which the memory keeps
    (:func:`canonical_mu`); ``low`` is ``-inf`` when no
    token is in the reserve. libsvm takes the middle (its ``rho``), and so does the
    offset of :class:`svattn.SVDD`. Reads the state only (g from the cached columns).
    """
    mu = float(ss.mu)
    if ss.n == 0 or ss.warm or ss.nS:
        return mu, mu
    live = ss.live_slots()
    reserve = live[ss.state[live] == RESERVE]
    if not len(reserve):
        return -np.inf, mu
    return min(mu, mu - float(reference.g_exact(ss)[reserve].min())), mu


def canonical_mu(ss: SlotState, be: Backend) -> None:
    """Empty margin set: the largest optimal mu (docs/design.md §3).

    Where no mu fits both sides exactly — the largest leaves a reserve token below the
    boundary, beyond tol in the KKT measure, which keys whose ``k(x, x)`` differ by many
    orders of magnitude allow (exp kernel: an error token's rounding at 1e15 is larger
    than a reserve token's whole g at 1) — the smallest mu that keeps every reserve
    token inside is taken when its residual is smaller: the optimum then has a margin
    token at alpha = 0, as the oracle finds it."""
    E = ss.slots_in({ERROR})
    if len(E) == 0:
        return
    g_all = be.g_exact(ss)  # (mu's part removed below: the error sum holds E's columns)
    grad = g_all[E] - ss.mu
    ss.mu = mu_for_empty_margin(grad)
    ss.g[: ss.hi] = be.g_exact(ss)
    ss.g_valid = True
    kkt = float(be.kkt(ss, ss.g[: ss.hi]))
    if not kkt > ss.tol:
        return
    live = ss.live_slots()
    reserve = live[ss.state[live] == RESERVE]
    if not len(reserve):
        return
    high, g_high = ss.mu, ss.g[: ss.hi].copy()
    ss.mu = high - float(g_high[reserve].min())
    ss.g[: ss.hi] = be.g_exact(ss)
    if not float(be.kkt(ss, ss.g[: ss.hi])) < kkt:
        ss.mu, ss.g[: ss.hi] = high, g_high


def support_readout(ss: SlotState, q: np.ndarray, *, decision: bool = False) -> np.ndarray:
    """The readout (``decision``: the decision values) of queries ``q`` over the cached
    support, through copies of its keys and values that are scrubbed after (a token in
    them may be removed later: nothing of it stays in freed memory)."""
    slots = ss.cached_support_slots()
    keys = ss.X[slots]
    vals = None if decision else keys if ss.value_is_key else ss.V[slots]
    try:
        if decision:
            return decision_values(q, keys, ss.alpha[slots], ss.mu, ss.kernel, ss.gamma_value)
        return biased_softmax_readout(q, keys, vals, ss.alpha[slots], ss.kernel, ss.gamma_value)
    finally:
        scrub(keys)
        if vals is not None:
            scrub(vals)


__all__ = ["canonical_mu", "error_shares", "esum_rows", "mu_interval", "score_rows",
           "support_readout"]
