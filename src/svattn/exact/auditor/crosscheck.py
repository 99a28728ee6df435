"""The optional cross-check of a deletion: the remaining tokens re-solved by the dense
independent oracle (:func:`svattn.exact.oracle.solve_svdd`, Clarabel then an exact
polish) and compared with the memory.

It holds the n×n problem (the Gram matrix and Clarabel's copy of it: up to about 100·n²
bytes; 1.2 GB and 60 s measured at n = 4,000, ``results/verify_cost/oracle_4k.json``), so
:func:`refuse_oracle` refuses it above :data:`ORACLE_MAX_TOKENS` tokens unless forced.
The default check of a deletion is the optimality proof
(:mod:`svattn.exact.auditor.optimality`), which needs no solver.

Where copies make alpha unique only up to its split among them, each group of copies'
alpha sum is compared, to ``tol`` plus what the data and the two solutions' residuals
leave undetermined (:func:`group_sum_sensitivity`): on the trained model's keys
(``tests/exact/data/trained_copies.npz``) the merged margin system has condition
number 1.7e8 and a relative change of one ulp in the kernel entries moves the exact
group sums by up to 1.2e-8, so no float64 solve fixes them to 1e-9; beside near-copies
the copy test keeps apart, residuals at rounding move them in the third digit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from svattn.exact.core.kernels import (
    biased_softmax_readout,
    copy_groups,
    decision_values,
    get_kernel,
    gram_matrix,
)
from svattn.exact.memory import SVDDMemory
from svattn.exact.oracle import partition as oracle_partition
from svattn.exact.oracle import solve_svdd

ORACLE_MAX_TOKENS = 5000
"""Above this many tokens the dense oracle cross-check is refused unless forced."""
ORACLE_BYTES_PER_ENTRY = 100
"""A bound on the oracle's peak memory per entry of the n×n matrix (1.2 GB measured at
n = 4,000: 75 bytes per entry)."""


def refuse_oracle(n: int, force: bool) -> None:
    """Raise ``ValueError`` when the dense oracle cannot afford ``n`` tokens (unforced).

    Examples
    --------
    >>> refuse_oracle(4000, False)
    >>> refuse_oracle(13000, False)
    Traceback (most recent call last):
    ...
    ValueError: oracle: the dense re-solve holds the 13,000×13,000 problem (about 15.7 GiB...
    """
    if n > ORACLE_MAX_TOKENS and not force:
        need = ORACLE_BYTES_PER_ENTRY * float(n) ** 2
        raise ValueError(
            f"oracle: the dense re-solve holds the {n:,}×{n:,} problem (about "
            f"{need / 2**30:.1f} GiB, minutes to hours at this size) and is refused above "
            f"{ORACLE_MAX_TOKENS:,} tokens; the default check (the optimality proof from "
            "the keys) is complete without it. Force it with oracle_force=True "
            "(--oracle-force) if this machine can afford it")


def group_sum_sensitivity(K: np.ndarray, alpha: np.ndarray, mu: float, C: float,
                          group: np.ndarray, n_groups: int, *,
                          compared: tuple[np.ndarray, float] | None = None) -> float:
    """How far the group sums of copies of two solutions of the same problem can lie
    apart where both are at its optimum: ``alpha`` (with multiplier ``mu``, the
    reference: the oracle's) and ``compared`` (the memory's ``(alpha, mu)``; None: the
    reference alone against the exact optimum), from each solution's own residual and
    one unit of float64 rounding of every kernel entry.

    The merged problem puts each group of copies (``group``, ``n_groups`` groups) in one
    key of box ``m·C``; at the reference (with multiplier ``mu``) a group is on the
    margin when a member is strictly inside ``(0, C)`` or members sit at both bounds. Its
    margin system is ``A x = b``, ``A = [[2 K_SS, 1], [1ᵀ, 0]]``, ``x = [beta_S; mu]``,
    ``b_S = diag(K)_S − 2 K_SE (m·C)_E``, ``b_last = 1 − Σ_E m·C``, with one
    representative key per group. A solution's residual there is ``ρ = A x − b`` (its g on
    the margin groups and ``Σ alpha − 1``: its KKT residual on this system), so
    ``x = x* + A⁻¹ ρ`` with ``x*`` the exact solution, and two solutions differ by
    ``A⁻¹ (ρ_m − ρ_r)``: componentwise, ::

        |beta_m − beta_r| ≤ |A⁻¹| (|ρ_m| + |ρ_r|) + eps · |A⁻¹| (|A_K| |x| + |b|)

    where the last term is the first-order change under a relative change ``eps``
    (2.2e-16) of every kernel entry (``A_K``: ``A``'s kernel block; ``|b|`` term by term),
    the spread between two evaluations of K each within half an ulp of the exact kernel.
    An ill-conditioned merged margin system (near-copies the copy test keeps apart)
    amplifies residuals at rounding into sums that differ in the third digit. The
    reference's residual counts in full (its own accuracy); the compared solution's
    only where it is within :data:`ORACLE_POLISH_TOL` of each row's terms
    ``|A| |x| + |b|`` (the standard the reference is polished to): a state further from
    the optimum earns no allowance for its residual (counted up to the standard, it would
    earn ``|A⁻¹|`` times the standard, 4e-7 on the trained model's keys, for weight moved
    however far off), so a group sum it moves by more than the kernel's rounding and the
    reference's residual allow is rejected. Returns the bound's largest entry over the
    margin groups: group sums off
    bounds (error and reserve groups) are fixed exactly; no margin group gives 0; a
    singular merged margin system (sums not determined at all) gives ``inf``.

    Examples
    --------
    >>> K = np.array([[1.0, 0.5, 0.5], [0.5, 1.0, 0.5], [0.5, 0.5, 1.0]])
    >>> alpha = np.full(3, 1 / 3)
    >>> b = group_sum_sensitivity(K, alpha, -1 / 3, 0.5, np.arange(3), 3)
    >>> 0.0 < b < 1e-15
    True
    """
    diag = np.diagonal(K)
    beta = np.bincount(group, alpha, n_groups)
    size = np.bincount(group, minlength=n_groups)
    free = (alpha > 0.0) & (alpha < C)
    margin = np.bincount(group, free, n_groups) > 0
    margin |= (np.bincount(group, alpha <= 0.0, n_groups) > 0) & (
        np.bincount(group, alpha >= C, n_groups) > 0)
    if not margin.any():
        return 0.0
    first = np.full(n_groups, len(alpha))
    np.minimum.at(first, group, np.arange(len(alpha)))
    S = first[margin]
    at_C = ~margin & (beta > 0.0)
    E, boxE = first[at_C], size[at_C] * C
    s = S.size
    A = np.zeros((s + 1, s + 1))
    A[:s, :s] = 2.0 * K[np.ix_(S, S)]
    A[:s, s] = A[s, :s] = 1.0
    x = np.append(beta[margin], mu)
    b = np.append(diag[S] - 2.0 * K[np.ix_(S, E)] @ boxE, 1.0 - boxE.sum())
    b_abs = np.zeros(s + 1)
    b_abs[:s] = np.abs(diag[S]) + 2.0 * np.abs(K[np.ix_(S, E)]) @ boxE
    dA = np.zeros_like(A)
    dA[:s, :s] = np.abs(A[:s, :s])
    try:
        inv = np.linalg.inv(A)
    except np.linalg.LinAlgError:
        return math.inf
    eps = np.finfo(np.float64).eps
    terms = dA @ np.abs(x) + b_abs
    resid = np.abs(A @ x - b)
    if compared is not None:
        alpha_m, mu_m = compared
        x_m = np.append(np.bincount(group, alpha_m, n_groups)[margin], mu_m)
        resid_m = np.abs(A @ x_m - b)
        if np.all(resid_m <= ORACLE_POLISH_TOL * (np.abs(A) @ np.abs(x_m) + np.abs(b))):
            resid += resid_m
    bound = np.abs(inv) @ (eps * terms + resid)
    worst = float(bound[:s].max())
    return worst if math.isfinite(worst) else math.inf


@dataclass(frozen=True)
class OracleComparison:
    """The memory against the oracle's solve: partition equal, max |Δalpha|, decision
    and readout deviations over ``n_probes`` points, the largest deviation of a group of
    copies' alpha sum (``group_sum_dev``: what the optimum fixes where copies make alpha
    unique only up to its split among them), and every failure (``reasons``).

    ``group_sum_tol`` is what ``group_sum_dev`` is held to: ``tol`` plus
    :func:`group_sum_sensitivity` of the oracle's optimum and the memory's state, what
    their residuals and one ulp of relative change in every kernel entry move the group
    sums by (first order), which an ill-conditioned merged margin system makes larger
    than ``tol``."""

    partition_equal: bool
    max_alpha_dev: float
    decision_dev: float
    readout_dev: float
    n_probes: int
    reasons: tuple[str, ...]
    group_sum_dev: float = 0.0
    group_sum_tol: float = 0.0


PARTITION_ULPS = 16
"""A token one of the two solutions holds at a bound (0 or C) and the other within this
many units of rounding of ``C`` from it is at that bound in both: a tie (g at the margin
and alpha at the bound), which the memory and the oracle's polish may read either way."""


def _same_partition(memory: SVDDMemory, alpha_r: np.ndarray) -> bool:
    """Whether the memory's partition is the oracle's (``alpha_r``, aligned with the
    memory's ids), a token at a bound in one and within :data:`PARTITION_ULPS` of it in
    the other counting as the same (seed 388 of the merged core's attack: the oracle
    returned ``C - 8e-17`` for a token the memory holds at ``C``)."""
    C, alpha = memory.C, memory.alpha
    near = PARTITION_ULPS * np.finfo(np.float64).eps * C
    part_r = oracle_partition(alpha_r, C)
    part_m = memory.partition()
    row = {t: i for i, t in enumerate(memory.ids)}
    for name in ("margin", "error", "reserve"):
        for i in {row[t] for t in part_m[name]} ^ set(part_r[name]):
            at = C if alpha_r[i] >= 0.5 * C else 0.0  # the bound both must be at
            if not (abs(alpha[i] - at) <= near and abs(alpha_r[i] - at) <= near):
                return False
    return True


ORACLE_POLISH_TOL = 1e-14
"""The KKT residual the cross-check asks of the oracle's polish (its default, 1e-12, is
above what near-copies of keys leave between partitions: keys 1e-8 apart under a wide
kernel give g that differ by ~1e-12, and the oracle stopped there at a point 3.5e-13
below the optimum's dual objective, where the memory sat at rounding). Where the polish
cannot reach it (a margin system too ill-conditioned), its default is taken."""


def _oracle_optimum(K: np.ndarray, C: float) -> tuple[np.ndarray, float]:
    """The oracle's optimum polished to :data:`ORACLE_POLISH_TOL`, else to its default."""
    try:
        return solve_svdd(K, C, return_mu=True, tol=ORACLE_POLISH_TOL)
    except RuntimeError:
        return solve_svdd(K, C, return_mu=True)


def oracle_comparison(memory: SVDDMemory, *, probes: np.ndarray | None, tol: float,
                      seed: int, unique: bool) -> OracleComparison:
    """Re-solve the memory's tokens with the oracle and compare (``unique``: the
    optimum is unique, so alpha, the partition and the readout must agree too; else
    the decision function, which is unique regardless, and each group of copies' alpha
    sum, which copies leave unique when nothing else ties, to ``tol`` plus the
    sensitivity of those sums to the kernel's rounding: ``group_sum_tol``)."""
    keys, values, alpha = memory.keys, memory.values, memory.alpha
    gamma = memory.gamma_value
    K = gram_matrix(keys, memory.kernel, gamma)
    alpha_r, mu_r = _oracle_optimum(K, memory.C)
    partition_equal = _same_partition(memory, alpha_r) if not memory.warm else True
    if probes is None:
        rng = np.random.default_rng(seed)
        spread = keys.std(axis=0) + 1e-12
        noise = rng.normal(size=(64, keys.shape[1])) * spread
        around = keys[rng.integers(0, len(keys), 64)] + noise
        if not get_kernel(memory.kernel).bounded:  # within the keys' norms: k(p, x) finite
            top = float(np.einsum("ij,ij->i", keys, keys).max())
            around = around[np.einsum("ij,ij->i", around, around) <= top]
        probes = np.concatenate([keys, around])
    probes = np.asarray(probes, dtype=np.float64)
    dec_r = decision_values(probes, keys, alpha_r, mu_r, memory.kernel, gamma)
    scale = max(1.0, float(np.diag(K).max()))
    group, reps = copy_groups(K)
    group_sum_dev = float(np.abs(np.bincount(group, alpha, len(reps))
                                 - np.bincount(group, alpha_r, len(reps))).max(initial=0.0))
    group_sum_tol = tol
    if len(reps) < len(alpha):
        group_sum_tol += group_sum_sensitivity(K, alpha_r, mu_r, memory.C, group, len(reps),
                                               compared=(alpha, memory.mu))
    del K
    decision_dev = float(np.max(np.abs(memory.decision_function(probes) - dec_r))) / scale
    read_r = biased_softmax_readout(probes, keys, values, alpha_r, memory.kernel, gamma)
    vscale = max(1.0, float(np.max(np.abs(values))))
    readout_dev = float(np.max(np.abs(memory.readout(probes) - read_r))) / vscale
    alpha_dev = float(np.max(np.abs(alpha - alpha_r)))
    reasons = []
    if not decision_dev <= tol:
        reasons.append(f"decision function differs from retrain by {decision_dev:.2e}")
    if len(reps) < len(alpha) and not group_sum_dev <= group_sum_tol:
        reasons.append(f"a group of copies' alpha sum differs from retrain by "
                       f"{group_sum_dev:.2e} (allowed {group_sum_tol:.2e})")
    if unique:
        if not partition_equal:
            reasons.append("partition differs from retrain")
        if not alpha_dev <= tol:
            reasons.append(f"alpha differs from retrain by {alpha_dev:.2e}")
        if not readout_dev <= tol:
            reasons.append(f"readout differs from retrain by {readout_dev:.2e}")
    return OracleComparison(partition_equal, alpha_dev, decision_dev, readout_dev,
                            len(probes), tuple(reasons), group_sum_dev, group_sum_tol)


__all__ = ["ORACLE_MAX_TOKENS", "ORACLE_POLISH_TOL", "OracleComparison", "group_sum_sensitivity",
           "oracle_comparison", "refuse_oracle"]
