"""Atomic operations: a cheap checkpoint of the solver state, and its exact restore.

Every public operation of :class:`~svattn.exact.memory.SVDDMemory` runs inside
:func:`atomic`: if anything raises midway (a degenerate re-solve, a full disk under the
audit log, ``KeyboardInterrupt``), the memory is restored to what it was before the
call — the same ids, coefficients, digest, health record and audit-log position — and
the caller gets a documented error.

What a checkpoint copies, and why it stays cheap (O(n) bytes, not the O(n·columns)
kernel cache nor the O(n·d) keys):

- the per-slot vectors (``alpha``, ``g``, ``state``, ...) and the per-column arrays
  ``ac`` and ``slot_of_col``, whole;
- the bordered inverse ``Qinv`` by reference only: each change makes a new inverse
  object (the health monitor and the Gram copy know the inverse by identity), and an
  operation writes into an old one's memory only where it counts it
  (``SlotState.inverse_overwrites``: a compiled removal writes its inverse over the
  old one where it fits, :func:`svattn.exact.backends.compiled.schur.materialise`);
  so the object the checkpoint holds is the old inverse as it was unless that count
  moved (``tests/exact/test_atomic.py`` holds every operation to this). Copying it and
  scrubbing the copy were two passes over |S|² floats per operation (~1 ms of a
  removal at 781 margin tokens). A restore after a write in place recomputes the
  inverse from the restored margin block (:func:`svattn.exact.core.cache.refactorize`,
  ``O(|S|³)``, on a failure only): the same matrix to rounding, like the cache below.
  An operation that succeeds scrubs the inverse it replaced, unless an enclosing
  operation's checkpoint holds it (``erase`` and ``remove_many`` run removals inside
  one atomic call: the outermost scrubs it when it succeeds) or the current inverse
  lies in its memory. A restore scrubs the failed operation's inverse, and the old
  one's memory where a later inverse was written over it (neither is kept);
- the keys, values, ids, hashes and tags only of the slots the operation may wipe
  (named by the caller: the token a removal takes, the reserve set compaction drops);
  every other slot an operation writes was free before it, so the restore clears it;
- not the kernel cache ``KC`` nor the column keys ``XC``: both are functions of the
  keys and of ``slot_of_col``, and the restore recomputes them from the restored keys.

The restored cache equals the old one to rounding (its entries were computed by two
formulas, the batched rows of :func:`~svattn.exact.core.kernels.kernel_matrix` and the
compiled columns, and the restore uses the first), and so does an inverse recomputed
after a write in place, so a memory that rolled back continues within rounding of one
that never failed; every other field, and the digest, is restored bit for bit.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from svattn.exact.backends import compiled, reference
from svattn.exact.core.cache import refactorize
from svattn.exact.core.errors import OperationError
from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.core.state import SlotState, scrub

# per-slot arrays an operation may change anywhere; copied whole by a checkpoint
_VECTORS = ("alpha", "g", "state", "col_of_slot", "esum", "esum_member")
# per-slot arrays an operation writes only in the slots it fills (free before it) or
# wipes: the checkpoint copies the wiped slots' entries, the restore clears the filled
_ROWS = {"X": 0.0, "V": 0.0, "diag": 0.0, "xn2": 0.0, "slot_id": -1, "token_hash": 0,
         "row_hash": 0,
         "tags": 0, "commitments": 0, "commit_keyed": 0}
# arrays a checkpoint leaves out (recomputed or rewritten by the restore) and scratch
_DERIVED = ("KC", "XC", "Qinv", "ac", "slot_of_col", "free_slots", "id_to_slot")
# (what an operation found is returned to its caller, svattn.exact.core.outcome: not state)
_SCRATCH = {"kss": lambda: np.zeros((0, 0)), "kss_for": lambda: None, "kss_ext": lambda: 0,
            "qwork": lambda: np.zeros((0, 0)), "qwork_for": lambda: None,
            "qwork_n": lambda: 0, "pd_factor": lambda: None, "qspare": lambda: np.zeros(0)}


@dataclass
class Checkpoint:
    """What :func:`restore` needs to put a :class:`SlotState` back exactly."""

    scalar_values: tuple  # every scalar field's value, in the order of _SCALARS
    vectors: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]  # array -> (wiped slots, their entries)
    qinv_obj: np.ndarray  # the inverse itself (written over only where counted: module docs)
    ac: np.ndarray
    slot_of_col: np.ndarray
    free_slots: list[int]
    light: bool = False  # the operation only fills free slots (an add into the reserve)

    @property
    def scalars(self) -> dict[str, Any]:
        """The scalar fields by name (built when a restore needs them: rare)."""
        return dict(zip(_SCALARS, self.scalar_values, strict=True))


# what a free slot holds in each per-slot vector (a light restore writes it back)
_VECTOR_EMPTY = {"alpha": 0.0, "g": 0.0, "state": 0, "col_of_slot": -1, "esum": 0.0,
                 "esum_member": False}
# every other field is a scalar (or an immutable value), copied by reference
_SCALARS = tuple(f.name for f in dataclasses.fields(SlotState)
                 if f.name not in {*_VECTORS, *_ROWS, *_DERIVED, *_SCRATCH})
# one C-level read of them all: every operation takes a checkpoint, and a dict built
# name by name was half the light checkpoint of a reserve add (~2 of 4.4 µs)
_READ_SCALARS = operator.itemgetter(*_SCALARS)
assert len(_SCALARS) > 1  # (itemgetter of one name returns the value, not a tuple)


def checkpoint(ss: SlotState, wiped: Iterable[int] = (), *, light: bool = False) -> Checkpoint:
    """Copy what an operation may change; ``wiped``: the slots it may wipe.

    ``light``: the operation writes nothing but slots that are free now and the
    scalars (a row stored into the reserve set,
    :func:`svattn.exact.operations.solver.reserve_score`):
    only those are kept, and the restore clears the filled slots."""
    scalars = _READ_SCALARS(vars(ss))
    if ss.dim is None:  # nothing allocated yet: the restore only resets the scalars
        return Checkpoint(scalars, {}, {}, ss.Qinv, ss.ac, ss.slot_of_col, [])
    if light:
        return Checkpoint(scalars, {}, {}, ss.Qinv, ss.ac, ss.slot_of_col,
                          list(ss.free_slots), light=True)
    slots = np.fromiter(wiped, np.int64)
    rows = {name: (slots, getattr(ss, name)[slots]) for name in _ROWS} if len(slots) else {}
    return Checkpoint(scalars, {name: getattr(ss, name).copy() for name in _VECTORS}, rows,
                      ss.Qinv, ss.ac.copy(), ss.slot_of_col.copy(), list(ss.free_slots))


def restore(ss: SlotState, cp: Checkpoint) -> bool:
    """Put ``ss`` back to the checkpoint (see the module docs for what is recomputed);
    True when the inverse was recomputed (the checkpoint's was written over)."""
    if cp.light:
        _restore_light(ss, cp)
        return False
    # (the count is not put back: an enclosing operation's restore compares it too)
    overwrites = ss.inverse_overwrites
    overwritten = overwrites != cp.scalars["inverse_overwrites"]
    failed = ss.Qinv  # the failed operation's inverse (scrubbed below unless it is the one kept)
    if not cp.vectors:  # the state was empty: drop whatever the operation allocated,
        for f in dataclasses.fields(ss):  # every array scrubbed (rows never admitted)
            value = getattr(ss, f.name)
            if isinstance(value, np.ndarray):
                scrub(value)
        ss.drop_factor()
        fresh = SlotState.new(C=ss.C, kernel=ss.kernel, gamma=ss.gamma, tol=ss.tol,
                              standby=ss.standby, compiled=ss.compiled)
        for f in dataclasses.fields(ss):
            setattr(ss, f.name, getattr(fresh, f.name))
        for name, value in cp.scalars.items():
            setattr(ss, name, value)
        ss.inverse_overwrites = overwrites
        return False
    cap, ccap = int(cp.scalars["cap"]), int(cp.scalars["ccap"])
    _clear_filled(ss, cp, _ROWS)
    for name, value in cp.scalars.items():
        setattr(ss, name, value)
    for name, arr in cp.vectors.items():
        setattr(ss, name, arr)
    old_slot_id = ss.slot_id
    ss.Qinv, ss.ac, ss.slot_of_col = cp.qinv_obj, cp.ac, cp.slot_of_col
    ss.free_slots = list(cp.free_slots)
    live = np.flatnonzero(old_slot_id >= 0)
    ss.id_to_slot = {int(old_slot_id[s]): int(s) for s in live}
    _rebuild_cache(ss, cap, ccap, live)
    _reset_scratch(ss)
    ss.inverse_overwrites = overwrites
    if overwritten:  # the old inverse's memory holds a later one: recomputed
        refactorize(ss, count=False)
        scrub(cp.qinv_obj)  # (that later inverse, as the failed operation left it)
    if not np.may_share_memory(failed, ss.Qinv):
        scrub(failed)
    return overwritten


def _reset_scratch(ss: SlotState) -> None:
    """Scratch back to empty; the Gram copy (kernel values, perhaps of a token the
    failed operation added) and the kept factor scrubbed first."""
    scrub(ss.kss)
    scrub(ss.qwork)
    if not np.may_share_memory(ss.qspare, ss.Qinv):  # (zeros, unless the removal kernel
        scrub(ss.qspare)  # raised while it wrote the inverse there)
    ss.drop_factor()
    for name, make in _SCRATCH.items():
        setattr(ss, name, make())


def _clear_filled(ss: SlotState, cp: Checkpoint, arrays: dict[str, Any]) -> None:
    """Back to the checkpoint's capacity, clear in ``arrays`` (name -> empty value) the
    slots the operation may have filled — the free list and the unused tail — and put
    the wiped slots' entries back."""
    cap, hi = int(cp.scalars["cap"]), int(cp.scalars["hi"])
    filled = np.concatenate([np.asarray(cp.free_slots, np.int64), np.arange(hi, cap)])
    for name, empty in arrays.items():
        arr = _slots_back(getattr(ss, name), cap)
        arr[filled] = empty
        if name in cp.rows:  # (an add wipes nothing)
            slots, entries = cp.rows[name]
            arr[slots] = entries
        setattr(ss, name, arr)


def _restore_light(ss: SlotState, cp: Checkpoint) -> None:
    """Clear the slots a reserve add filled (their cache rows too), restore the scalars."""
    _clear_filled(ss, cp, {**_ROWS, **_VECTOR_EMPTY, "KC": 0.0})
    for name, value in cp.scalars.items():
        setattr(ss, name, value)
    ss.free_slots = list(cp.free_slots)
    ss.id_to_slot = {t: s for t, s in ss.id_to_slot.items() if t < ss.next_id}
    _reset_scratch(ss)


def _slots_back(a: np.ndarray, cap: int) -> np.ndarray:
    """``a`` with ``cap`` rows: itself, or (after a grow) a copy of its first rows, the
    grown buffer scrubbed."""
    if a.shape[0] == cap:
        return a
    out = a[:cap].copy()
    scrub(a)
    return out


def _rebuild_cache(ss: SlotState, cap: int, ccap: int, live: np.ndarray) -> None:
    """KC and XC recomputed from the restored keys and column assignment."""
    for buf in (ss.KC, ss.XC):
        scrub(buf)
    d = ss.X.shape[1]
    ss.KC = np.zeros((cap, ccap), order="F")
    ss.XC = np.zeros((ccap, d))
    cols = np.flatnonzero(ss.slot_of_col[: ss.chi] >= 0)
    if not (len(cols) and len(live)):
        return
    owners = ss.slot_of_col[cols]
    for c, s in zip(cols.tolist(), owners.tolist(), strict=True):
        ss.XC[c] = ss.X[s]  # (row by row: no temporary copy of keys)
    keys, xc, block = ss.X[live], ss.XC[cols], None
    try:  # the copies of keys and the kernel block: scrubbed (tokens may be removed later)
        block = kernel_matrix(keys, xc, ss.kernel, ss.gamma_value)
        ss.KC[np.ix_(live, cols)] = block
    finally:
        for a in (keys, xc) if block is None else (keys, xc, block):
            scrub(a)
    ss.KC[owners, cols] = ss.diag[owners]  # a token's own entry is its diagonal


class _Log(Protocol):
    def mark(self) -> Any: ...
    def rollback(self, mark: Any) -> None: ...


@contextmanager
def atomic(ss: SlotState, health: Any, log: _Log | None, op: str, *,
           wiped: Iterable[int] = (), passthrough: tuple[type[BaseException], ...] = (),
           light: bool = False) -> Iterator[None]:
    """Run the body as one operation: on any exception, undo the log's records, restore
    ``ss`` and the health monitor's fields, then re-raise — ``passthrough`` errors and
    interrupts as they are, anything else as :class:`OperationError` naming the cause.

    If the restore itself fails (memory exhausted twice over), the memory is marked
    broken (``health.broken``: it then refuses every operation) and the error says so.
    """
    cp = checkpoint(ss, wiped, light=light)
    monitor = dict(vars(health))
    mark = None if log is None else log.mark()
    stack = _open_checkpoints()
    stack.append(cp)
    try:
        yield
        # the operation's last step: error tokens keep no cache column between operations
        (compiled if ss.compiled else reference).settle_error_columns(ss)
    except BaseException as exc:
        if log is not None:  # first: a record of what is being undone must not stay
            log.rollback(mark)
        try:
            recomputed = restore(ss, cp)
            vars(health).clear()
            vars(health).update(monitor)
            if recomputed:  # (the same inverse to rounding: its check carries over)
                health.carry_check(cp.qinv_obj, ss.Qinv)
        except BaseException as again:
            health.broken = (f"{op} failed ({type(exc).__name__}: {exc}) and restoring the "
                             f"state failed too ({type(again).__name__}: {again})")
            raise OperationError(health.broken + "; the memory is NOT restored and refuses "
                                 "every further operation: load its last saved state") from exc
        if isinstance(exc, passthrough) or not isinstance(exc, Exception):
            raise
        raise OperationError(
            f"{op} failed ({type(exc).__name__}: {exc}); the memory is unchanged") from exc
    else:
        stack.pop()  # (an enclosing operation may yet restore the old inverse: it scrubs it)
        _scrub_after_success(ss, cp, keep_inverse=any(outer.qinv_obj is cp.qinv_obj
                                                      for outer in stack))
    finally:
        if stack and stack[-1] is cp:
            stack.pop()
        for _, entries in cp.rows.values():  # the wiped tokens' data: scrubbed either way
            scrub(entries)


_THREAD = threading.local()


def _open_checkpoints() -> list[Checkpoint]:
    """The checkpoints of the operations running in this thread, outermost first."""
    stack = getattr(_THREAD, "checkpoints", None)
    if stack is None:
        stack = _THREAD.checkpoints = []
    return stack


def _scrub_after_success(ss: SlotState, cp: Checkpoint, *, keep_inverse: bool = False) -> None:
    """The checkpoint of an operation that succeeded is dropped: its copies of the
    wiped slots' per-slot values (g and the error sum of a removed token are functions
    of its key) go back to the allocator zeroed, as does the inverse the operation
    replaced (a removed margin token's row and column) unless ``keep_inverse``."""
    if not cp.vectors:  # a light checkpoint copies nothing; an empty state had nothing
        return
    slots = next(iter(cp.rows.values()))[0] if cp.rows else None
    if slots is not None:
        for arr in cp.vectors.values():
            arr[slots] = 0
    if (cp.qinv_obj is not ss.Qinv and not keep_inverse
            and not np.may_share_memory(cp.qinv_obj, ss.Qinv)):  # (written over in place)
        scrub(cp.qinv_obj)
        _keep_spare(ss, cp.qinv_obj)


def _keep_spare(ss: SlotState, old: np.ndarray) -> None:
    """The replaced inverse's memory, zeroed, becomes the state's spare
    (``SlotState.qspare``): the next removal writes its inverse there
    (:func:`svattn.exact.backends.compiled.remove_by_segments`) instead of into a fresh
    array, whose |S|² floats the kernel faulted in and zeroed first (tens to hundreds
    of ms at 2,468 margin tokens, more than a pass over the margin block). Only memory
    nothing else refers to: a plain array, one a compiled kernel allocated (its base is
    numba's memory owner, not an array: such inverses were dropped, and every other
    removal faulted a fresh array in), or the flat buffer a spare-made inverse or one
    written over an older one is a view of (:func:`~svattn.exact.backends.compiled.
    inverse_memory`)."""
    flat = compiled.inverse_memory(old)
    if flat.size > ss.qspare.size:
        ss.qspare = flat


__all__ = ["Checkpoint", "atomic", "checkpoint", "restore"]
