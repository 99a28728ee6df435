"""The exact SV memory: incremental and decremental SVDD (Cauwenberghs–Poggio).

The memory keeps the optimum of the SVDD dual (``docs/design.md`` §1-2)

    minimize   alpha^T K alpha − diag(K)^T alpha
    subject to sum(alpha) = 1,  0 <= alpha_i <= C

over the tokens it holds, exactly, after every ``add`` and ``remove``. Each
operation drives one coefficient adiabatically (up on add, down to 0 on
remove) while the margin coefficients and ``mu`` follow the KKT conditions;
the inverse of the bordered matrix ``Q = [[0, 1^T], [1, 2 K_SS]]`` is kept by
rank-one expansions and contractions.

This module is the public face: input validation (:mod:`svattn.exact.operations.validation`),
the operations' orchestration, certificates, digests and the hooks of the audit
log and the health monitor. The solver state is one
:class:`~svattn.exact.core.state.SlotState`; the algorithm is
:mod:`svattn.exact.operations.solver` over one of two backends with the same function
names, the numba-compiled :mod:`svattn.exact.backends.compiled` (default) and the numpy
:mod:`svattn.exact.backends.reference`.

Conventions (see :mod:`svattn.exact.core.conventions`, ``docs/design.md`` §3): while
``n·C < 1`` the memory is in *warm-up* with uniform ``alpha = 1/n``; at
``n = warmup_threshold(C)`` it solves the token set in batch and is incremental
from then on. When the margin set is empty ``mu`` is the largest optimal value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from svattn.exact import fastpath
from svattn.exact.backends import compiled, reference
from svattn.exact.core.cache import refactorize
from svattn.exact.core.errors import MarginSystem, OperationError, UnknownTokenError
from svattn.exact.core.kktsets import RESERVE, SET_NAMES
from svattn.exact.core.state import SlotState, check_parameters
from svattn.exact.operations import ingest, scoring, solver
from svattn.exact.operations.health import HealthMonitor, HealthReading, reading_first
from svattn.exact.operations.rollback import atomic
from svattn.exact.operations.validation import check_queries, check_rows, plain_row
from svattn.exact.records import fileformat, pickled, schema
from svattn.exact.records.audit import AuditFacts, AuditLog, AuditLogError
from svattn.exact.records.certificate import (
    KEYED,
    OPAQUE,
    DeletionCertificate,
    ErasureReceipt,
    commit_tokens,
    commitment_key,
)
from svattn.exact.records.certificate import commitment_key_id as key_id
from svattn.exact.records.fileformat import SavedNotDurable
from svattn.exact.records.signing import (
    check_key_id,
    no_tag_reason,
    resolve_tag_key,
    sign,
    subject_hash,
    tag_hashes,
)
from svattn.exact.records.signing import signing_key as as_signing_key
from svattn.exact.view import MemoryView

BACKENDS = {"compiled": compiled, "reference": reference}


class SVDDMemory:
    """Exact SVDD memory with incremental add and decremental (exact) removal.

    Parameters
    ----------
    C : float
        Box bound on each coefficient, ``0 < alpha_i <= C``; above 1 it never binds
        and is kept as 1. At least ``ceil(1/C)`` tokens carry weight; the problem is
        feasible from ``n·C >= 1`` on (warm-up below, see module docs).
    kernel : {"rbf", "exp"}
        ``rbf``: exp(−gamma‖x−y‖²); ``exp``: exp(gamma x·y).
    gamma : float, optional
        Kernel bandwidth; default ``1/d`` (rbf) or ``1/sqrt(d)`` (exp), with d
        fixed by the first key.
    tol : float
        KKT tolerance, in units of the largest kernel diagonal (1 for rbf).
        After each operation the residual is checked; above ``tol`` the
        bordered inverse is refactorized, then the set re-solved.
    audit_log : path, optional
        Append-only, hash-chained log of every operation (see
        :mod:`svattn.exact.records.audit`).
    standby : int
        How many reserve tokens nearest the boundary keep a cached kernel
        column, refreshed after adds, so that a removal which brings one of
        them into the margin set does not compute its column (0: none). Costs
        ``standby`` columns of memory and a little ingest time; results are
        unchanged.
    backend : {"compiled", "reference"}
        The solver's loops: numba-compiled (default), or the numpy reference
        (slow, obviously correct; equal up to summation order, for tests and
        for checking the compiled one).
    signing_key : Ed25519PrivateKey or path, optional
        The controller's key (a PEM file, ``svattn keygen``): every deletion
        certificate is then signed (:mod:`svattn.exact.records.signing`). Never saved,
        logged or pickled with the memory.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> mem = SVDDMemory(C=0.1)
    >>> ids = mem.extend(rng.normal(size=(200, 4)))
    >>> cert = mem.remove(ids[0])
    >>> mem.kkt_residual() < 1e-10
    True
    >>> sorted(mem.partition())
    ['error', 'margin', 'reserve']
    """

    def __init__(
        self, C: float, kernel: str = "rbf", gamma: float | None = None, *, tol: float = 1e-10,
        audit_log: str | os.PathLike[str] | None = None, standby: int = 16,
        backend: str = "compiled", signing_key=None, tag_key: bytes | None = None,
    ) -> None:
        check_parameters(C, kernel, gamma, tol, standby)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        key = None if signing_key is None else as_signing_key(signing_key)
        self._init_state(SlotState.new(C=min(C, 1.0), kernel=kernel, gamma=gamma, tol=tol,
                                       standby=standby, compiled=backend == "compiled"))
        self._signing_key = key
        self._tag_key = resolve_tag_key(tag_key, key)
        self._commit_key = commitment_key(self._tag_key)
        if audit_log is not None:
            self._audit = AuditLog.create(audit_log, {"C": self.C, "kernel": self.kernel,
                                                      "gamma": self.gamma, "tol": self.tol},
                                          self._audit_facts(), key)

    def _init_state(self, ss: SlotState) -> None:
        self._s = ss
        self._be = compiled if ss.compiled else reference
        self._health = HealthMonitor()
        self._audit: AuditLog | None = None
        self._signing_key = self._tag_key = self._commit_key = None

    def __getstate__(self) -> dict:
        # pickle and deepcopy: the backend is a module (restored from the state's flag),
        # the health monitor holds a weak reference (kept as its dict), the log's descriptor
        # is this memory's alone, the keys are the controller's secrets; no cache (pickled)
        state = {k: v for k, v in vars(self).items() if k not in (
            "_be", "_health", "_audit", "_signing_key", "_tag_key", "_commit_key")}
        state["_health"] = self._health.to_dict(self._s.Qinv)
        state["_s"] = pickled.pack(self._s, self.state_digest())
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        health = state.pop("_health")
        state["_s"] = pickled.unpack(state["_s"])  # (rebuilt and checked)
        vars(self).update(state)
        self._be = compiled if self._s.compiled else reference
        self._health = HealthMonitor()
        self._health.restore(health, self._s.Qinv)
        self._audit = None
        self._signing_key = self._tag_key = self._commit_key = None
        self._be.ready_for_removals(self._s)  # (caches a fit leaves: not pickled, built)

    _ingest_path = "incremental"  # the last add's AddOutcome.path (until one: the default)
    C = property(lambda self: self._s.C, doc="Box bound on each coefficient.")
    kernel = property(lambda self: self._s.kernel, doc='"rbf" or "exp".')
    gamma = property(lambda self: self._s.gamma, doc="The bandwidth given (None: default).")
    tol = property(lambda self: self._s.tol, doc="KKT tolerance (units of the largest K_ii).")
    standby = property(lambda self: self._s.standby, doc="Standby columns kept (see class).")
    warmup_n = property(lambda self: self._s.warmup_n, doc="First n at which n·C >= 1.")
    n_refactorizations = property(lambda self: self._s.n_refactorizations,
                                  doc="Bordered-inverse refactorizations so far.")
    n_resolves = property(lambda self: self._s.n_resolves,
                          doc="Batch re-solves after a degenerate incremental step.")
    view = property(lambda self: MemoryView(self._s, self._tag_key),
                    doc="Read-only ids, support, counters (:class:`.view.MemoryView`).")

    @property
    def ingest_path(self) -> str:
        """How the last :meth:`add` / :meth:`extend` solved its rows: ``"incremental"``
        (one by one, driven in; the warm-up threshold's batch solve) or
        ``"libsvm+exact"`` (a block much larger than the memory, rbf: libsvm's
        one-class SVM as a warm start, then an exact float64 active-set finish).
        Both reach the same optimum."""
        return self._ingest_path

    @property
    def backend(self) -> str:
        """``"compiled"`` or ``"reference"`` (fixed at construction)."""
        return self._be.NAME

    @property
    def health(self) -> HealthMonitor:
        """The numerical-health monitor of the bordered inverse (see :mod:`.health`)."""
        return self._health

    @property
    def solver_state(self) -> SlotState:
        """The solver state itself, for :mod:`svattn.exact`, its tests and persistence;
        consumers read :attr:`view`. Writing to it voids every guarantee of this class.
        """
        return self._s

    @property
    def gamma_value(self) -> float:
        """The kernel bandwidth in use (the default once the first key fixed d)."""
        return self._s.gamma_value

    def add(self, key, value=None, *, tag: str | None = None) -> int:
        """Add one token; return its id (ids are never reused).

        Parameters
        ----------
        key : array_like, shape (d,)
        value : array_like, shape (dv,), optional
            Defaults to the key itself (then every token must come without a value).
        tag : str, optional
            The data subject it belongs to (:meth:`erase` removes them all); kept only
            as a keyed hash (needs ``signing_key`` or ``tag_key``).

        Examples
        --------
        >>> mem = SVDDMemory(C=0.5)
        >>> mem.add([0.0, 1.0]), mem.add([1.0, 0.0])
        (0, 1)
        """
        k, v = plain_row(self._s, key, value) or check_rows(self._s, key, value, batch=False)
        hashes = tag_hashes(None if tag is None else [tag], 1, self._tag_key)
        return self._add(k, v, hashes, "add")[0]

    def extend(self, keys, values=None, *, tags=None) -> list[int]:
        """Add rows in order, exactly as repeated :meth:`add`; all-or-nothing validation.
        ``tags``: one data-subject tag (str or None) per row.

        With the rbf kernel an empty memory's first block of 64 rows and more, or one of
        512 and twice the tokens held, is solved in one batch (libsvm's solution as the
        warm start, then an exact float64 finish; :attr:`ingest_path` says which path
        ran): the same optimum to rounding, the ids and hashes as one by one.

        Examples
        --------
        >>> import numpy as np
        >>> mem = SVDDMemory(C=0.25)
        >>> mem.extend(np.eye(4))
        [0, 1, 2, 3]
        """
        k, v = check_rows(self._s, keys, values, batch=True)
        return self._add(k, v, tag_hashes(tags, len(k), self._tag_key), "extend")

    def _add(self, k, v, hashes: list, op: str) -> list[int]:
        self._audit_ready()
        self._s.bind_commit_key(key_id(self._commit_key))
        ss, keyed = self._s, self._commit_key is not None
        if len(k) == 1 and (not ss.nS or self._health.checked(ss.Qinv)):  # (fastpath)
            with self._atomic(op, light=True):  # into the reserve: only its slot changes
                stored = fastpath.store_reserve(ss, self._be, k, v, hashes, self._commit_key)
                if stored is not None:
                    self._after_op(op, ids=[stored[0]], commitments=[stored[1]], tags=hashes)
            if stored is not None:
                self._ingest_path = "incremental"
                return [stored[0]]
        commits = commit_tokens(k, v, self._commit_key)
        with self._atomic(op):
            out = ingest.add_rows(ss, self._be, k, v)
            fastpath.mark_tokens(ss, out.ids, hashes, commits, keyed)
            solver.standby_upkeep(ss, self._be, out.ids)
            self._after_op(op, ids=out.ids, commitments=commits, tags=hashes)
        self._ingest_path = out.path
        return out.ids

    def _atomic(self, op: str, wiped=(), light: bool = False):
        """The operation's body runs whole or not at all
        (:mod:`svattn.exact.operations.rollback`)."""
        return atomic(self._s, self._health, self._audit, op, wiped=wiped, light=light,
                      passthrough=(AuditLogError, OperationError, UnknownTokenError))

    def erase(self, tag: str | None = None, *, tag_hash: str | None = None) -> ErasureReceipt:
        """Erase a data subject: remove every live token carrying ``tag``, each exactly,
        and issue one receipt for the request (signed with the memory's key). With an
        audit log, the subject's data then leaves the log too (its openings are pruned:
        :mod:`svattn.exact.records.audit`).

        The receipt lists, per erased token, the live tokens of *other* subjects (or
        untagged) holding the same key and value: that data is theirs and stays.
        ``tag_hash`` (hex, as a receipt or the log names the subject) in place of
        ``tag`` erases by the keyed hash (what recovery replays).

        Raises
        ------
        UnknownTokenError
            No live token carries ``tag`` (nothing changes).
        ValueError
            Not exactly one of ``tag`` and ``tag_hash``, or a malformed ``tag_hash``.
        """
        ss = self._s
        th = subject_hash(tag, tag_hash, self._tag_key)
        if not len(slots := ss.tagged_slots(th)):
            raise UnknownTokenError(no_tag_reason(ss))
        ids = [int(ss.slot_id[s]) for s in slots]
        kept = ss.copies_outside(slots)
        self._audit_ready()
        with self._atomic("erase", wiped=slots):
            certs = [self.remove(t) for t in ids]
            receipt = ErasureReceipt(
                tag_hash=th.hex(), erased_ids=ids, certificates=[asdict(c) for c in certs],
                copies_kept={str(t): c for t, c in kept.items() if c},
                state_digest=self.state_digest(), n_after=len(self))
            if self._signing_key is not None:
                receipt = sign(receipt, self._signing_key)
            if self._audit is not None:
                self._audit.record(self._audit_facts(), "erase", receipt=receipt)
        if self._audit is not None:  # the erase is durable: its subject leaves the log too
            self._audit.prune_pending()
        return receipt

    def remove(self, token_id: int) -> DeletionCertificate:
        """Remove a token exactly and return the deletion certificate.

        The state afterwards is the state of never having added the token (up to
        rounding; the certificate says whether the optimum is unique).

        Raises
        ------
        UnknownTokenError
            If the id was never added or is already removed (state unchanged).
        """
        ss = self._s
        slot = self._slot_for(token_id)
        self._audit_ready()
        before = solver.set_sizes(self._s, self._be)
        commitment = ss.commitments[slot].tobytes().hex()
        scheme = KEYED if ss.commit_keyed[slot] == 1 else OPAQUE
        copies = ss.copies_outside(np.array([slot]))[int(token_id)]
        with self._atomic("remove", wiped=[slot]):
            outcome = solver.remove_slot(ss, self._be, slot)
            after, kkt, unique, digest = solver.certificate_facts(ss, self._be, outcome)
            # exactness is claimed only for a unique optimum met to tol: near-copies of
            # keys (kernel distances near rounding) can leave the KKT residual above tol
            unique = unique and kkt <= self._s.tol
            cert = DeletionCertificate.issue(
                removed_id=int(token_id), commitment=commitment, commitment_scheme=scheme,
                live_copies=copies,
                partition_before=before, partition_after=after, kkt_residual_after=kkt,
                n_events=outcome.events, unique_optimum=unique, state_digest=digest, C=self.C,
                kernel=self.kernel, gamma=ss.gamma_value, compacted=ss.n_compacted,
            )
            if self._signing_key is not None:
                cert = sign(cert, self._signing_key)
            self._after_op("remove", measured=outcome.health, certificate=cert)
        return cert

    def remove_many(self, token_ids: Iterable[int]) -> list[DeletionCertificate]:
        """Remove several tokens (each exactly), after checking every id first."""
        ids = list(token_ids)
        seen = set()
        for t in ids:
            self._slot_for(t)
            if t in seen:
                raise ValueError(f"token_ids lists id {t} twice")
            seen.add(t)
        if len(ids) == 1:  # one removal is atomic itself (no second checkpoint around it)
            return [self.remove(ids[0])]
        with self._atomic("remove_many", wiped=[self._s.id_to_slot[t] for t in ids]):
            return [self.remove(t) for t in ids]

    def compact(self) -> list[int]:
        """Certified selection: drop every reserve token; return their ids.

        Reserve tokens have alpha = 0 exactly, so the readout is unchanged for
        every query (the KKT residual certifies the partition). The trade: a later
        removal is exact relative to the tokens kept, no longer to the whole stream
        (a dropped token might have re-entered the support); every certificate says
        how many tokens compaction dropped before it (``compacted``).
        """
        ss = self._s
        if ss.warm:
            return []
        self._audit_ready()
        reserve = ss.slots_in({RESERVE})
        dropped = [int(ss.slot_id[s]) for s in reserve]
        with self._atomic("compact", wiped=reserve):
            for t in dropped:
                solver.wipe_slot(ss, self._be, ss.id_to_slot[t])
            if ss.n_compacted >= 0:  # -1 stays "unknown"
                ss.n_compacted += len(dropped)
            if dropped and not ss.nS:
                solver.canonical_mu(ss, self._be)
            self._after_op("compact", dropped=sorted(dropped))
        return sorted(dropped)

    def copy(self, *, backend: str | None = None) -> SVDDMemory:
        """An independent memory in the same state (no audit log, no keys: a keyed copy
        refuses adds), optionally on the other backend; on the same one, bit-identical.

        Examples
        --------
        >>> import numpy as np
        >>> mem = SVDDMemory(C=0.2)
        >>> _ = mem.extend(np.random.default_rng(0).normal(size=(20, 2)))
        >>> twin = mem.copy(backend="reference")
        >>> twin.backend, twin.state_digest() == mem.state_digest()
        ('reference', True)
        """
        name = self.backend if backend is None else backend
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {name!r}")
        ss = self._s.copy()
        ss.compiled = name == "compiled"
        twin = type(self).__new__(type(self))
        twin._init_state(ss)
        twin._health.restore(self._health.to_dict(self._s.Qinv), ss.Qinv)
        twin._ingest_path = self._ingest_path
        return twin

    def save(self, path: str | os.PathLike[str], *, before_commit=None) -> str:
        """Save atomically to a safetensors file; return the file's SHA-256 (tensors:
        :func:`~svattn.exact.records.schema.to_tensors`; metadata: digest, health, KKT
        residual, audit head). The old file stays whole if anything fails or the process
        dies, and is zeroed once the new one is durable; ``before_commit(sha256)``, when
        given, runs just before the rename (if it raises, nothing is saved)."""
        self._audit_ready()
        ss = self._s
        t, fields = schema.to_tensors(ss)
        meta = {**fields, "kkt_residual": self._residual(), "state_digest": self.state_digest(),
                "health": self._health.to_dict(ss.Qinv),
                "audit_head": self._audit.head() if self._audit is not None else None}
        data = fileformat.state_file_bytes(t, meta)
        path, digest, log = Path(path), fileformat.sha256_hex(data), self._audit
        mark = None if log is None else log.mark()
        steps = [] if before_commit is None else [lambda: before_commit(digest)]
        steps += [] if log is None else [lambda: log.record_save(self._audit_facts(), path, digest)]
        try:  # logged before the rename: a failed record leaves the old file, and the log
            fileformat.write_atomic(path, data, before_rename=lambda: [f() for f in steps])
        except SavedNotDurable:  # renamed: the file and its record agree, both stay
            raise
        except BaseException:
            if log is not None:
                log.rollback(mark)
            raise
        return digest

    @classmethod
    def load(cls, path: str | os.PathLike[str], *,
             audit_log: str | os.PathLike[str] | None = None, signing_key=None,
             tag_key: bytes | None = None) -> SVDDMemory:
        """Load a memory saved by :meth:`save`, verifying everything; a killed save's
        temporary files beside ``path`` are removed.

        Parameters
        ----------
        path : path-like
        audit_log : path-like, optional
            Continue this audit log (it must end at the state being loaded; see
            :meth:`svattn.exact.records.audit.AuditLog.resume`).
        signing_key : Ed25519PrivateKey or path, optional
            Sign the certificates of removals from now on (see the class). It (or
            ``tag_key``) must be the key of the state's tags: another raises ValueError.

        Raises
        ------
        FileNotFoundError
            No such file.
        StateVersionError
            Not an svattn state file, or another format version.
        StateFileError
            Truncated, corrupted or tampered, or alpha not the optimum of its tokens.
        """
        key = None if signing_key is None else as_signing_key(signing_key)
        tag = resolve_tag_key(tag_key, key)
        path, where = Path(path), str(path)
        fileformat.remove_leftovers(path)  # a killed save's temporary files: erased tokens
        data = path.read_bytes()
        t, meta = fileformat.read_state(data, where)
        with fileformat.inconsistent_state(where):
            ss = schema.from_tensors(t, meta, version=meta["format_version"])
        mem = cls.__new__(cls)
        mem._init_state(ss)
        mem._signing_key, mem._tag_key, mem._commit_key = key, tag, commitment_key(tag)
        check_key_id(ss.commit_key_id, key_id(mem._commit_key), where)
        with fileformat.inconsistent_state(where):  # the semantic checks, from the arrays
            fileformat.check_loaded_state(mem._s, mem._be, mem._health, t, meta, where,
                                          digest=mem.state_digest(), residual=mem._residual())
        mem._be.ready_for_removals(mem._s)  # (as after a fit and an unpickle)
        if audit_log is not None:
            mem._audit = AuditLog.resume(audit_log, mem._audit_facts(), state_path=path,
                                         state_sha256=fileformat.sha256_hex(data),
                                         head=meta["audit_head"], signing_key=key)
        return mem

    def attach_audit_log(self, path: str | os.PathLike[str], *,
                         cites: dict | None = None) -> None:
        """Start a new audit log for this memory (a new or empty file): a new chain whose
        ``open`` record carries ``cites`` (e.g. the state and the old log it continues,
        :func:`svattn.exact.auditor.recovery.recover`).

        Raises
        ------
        ValueError
            This memory logs already, or the file has records.
        """
        if self._audit is not None:
            raise ValueError(f"this memory already logs to {self._audit.path}; "
                             "close_audit_log() first")
        params = {"C": self.C, "kernel": self.kernel, "gamma": self.gamma, "tol": self.tol}
        if self._s.n or self._s.next_id or cites is not None:
            # the chain starts from this state: its ids and subjects (never data) seed it
            params["continues"] = {**(cites or {}), "live_ids": self.ids,
                                   "next_id": int(self._s.next_id), "tags": self._s.tags_by_id()}
        self._audit = AuditLog.create(path, params, self._audit_facts(), self._signing_key)

    def close_audit_log(self) -> None:
        """Release this memory's audit log (its lock and descriptor): another memory
        may then continue the log, and this one refuses every further change.
        No-op without a log."""
        if self._audit is not None:
            self._audit.close()

    def _audit_ready(self) -> None:  # (and a memory a failed undo left broken refuses)
        if self._health.broken is not None:
            raise OperationError(f"this memory is broken ({self._health.broken})")
        if self._audit is not None:
            self._audit.ready()

    def _audit_facts(self, *, kkt: bool = False) -> AuditFacts:
        h = self._health
        return AuditFacts(
            digest=self.state_digest(), n=self._s.n, next_id=int(self._s.next_id),
            n_refactorizations=self._s.n_refactorizations, n_resolves=self._s.n_resolves,
            n_drift_refactorizations=h.n_drift_refactorizations, cond1=h.cond1,
            inv_residual=h.inv_residual, kkt_residual=self._residual() if kkt else None)

    def _after_op(self, op: str, measured: HealthReading | None = None, **info) -> None:
        """Health check (``measured``: the operation's own reading), then the audit record."""
        ss = self._s
        events = []
        if ss.nS and not ss.warm:
            measure = reading_first(measured, self._measure_health)
            events = self._health.check(ss.Qinv, measure, self._refactorize)
        ss.release_margin_gram(compiled.trim_factor)  # (only compiled keeps a factor)
        if self._audit is not None:
            self._audit.record(self._audit_facts(kkt=op in ("add", "extend")), op,
                               events=events, **info)

    def _measure_health(self) -> tuple[float, float]:
        return self._be.margin_health(self._s, self._be.margin_gram(self._s))

    def _refactorize(self) -> np.ndarray:
        refactorize(self._s)
        return self._s.Qinv

    def _residual(self) -> float:
        """The KKT residual without refreshing any cached array (pure)."""
        ss = self._s
        if ss.n == 0 or ss.warm:
            return 0.0
        # the full-cache g: the error-sum path would sync (modify) the sum
        g = ss.g[: ss.hi] if ss.g_valid else reference.g_exact(ss)
        return float(self._be.kkt(ss, g))

    # ------------------------------------------------------------ read access
    def __repr__(self) -> str:
        """Parameters and set sizes (never any key or value).

        Examples
        --------
        >>> mem = SVDDMemory(C=0.5)
        >>> _ = mem.extend([[0.0, 1.0], [1.0, 0.0], [2.0, 2.0]])
        >>> head, tail = repr(mem).split("; ")
        >>> head
        "SVDDMemory(C=0.5, kernel='rbf', gamma=None, tol=1e-10, standby=16, backend='compiled'"
        >>> tail  # doctest: +ELLIPSIS
        'n=3, margin=..., error=..., reserve=..., audit_log=None)'
        """
        ss = self._s
        sizes = solver.set_sizes(ss, self._be)
        log = None if self._audit is None else str(self._audit.path)
        return (f"SVDDMemory(C={ss.C!r}, kernel={ss.kernel!r}, gamma={ss.gamma!r}, "
                f"tol={ss.tol!r}, standby={ss.standby}, backend={self.backend!r}; n={ss.n}, "
                f"margin={sizes['margin']}, error={sizes['error']}, reserve={sizes['reserve']}"
                f"{', warm-up' if ss.n and ss.warm else ''}, audit_log={log!r})")

    def __len__(self) -> int:
        return self._s.n

    warm = property(lambda self: self._s.warm,
                    doc="True while ``n·C < 1`` (warm-up convention: uniform alpha).")
    dim = property(lambda self: self._s.dim, doc="Key dimension d (None before the first token).")
    ids = property(lambda self: [int(i) for i in self._s.slot_id[self._s.ordered_slots()]],
                   doc="Live token ids in insertion order.")
    alpha = property(lambda self: self._s.alpha[self._s.ordered_slots()].copy(),
                     doc="Coefficients aligned with :attr:`ids` (float64 copy).")
    keys = property(lambda self: self._s.X[self._s.ordered_slots()].copy(),
                    doc="Keys aligned with :attr:`ids`, shape (n, d).")

    @property
    def values(self) -> np.ndarray:
        """Values aligned with :attr:`ids`, shape (n, dv)."""
        ss = self._s
        return (ss.X if ss.value_is_key else ss.V)[ss.ordered_slots()].copy()

    mu = property(lambda self: float(self._s.mu),
                  doc="Multiplier of ``sum(alpha) = 1`` (``R² − alpha^T K alpha``).")

    def partition(self) -> dict[str, list[int]]:
        """Ids of the margin, error and reserve sets (warm-up: all in margin)."""
        ss = self._s
        out: dict[str, list[int]] = {"margin": [], "error": [], "reserve": []}
        for s in ss.ordered_slots():
            name = "margin" if ss.warm else SET_NAMES[int(ss.state[s])]
            out[name].append(int(ss.slot_id[s]))
        return out

    def support_ids(self) -> list[int]:
        """Ids with alpha > 0 (margin ∪ error): all that the readout uses."""
        return [int(self._s.slot_id[s]) for s in self._s.cached_support_slots()]

    def readout(self, queries) -> np.ndarray:
        """``o(q) = softmax_i(log alpha_i + log k(q, x_i)) · V`` over tokens with alpha > 0.

        Parameters
        ----------
        queries : array_like, shape (m, d) or (d,)

        Returns
        -------
        np.ndarray, shape (m, dv) (or (dv,) for a single query)
        """
        ss = self._s
        q, single = check_queries(ss, queries)
        out = scoring.support_readout(ss, q)  # (its copies of keys and values scrubbed)
        return out[0] if single else out

    def decision_function(self, x) -> np.ndarray:
        """``R² − ‖phi(x) − a‖²``: positive inside the description (sklearn's sign).

        Equals ``2 sum_i alpha_i k(x, x_i) − k(x, x) + mu``.
        """
        ss = self._s
        q, single = check_queries(ss, x)
        out = scoring.support_readout(ss, q, decision=True)
        return out[0] if single else out

    def kkt_residual(self) -> float:
        """Largest violation of the KKT conditions and constraints, with g recomputed
        from the cached kernel columns (not the solver's running updates of g).

        In units of the largest kernel diagonal (1 for rbf). 0 in warm-up, where
        the convention holds exactly.
        """
        if self._s.n == 0 or self._s.warm:
            return 0.0
        return self._be.kkt(self._s, solver.fresh_g(self._s, self._be))

    def unique_optimum(self) -> bool:
        """True when the optimum is unique: K is positive definite on the margin
        set together with every token tied at ``g = 0`` (duplicates break this)."""
        return solver.unique_optimum(self._s, self._be)

    def margin_system(self) -> MarginSystem:
        """The partition, alpha, mu and the bordered inverse (for implicit gradients)."""
        ss = self._s
        part = self.partition()
        return MarginSystem(
            margin=[int(ss.slot_id[s]) for s in ss.margin_slots()] if not ss.warm else [],
            error=part["error"], reserve=part["reserve"], alpha=self.alpha, mu=self.mu,
            Qinv=ss.Qinv.copy() if (ss.nS and not ss.warm) else np.zeros((0, 0)),
        )

    def state_digest(self) -> str:
        """SHA-256 over the parameters, the token set and the solved state.

        The token set enters as a multiset hash (sum of per-token SHA-256 mod 2^256),
        updated in O(1) per add/remove, so digests stay cheap."""
        return solver.state_digest(self._s, self._be)

    def _slot_for(self, token_id) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"token_id must be an int, got {type(token_id).__name__}")
        if self._s.n == 0:
            raise UnknownTokenError(f"cannot remove token {token_id}: the memory is empty")
        slot = self._s.id_to_slot.get(int(token_id))
        if slot is None:
            state = "was removed" if 0 <= token_id < self._s.next_id else "was never added"
            raise UnknownTokenError(f"token_id {token_id} is not in the memory (it {state})")
        return slot


__all__: Sequence[str] = ["BACKENDS", "MarginSystem", "OperationError", "SVDDMemory",
                          "UnknownTokenError"]
