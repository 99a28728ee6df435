"""A read-only view of an :class:`~svattn.exact.memory.SVDDMemory`: what its consumers
read beyond the memory's own properties.

``mem.view`` is a :class:`MemoryView` of the memory as it is at each read (it holds the
memory's solver state, not a copy): token ids (:attr:`~MemoryView.next_id`,
:meth:`~MemoryView.holds`), the key of one token, the support in id order, the interval
of optimal ``mu``, the margin set in the bordered system's column order, the live
commitments a certificate is checked against, a tag's token count, the solver's
counters and an independent KKT residual. Every method returns new Python or numpy
objects: nothing read here can change the memory.

The estimator (:mod:`svattn.estimators`), the stream's forget verifier
(:mod:`svattn.lm.forget`) and the benchmarks read the memory through this view and its
own properties only; the solver state itself (``SVDDMemory.solver_state``) stays inside
:mod:`svattn.exact` and its tests (``tests/test_architecture.py`` holds this).

:func:`instrument` is the one way around it, for the benchmarks that time or A/B the
core's own kernels on its arrays: not API (see there).
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends import compiled, reference
from svattn.exact.core.state import SlotState
from svattn.exact.operations import scoring
from svattn.exact.records.signing import tag_hashes


class MemoryView:
    """Read-only access to a memory's token ids, support and solver counters.

    Get one from :attr:`SVDDMemory.view <svattn.exact.memory.SVDDMemory.view>`; it
    follows the memory (each read sees the memory as it is then).

    Parameters
    ----------
    ss : SlotState
        The memory's solver state (read only).
    tag_key : bytes or None
        The memory's tag key, under which :meth:`n_tagged` hashes a tag.

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.5)
    >>> ids = mem.extend(np.eye(3))
    >>> _ = mem.remove(ids[0])
    >>> view = mem.view
    >>> view.next_id, view.holds(ids[0]), view.holds(ids[1])
    (3, False, True)
    >>> view.key_of(ids[1])
    array([0., 1., 0.])
    """

    __slots__ = ("_ss", "_tag_key")

    def __init__(self, ss: SlotState, tag_key: bytes | None) -> None:
        self._ss = ss
        self._tag_key = tag_key

    def __repr__(self) -> str:
        return f"MemoryView(n={self._ss.n}, next_id={self._ss.next_id})"

    # ---------------------------------------------------------------- ids
    @property
    def next_id(self) -> int:
        """The id the next added token gets (ids are never reused: every id below it
        was given once, held or removed since)."""
        return int(self._ss.next_id)

    @property
    def n_compacted(self) -> int:
        """Tokens :meth:`~svattn.exact.memory.SVDDMemory.compact` has dropped so far
        (-1: a state loaded from a file format that did not record it)."""
        return int(self._ss.n_compacted)

    @property
    def commit_key_id(self) -> str | None:
        """The public name of the controller's key the commitments and tags are under
        (None: the memory has been under no key)."""
        return self._ss.commit_key_id

    def holds(self, token_id: int) -> bool:
        """True when ``token_id`` is a live token of the memory (O(1)).

        Parameters
        ----------
        token_id : int
            Any int (numpy ints too); one that is not a held id gives False.

        Returns
        -------
        bool
        """
        return token_id in self._ss.id_to_slot

    def key_of(self, token_id: int) -> np.ndarray:
        """The key of the live token ``token_id``, shape (d,) (a copy).

        Parameters
        ----------
        token_id : int
            A held id.

        Returns
        -------
        np.ndarray

        Raises
        ------
        KeyError
            ``token_id`` is not held.
        """
        slot = self._ss.id_to_slot.get(int(token_id))
        if slot is None:
            raise KeyError(f"token_id {token_id} is not held by the memory")
        return self._ss.X[slot].copy()

    def live_commitments(self) -> set[str]:
        """The commitments (hex) of the live tokens: a removed token's certificate names
        one that must not be among them.

        Returns
        -------
        set of str
        """
        ss = self._ss
        return {ss.commitments[s].tobytes().hex() for s in ss.ordered_slots()}

    def n_tagged(self, tag: str) -> int:
        """How many live tokens carry ``tag`` (what :meth:`~svattn.exact.memory.
        SVDDMemory.erase` of it would remove), the tag hashed under the memory's key.

        Parameters
        ----------
        tag : str

        Returns
        -------
        int
        """
        return len(self._ss.tagged_slots(tag_hashes([tag], 1, self._tag_key)[0]))

    # ------------------------------------------------------------ solution
    @property
    def n_margin(self) -> int:
        """Size of the margin set ``|S|`` as the solver keeps it (0 in warm-up until the
        threshold's batch solve)."""
        return int(self._ss.nS)

    def margin_ids(self) -> list[int]:
        """Ids of the margin set in the bordered system's column order (the order the
        solver adds and drops them; :meth:`~svattn.exact.memory.SVDDMemory.partition`
        lists them in id order).

        Returns
        -------
        list of int
        """
        ss = self._ss
        return [int(i) for i in ss.slot_id[ss.margin_slots()]]

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tokens with ``alpha > 0`` in id order: ``(ids, keys, alpha)`` (copies), in
        O(|support|), not O(n) (all live tokens in warm-up).

        Returns
        -------
        ids : np.ndarray of int64, shape (m,)
        keys : np.ndarray, shape (m, d)
        alpha : np.ndarray, shape (m,)
        """
        ss = self._ss
        slots = ss.cached_support_slots()
        slots = slots[np.argsort(ss.slot_id[slots], kind="stable")]
        return ss.slot_id[slots].astype(np.int64), ss.X[slots].copy(), ss.alpha[slots].copy()

    def mu_interval(self) -> tuple[float, float]:
        """The optimal values of ``mu``, ``(low, high)``: one point unless the margin set
        is empty (see :func:`svattn.exact.operations.scoring.mu_interval`).

        Returns
        -------
        tuple of float
        """
        return scoring.mu_interval(self._ss)

    def kkt_residual_all_columns(self) -> float:
        """The KKT residual with ``g`` recomputed by the numpy reference from every
        cached kernel column (not the kept error sum), checked by the compiled backend:
        an independent cross-check of :meth:`~svattn.exact.memory.SVDDMemory.kkt_residual`.

        Returns
        -------
        float
        """
        ss = self._ss
        return compiled.kkt(ss, reference.g_exact(ss))

    # ------------------------------------------------------------ counters
    def counters(self) -> dict[str, int]:
        """The solver's counters: ``n_block_passes`` (passes over the margin block by
        removals), ``n_jumps`` (removals finished on a working set, checked by a pass),
        ``n_jump_fallbacks`` (removals the working set left to the path),
        ``n_segment_fallbacks``, ``n_refactorizations``, ``n_resolves``.

        Returns
        -------
        dict of str to int
        """
        ss = self._ss
        return {name: int(getattr(ss, name)) for name in (
            "n_block_passes", "n_jumps", "n_jump_fallbacks", "n_segment_fallbacks",
            "n_refactorizations", "n_resolves")}

    @property
    def has_kept_factor(self) -> bool:
        """True while a removal may start from a kept Cholesky factor of ``K_SS`` (see
        :mod:`svattn.exact.backends.compiled`)."""
        return self._ss.pd_factor is not None

    @property
    def state_nbytes(self) -> int:
        """Bytes of the numpy buffers the solver state holds (its memory footprint,
        allocated capacity included)."""
        return sum(v.nbytes for v in vars(self._ss).values() if isinstance(v, np.ndarray))

    @property
    def kernel_cache_nbytes(self) -> int:
        """Bytes of the kernel cache's buffer (its allocated capacity: slots × cache
        columns), part of :attr:`state_nbytes`."""
        return int(self._ss.KC.nbytes)


def instrument(mem) -> SlotState:
    """The memory's solver state itself, for the benchmarks that time the core's own
    kernels on its arrays or A/B a solver setting (``benchmarks/bench_stream_speed.py``'s
    floors, ``ab_jumps.py``, ``bench_erase.py``'s checkpoint cost, ``profile_removal.py``).

    Not API: what it holds changes with the solver, and writing to it voids every
    guarantee of the memory. ``tests/test_architecture.py`` lists the modules allowed to
    call it; everything else reads :class:`MemoryView`.

    Parameters
    ----------
    mem : SVDDMemory

    Returns
    -------
    SlotState
    """
    return mem.solver_state


__all__ = ["MemoryView", "instrument"]
