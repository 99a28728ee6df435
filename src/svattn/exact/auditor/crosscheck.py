"""The optional cross-check of a deletion: the remaining tokens re-solved by the dense
independent oracle (:func:`svattn.exact.oracle.solve_svdd`, Clarabel then an exact
polish) and compared with the memory.

It holds the n×n problem (the Gram matrix and Clarabel's copy of it: up to about 100·n²
bytes; 1.2 GB and 60 s measured at n = 4,000, ``results/verify_cost/oracle_4k.json``), so
:func:`refuse_oracle` refuses it above :data:`ORACLE_MAX_TOKENS` tokens unless forced.
The default check of a deletion is the optimality proof
(:mod:`svattn.exact.auditor.optimality`), which needs no solver.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class OracleComparison:
    """The memory against the oracle's solve: partition equal, max |Δalpha|, decision
    and readout deviations over ``n_probes`` points, the largest deviation of a group of
    copies' alpha sum (``group_sum_dev``: what the optimum fixes where copies make alpha
    unique only up to its split among them), and every failure (``reasons``)."""

    partition_equal: bool
    max_alpha_dev: float
    decision_dev: float
    readout_dev: float
    n_probes: int
    reasons: tuple[str, ...]
    group_sum_dev: float = 0.0


def oracle_comparison(memory: SVDDMemory, *, probes: np.ndarray | None, tol: float,
                      seed: int, unique: bool) -> OracleComparison:
    """Re-solve the memory's tokens with the oracle and compare (``unique``: the
    optimum is unique, so alpha, the partition and the readout must agree too; else
    the decision function, which is unique regardless, and each group of copies' alpha
    sum, which copies leave unique when nothing else ties)."""
    keys, values, alpha = memory.keys, memory.values, memory.alpha
    gamma = memory.gamma_value
    K = gram_matrix(keys, memory.kernel, gamma)
    alpha_r, mu_r = solve_svdd(K, memory.C, return_mu=True)
    ids = memory.ids
    part_r = oracle_partition(alpha_r, memory.C)
    part_m = memory.partition()
    partition_equal = all(
        sorted(ids[i] for i in part_r[name]) == sorted(part_m[name])
        for name in ("margin", "error", "reserve")
    ) if not memory.warm else True
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
    del K
    group_sum_dev = float(np.abs(np.bincount(group, alpha, len(reps))
                                 - np.bincount(group, alpha_r, len(reps))).max(initial=0.0))
    decision_dev = float(np.max(np.abs(memory.decision_function(probes) - dec_r))) / scale
    read_r = biased_softmax_readout(probes, keys, values, alpha_r, memory.kernel, gamma)
    vscale = max(1.0, float(np.max(np.abs(values))))
    readout_dev = float(np.max(np.abs(memory.readout(probes) - read_r))) / vscale
    alpha_dev = float(np.max(np.abs(alpha - alpha_r)))
    reasons = []
    if not decision_dev <= tol:
        reasons.append(f"decision function differs from retrain by {decision_dev:.2e}")
    if len(reps) < len(alpha) and not group_sum_dev <= tol:
        reasons.append(f"a group of copies' alpha sum differs from retrain by "
                       f"{group_sum_dev:.2e}")
    if unique:
        if not partition_equal:
            reasons.append("partition differs from retrain")
        if not alpha_dev <= tol:
            reasons.append(f"alpha differs from retrain by {alpha_dev:.2e}")
        if not readout_dev <= tol:
            reasons.append(f"readout differs from retrain by {readout_dev:.2e}")
    return OracleComparison(partition_equal, alpha_dev, decision_dev, readout_dev,
                            len(probes), tuple(reasons), group_sum_dev)


__all__ = ["ORACLE_MAX_TOKENS", "OracleComparison", "oracle_comparison", "refuse_oracle"]
