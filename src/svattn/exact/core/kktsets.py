"""Token states of the exact memory, one small integer per slot (``SlotState.state``).

``FREE`` marks an unused slot; ``RESERVE``, ``MARGIN`` and ``ERROR`` are the KKT
sets of ``docs/design.md`` §1 (alpha = 0, 0 < alpha < C, alpha = C); ``DRIVEN``
is the one token an operation is moving (being added or removed). The compiled
kernels and the numpy reference read the same codes.
"""

FREE, RESERVE, MARGIN, ERROR, DRIVEN = 0, 1, 2, 3, 4

SET_NAMES = {RESERVE: "reserve", MARGIN: "margin", ERROR: "error"}

__all__ = ["DRIVEN", "ERROR", "FREE", "MARGIN", "RESERVE", "SET_NAMES"]
