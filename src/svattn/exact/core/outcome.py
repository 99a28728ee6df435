"""What a removal found, returned to whoever reads it.

A removal's last pass over the margin block finds, besides the new state, the facts
its deletion certificate reports (set sizes, the support in id order, the uniqueness
test) and the health of the bordered inverse it leaves. The backend returns them in a
:class:`RemovalOutcome` (:meth:`svattn.exact.backends.protocol.Backend.remove_by_segments`),
the solver returns the outcome of the whole removal
(:func:`svattn.exact.operations.solver.remove_slot`), and the memory hands it to the
certificate (:func:`svattn.exact.operations.solver.certificate_facts`) and to the health
monitor: nothing an operation found is left on the solver state.

An outcome holds no kernel value and no key: counts, the residual, the support's ids
and coefficients (what the state digest hashes) and two scalars of the inverse's
health.

Examples
--------
>>> from svattn.exact.core.outcome import RemovalOutcome
>>> out = RemovalOutcome("reserve")  # a reserve token's removal: nothing else moved
>>> out.events, out.facts is None
(0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AddOutcome", "CertificateFacts", "HealthReading", "RemovalOutcome"]


@dataclass(frozen=True)
class CertificateFacts:
    """The facts a removal's final pass found for its certificate.

    Attributes
    ----------
    sizes : dict[str, int]
        ``{"margin", "error", "reserve"}`` set sizes.
    unique : int
        The uniqueness test on the margin block: 1 (unique), 0 (not), or -1 (some
        token is tied at ``g = 0``: the general check decides).
    ids : numpy.ndarray
        The support's ids in id order.
    values : numpy.ndarray
        Their coefficients, then ``mu`` (what the state digest hashes with ``ids``).
    """

    sizes: dict[str, int]
    unique: int
    ids: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class HealthReading:
    """``(cond1, inverse residual)`` of the bordered inverse a removal left, measured
    by its last pass as :meth:`svattn.exact.backends.protocol.Backend.margin_health` would."""

    cond1: float
    inv_residual: float


@dataclass(frozen=True)
class RemovalOutcome:
    """What a removal found.

    Attributes
    ----------
    status : str
        How it ended. From the backend's segment path: ``"done"`` (the token's arrays
        wiped, the KKT check passed, ``kkt``, ``facts`` and ``health`` set),
        ``"finish"`` (wiped; the residual needs the general finish) or ``"fallback"``
        (the event loop goes on from ``seed``). The solver's outcome adds
        ``"warm-up"`` (below the warm-up threshold: uniform again), ``"reserve"`` (a
        reserve token: nothing moved), ``"copies"`` (its copies took its weight:
        :func:`svattn.exact.operations.copies.give_to_copies`) and ``"resolved"`` (the
        batch re-solve took it).
    events : int
        Solver events taken (-1: re-solved).
    seed : numpy.ndarray or None
        For ``"fallback"``: where the event loop continues (the compiled backend's
        segment counters), or None to start it afresh.
    kkt : float or None
        The KKT residual of the exact g the removal's own check found, when it did.
    facts : CertificateFacts or None
        The certificate's facts, when the final pass found them.
    health : HealthReading or None
        The health of the inverse left, when the final pass measured it.
    """

    status: str
    events: int = 0
    seed: np.ndarray | None = None
    kkt: float | None = None
    facts: CertificateFacts | None = None
    health: HealthReading | None = None


@dataclass(frozen=True)
class AddOutcome:
    """What an add found: the new tokens' ids and how their rows were solved.

    Attributes
    ----------
    ids : list[int]
        The new tokens' ids, in row order.
    path : str
        ``"incremental"`` (stored into the reserve set or driven in one by one; the
        warm-up threshold's batch solve) or ``"libsvm+exact"`` (a block much larger
        than the memory, rbf: :func:`svattn.exact.operations.ingest.add_block`).
    """

    ids: list[int]
    path: str = "incremental"
