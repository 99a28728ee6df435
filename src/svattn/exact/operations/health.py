"""Numerical health of the exact memory: conditioning and drift of the bordered inverse.

The memory keeps ``Qinv``, the inverse of ``Q = [[0, 1^T], [1, 2 K_SS]]``, by
rank-one border updates. Each update is exact in exact arithmetic but adds
rounding, and a long stream could let ``Qinv`` drift from the true inverse.
After every operation that changed ``Qinv`` (detected by object identity, so a
reserve-only add costs nothing) :class:`HealthMonitor` measures, in
O(|S|²):

* the 1-norm condition estimate ``cond1 = ‖Q‖₁ ‖Qinv‖₁`` (an upper bound on
  the true 1-norm condition number when Qinv is accurate), and
* the inverse residual ``‖Q (Qinv v) − v‖∞ / ‖v‖∞`` for a fixed probe ``v``.

A removal over a large margin set reports a *probe reading* instead (``cond1`` NaN):
the residual ``‖Q (Qinv b) − b‖∞ / ‖b‖∞`` its final solve's refinement computed anyway,
on that solve's right-hand side ``b`` — the same measure on another probe, at no cost,
where the full one reads the inverse and the Gram block once more. The monitor accepts
it, with ``cond1`` carried from the last full measure, for :data:`PROBE_RUN` checks in
a row while it stays below ``1/PROBE_MARGIN`` of the bar; past them, or above that,
it measures in full.

When the residual exceeds what the conditioning explains
(``max(drift_tol, 1e3 · eps · cond1)``), it refactorizes ``Qinv`` from scratch
(counted in ``SVDDMemory.n_refactorizations`` and written to the audit log
with the reason). If even a fresh inverse stays above the bar (Q is
ill-conditioned), the bar is raised to 100× the fresh residual until the next
refactorization, so the memory never refactorizes in a loop. Entering the
ill-conditioned regime (``cond1 > ill_cond``) is recorded as an event.

The monitor sees no memory: the memory hands it the current ``Qinv`` object
and two callables, one that measures ``(cond1, inverse residual)`` and one that
refactorizes and returns the new inverse. A removal whose last pass measured the
inverse it left returns that reading in its outcome
(:class:`~svattn.exact.core.outcome.HealthReading`); :func:`reading_first` makes it the
measurement's first answer.

Examples
--------
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> mem = SVDDMemory(C=0.05)
>>> _ = mem.extend(np.random.default_rng(0).normal(size=(100, 4)))
>>> mem.health.cond1 > 1, mem.health.inv_residual < 1e-10
(True, True)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from svattn.exact.core.outcome import HealthReading

_EPS = float(np.finfo(np.float64).eps)
# Probe readings accepted in a row between two full measures, and how far below the
# drift bar a probe reading must stay to be accepted (a larger one is a suspicion:
# measured in full at once).
PROBE_RUN = 15
PROBE_MARGIN = 8.0


class HealthMonitor:
    """Tracks conditioning and drift of a memory's bordered inverse.

    Parameters
    ----------
    drift_tol : float
        Absolute floor of the inverse-residual bar.
    ill_cond : float
        ``cond1`` above which Q counts as ill-conditioned (an audit event).

    Attributes
    ----------
    cond1, inv_residual : float
        The latest estimates (0 while the margin set is empty).
    max_cond1, max_inv_residual : float
        Largest seen.
    n_checks, n_drift_refactorizations : int
    """

    def __init__(self, drift_tol: float = 1e-10, ill_cond: float = 1e12) -> None:
        self.drift_tol = float(drift_tol)
        self.ill_cond = float(ill_cond)
        self.cond1 = 0.0
        self.inv_residual = 0.0
        self.max_cond1 = 0.0
        self.max_inv_residual = 0.0
        self.n_checks = 0
        self.n_drift_refactorizations = 0
        self.baseline = 0.0  # fresh residual of an ill-conditioned Q (raises the bar)
        self.ill_conditioned = False
        self.reason: str | None = None  # why the memory is refactorizing right now
        self.broken: str | None = None  # set when a failed operation could not be undone
        self.probes = 0  # probe readings accepted since the last full measure
        # the Qinv object checked last, weakly: a stale inverse (which may involve
        # a removed token's kernel values) must not be kept alive
        self._last: weakref.ref | None = None

    def check(self, qinv: np.ndarray, measure: Callable[[], tuple[float, float]],
              refactorize: Callable[[], np.ndarray]) -> list[dict[str, Any]]:
        """Check after an operation; refactorize on drift. Return events (dicts).

        Parameters
        ----------
        qinv
            The memory's current bordered inverse (checked once per object; an
            empty one, as in warm-up or with an empty margin, is not checked).
        measure
            ``() -> (cond1, inverse residual)`` of the current inverse; a ``cond1``
            of NaN marks a probe reading (see the module), and a second call then
            measures in full.
        refactorize
            Rebuilds the inverse from the kernel cache and returns the new one.
        """
        if self.checked(qinv) or qinv.size == 0:
            return []
        events: list[dict[str, Any]] = []
        cond, res = measure()
        if cond != cond:  # a probe reading: cond1 carried from the last full measure
            bar = max(self.drift_tol, 1e3 * _EPS * self.cond1, 100.0 * self.baseline)
            if self.cond1 > 0.0 and self.probes < PROBE_RUN and res <= bar / PROBE_MARGIN:
                self.probes += 1
                cond = self.cond1
            else:
                cond, res = measure()
                self.probes = 0
        else:
            self.probes = 0
        self.n_checks += 1
        self.cond1, self.inv_residual = cond, res
        self.max_cond1 = max(self.max_cond1, cond)
        self.max_inv_residual = max(self.max_inv_residual, res)
        ill = cond > self.ill_cond
        if ill and not self.ill_conditioned:
            events.append({"event": "ill_conditioned", "cond1": cond, "inv_residual": res})
        self.ill_conditioned = ill
        bar = max(self.drift_tol, 1e3 * _EPS * cond, 100.0 * self.baseline)
        if res > bar:
            self.reason = f"inverse drift {res:.3e} above {bar:.3e} (cond1 {cond:.3e})"
            try:
                qinv = refactorize()
            finally:
                self.reason = None
            self.n_drift_refactorizations += 1
            cond2, res2 = measure()
            self.cond1, self.inv_residual = cond2, res2
            self.baseline = res2 if res2 > max(self.drift_tol, 1e3 * _EPS * cond2) else 0.0
            events.append({"event": "drift", "inv_residual": res, "bar": bar, "cond1": cond,
                           "inv_residual_after": res2})
        self._last = weakref.ref(qinv)
        return events

    def checked(self, qinv: np.ndarray) -> bool:
        """Whether ``qinv`` (this very object) was checked last."""
        return self._last is not None and self._last() is qinv

    def carry_check(self, old: np.ndarray, new: np.ndarray) -> None:
        """``new`` is ``old`` recomputed (a restore after ``old``'s memory was written
        over, :mod:`svattn.exact.operations.rollback`): checked if ``old`` was."""
        if self.checked(old):
            self._last = weakref.ref(new)

    # ------------------------------------------------------------- persistence
    def to_dict(self, qinv: np.ndarray) -> dict[str, Any]:
        """JSON-ready state (``checked``: whether the memory's current Qinv was checked)."""
        def f(x: float) -> float | str:
            return x if np.isfinite(x) else repr(x)  # JSON has no inf

        return {
            "cond1": f(self.cond1), "inv_residual": f(self.inv_residual),
            "max_cond1": f(self.max_cond1), "max_inv_residual": f(self.max_inv_residual),
            "n_checks": self.n_checks, "n_drift_refactorizations": self.n_drift_refactorizations,
            "baseline": self.baseline, "ill_conditioned": self.ill_conditioned,
            "drift_tol": self.drift_tol, "ill_cond": self.ill_cond,
            "checked": self.checked(qinv),
        }

    def restore(self, data: dict[str, Any], qinv: np.ndarray) -> None:
        """Inverse of :meth:`to_dict` (for a loaded memory)."""
        for k in ("cond1", "inv_residual", "max_cond1", "max_inv_residual", "baseline",
                  "drift_tol", "ill_cond"):
            setattr(self, k, float(data[k]))
        self.n_checks = int(data["n_checks"])
        self.n_drift_refactorizations = int(data["n_drift_refactorizations"])
        self.ill_conditioned = bool(data["ill_conditioned"])
        self._last = weakref.ref(qinv) if data["checked"] else None


def reading_first(reading: HealthReading | None, measure: Callable[[], tuple[float, float]]
                  ) -> Callable[[], tuple[float, float]]:
    """``measure``, except that its first call returns ``reading`` when given: the
    health of the inverse an operation left, which the operation measured itself
    (:meth:`HealthMonitor.check` measures that inverse first, and again only after
    refactorizing it).

    Examples
    --------
    >>> from svattn.exact.core.outcome import HealthReading
    >>> m = reading_first(HealthReading(3.0, 1e-16), lambda: (4.0, 2e-16))
    >>> m(), m()
    ((3.0, 1e-16), (4.0, 2e-16))
    """
    pending = [] if reading is None else [(reading.cond1, reading.inv_residual)]

    def first() -> tuple[float, float]:
        return pending.pop() if pending else measure()
    return first


__all__ = ["HealthMonitor", "reading_first"]
