"""What the exact memory hands back besides certificates: its errors (an unknown id, an
operation that failed and was rolled back) and the solved system the torch exact path
differentiates through."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class UnknownTokenError(KeyError, ValueError):
    """A token id that the memory does not hold (never added, or removed)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class OperationError(RuntimeError):
    """An operation failed midway and was undone: the memory is exactly as before the
    call (same ids, coefficients, digest and audit-log position). The cause is chained
    (``__cause__``) and named in the message."""


@dataclass(frozen=True)
class MarginSystem:
    """The solved state as the torch exact path needs it.

    Attributes
    ----------
    margin, error, reserve
        Token ids of each set; ``margin`` is in the order of ``Qinv``'s rows 1..
    alpha
        Coefficients aligned with ``SVDDMemory.ids``.
    mu
        Multiplier of ``sum(alpha) = 1``.
    Qinv
        Inverse of ``[[0, 1^T], [1, 2 K_SS]]``, index 0 = mu (empty if no margin).
    """

    margin: list[int]
    error: list[int]
    reserve: list[int]
    alpha: np.ndarray
    mu: float
    Qinv: np.ndarray


__all__ = ["MarginSystem", "OperationError", "UnknownTokenError"]
