"""The backend interface: what the solver calls on :mod:`svattn.exact.backends.compiled` and
:mod:`svattn.exact.backends.reference`.

The two backends are modules, a pair: ``reference`` is the numpy form of every
kernel (slow, obviously correct), ``compiled`` the numba form the memory runs by
default. The solver takes either as ``be`` and calls the functions this protocol
declares; each acts on a :class:`~svattn.exact.core.state.SlotState` in place.
``tests/exact/test_backend_protocol.py`` holds both modules to it, name and signature,
so a function added to one backend and not declared here (or not added to the other)
fails the suite.

Examples
--------
>>> from svattn.exact.backends import compiled, reference
>>> from svattn.exact.backends.protocol import Backend, conforms
>>> conforms(compiled), conforms(reference)
([], [])
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from svattn.exact.core.outcome import RemovalOutcome
    from svattn.exact.core.state import SlotState

__all__ = ["Backend", "conforms", "declared"]


class Backend(Protocol):
    """The functions a backend module provides (each module-level, ``ss`` first).

    Slot bookkeeping
        :meth:`alloc_col`, :meth:`wipe_slot_arrays`, :meth:`store_row`,
        :meth:`count_states`, :meth:`support_slots_by_id`.
    The margin system
        :meth:`solve_margin`, :meth:`margin_gram`, :meth:`margin_health`,
        :meth:`contract`, :meth:`positive_definite`.
    Optimality
        :meth:`g_exact`, :meth:`kkt`, :meth:`tied_slots`, :meth:`tied_positive_definite`,
        :meth:`certificate_facts`.
    Operations
        :meth:`drive` (the event loop), :meth:`remove_by_segments`,
        :meth:`reserve_add`, :meth:`reserve_block`, :meth:`nearest_reserve`,
        :meth:`refresh_standby`, :meth:`settle_error_columns`.
    """

    NAME: str
    """``"compiled"`` or ``"reference"``."""

    def alloc_col(self, ss: SlotState, slot: int) -> int:
        """Give ``slot`` a kernel-cache column; return it."""
        ...

    def certificate_facts(self, ss: SlotState, g: np.ndarray, tie: float
                          ) -> tuple[int, int, int, int, np.ndarray, np.ndarray]:
        """Counts and slots a certificate reports (partition sizes, ties, support)."""
        ...

    def contract(self, ss: SlotState, p: int) -> None:
        """Remove position ``p`` of the margin set from the bordered inverse."""
        ...

    def count_states(self, ss: SlotState) -> tuple[int, int, int]:
        """``(margin, error, reserve)`` counts."""
        ...

    def drive(self, ss: SlotState, c: int, direction: int, seed: np.ndarray | None = None
              ) -> int:
        """Move slot ``c``'s coefficient in ``direction`` through the events; return
        how many events it took."""
        ...

    def g_exact(self, ss: SlotState) -> np.ndarray:
        """The gradient recomputed from the kernel, not the maintained one."""
        ...

    def kkt(self, ss: SlotState, g: np.ndarray) -> float:
        """The KKT residual of the state under gradient ``g``."""
        ...

    def margin_gram(self, ss: SlotState) -> np.ndarray:
        """``K_SS``, the margin set's Gram block."""
        ...

    def margin_health(self, ss: SlotState, KSS: np.ndarray) -> tuple[float, float]:
        """Residuals of the maintained inverse against ``K_SS``."""
        ...

    def nearest_reserve(self, ss: SlotState, m: int) -> np.ndarray:
        """The ``m`` reserve slots closest to the boundary (the standby columns)."""
        ...

    def positive_definite(self, K: np.ndarray, rel_shift: float) -> bool:
        """Whether ``K`` minus ``rel_shift·trace`` on its diagonal is positive definite."""
        ...

    def ready_for_removals(self, ss: SlotState) -> None:
        """After a batch solve, an unpickle or a load: build what a removal keeps between
        operations (the margin Gram block, the uniqueness test's factor, the work copy of
        the inverse), so that the first removal after a fit costs what a later one does;
        nothing where a backend keeps none."""
        ...

    def refresh_standby(self, ss: SlotState) -> None:
        """Recompute the standby columns."""
        ...

    def remove_by_segments(self, ss: SlotState, c: int, *, contract_first: bool
                           ) -> RemovalOutcome:
        """Remove slot ``c`` by the segment path: a ``"fallback"`` outcome hands over
        to :meth:`drive` (from its ``seed``, or afresh when None); ``"done"`` carries
        what the final pass found (residual, certificate facts, health)."""
        ...

    def reserve_add(self, ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int,
                    tid: int) -> bool:
        """Store a row scored outside the description as reserve; False if it is not."""
        ...

    def reserve_block(self, ss: SlotState, k: np.ndarray, v: np.ndarray | None,
                      slots: np.ndarray, tids: np.ndarray
                      ) -> tuple[int, str, np.ndarray | None, float, float]:
        """Store a block's rows as reserve until the first that is not."""
        ...

    def settle_error_columns(self, ss: SlotState) -> None:
        """End an operation: the error sum synced, no error token holding a column."""
        ...

    def solve_margin(self, ss: SlotState) -> int | None:
        """Solve the margin system from scratch; None where it is singular."""
        ...

    def store_row(self, ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int,
                  tid: int, diag: float, row: np.ndarray, g: float) -> None:
        """Store a scored row in ``slot``."""
        ...

    def support_slots_by_id(self, ss: SlotState) -> np.ndarray:
        """Support slots in id order."""
        ...

    def tied_slots(self, ss: SlotState, g: np.ndarray, tie: float) -> np.ndarray:
        """Slots whose gradient sits within ``tie`` of a boundary."""
        ...

    def tied_positive_definite(self, ss: SlotState, tied: np.ndarray) -> bool:
        """Whether the kernel block of the margin set and the slots ``tied`` (not in
        it) minus ``1e-10·trace`` on its diagonal is positive definite: the uniqueness
        test of an optimum with tokens tied at ``g = 0``."""
        ...

    def wipe_slot_arrays(self, ss: SlotState, slot: int) -> int:
        """Zero every array entry of ``slot``; return its freed column."""
        ...


def declared() -> dict[str, inspect.Signature | None]:
    """The protocol's members: name → signature without ``self`` (None for ``NAME``)."""
    out: dict[str, inspect.Signature | None] = {"NAME": None}
    for name, fn in vars(Backend).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        sig = inspect.signature(fn)
        out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


def conforms(module: ModuleType) -> list[str]:
    """How ``module`` departs from :class:`Backend` (empty: it conforms): members
    missing, signatures that differ (names, kinds, defaults and annotations), and
    public names of its ``__all__`` the protocol does not declare."""
    problems = []
    members = declared()
    for name, sig in members.items():
        if not hasattr(module, name):
            problems.append(f"{module.__name__} lacks {name}")
            continue
        if sig is None:
            continue
        got = inspect.signature(getattr(module, name))
        if str(got) != str(sig):
            problems.append(f"{module.__name__}.{name}{got} differs from the protocol's "
                            f"{name}{sig}")
    extra = sorted(set(getattr(module, "__all__", ())) - set(members))
    problems += [f"{module.__name__}.{name} is exported but not declared" for name in extra]
    return problems
