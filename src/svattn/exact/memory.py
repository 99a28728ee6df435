"""The exact SV memory: incremental and decremental SVDD (Cauwenberghs–Poggio).

The memory keeps the optimum of the SVDD dual (DESIGN.md §1–3)

    minimize   alpha^T K alpha − diag(K)^T alpha
    subject to sum(alpha) = 1,  0 <= alpha_i <= C

over the tokens it holds, exactly, after every ``add`` and ``remove``. Each
operation drives one coefficient adiabatically (up on add, down to 0 on
remove) while the margin coefficients and ``mu`` follow the KKT conditions;
the inverse of the bordered matrix ``Q = [[0, 1^T], [1, 2 K_SS]]`` is kept by
rank-one expansions and contractions.

Storage is slot based: a removed token's slot is wiped (zeros) and reused, ids
are never reused, and kernel columns are cached only for margin and error
tokens (the n×n Gram matrix is never built on the hot path).

Conventions (see :mod:`svattn.exact.conventions`): while ``n·C < 1`` the memory
is in *warm-up* with uniform ``alpha = 1/n``; at ``n = warmup_threshold(C)`` it
solves the token set in batch and is incremental from then on. When the
margin set is empty ``mu`` is the largest optimal value.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from svattn.exact import _compiled
from svattn.exact._states import DRIVEN, ERROR, FREE, MARGIN, RESERVE
from svattn.exact.batch import batch_solve
from svattn.exact.certificate import DeletionCertificate, commit_token
from svattn.exact.conventions import mu_for_empty_margin, warmup_threshold
from svattn.exact.kernels import (
    _LOG_MAX,
    KernelOverflowError,
    biased_softmax_readout,
    check_kernel,
    decision_values,
    default_gamma,
    gram_matrix,
    kernel_diag,
    kernel_matrix,
)

# per state: the sign that turns g into a KKT violation (margin handled apart)
_KKT_SIGN = np.array([0.0, -1.0, 0.0, 1.0, 0.0])
_SET_NAMES = {RESERVE: "reserve", MARGIN: "margin", ERROR: "error"}
_DIGEST_MOD = 1 << 256


class UnknownTokenError(KeyError, ValueError):
    """A token id that the memory does not hold (never added, or removed)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class _NeedResolve(Exception):
    """Internal: an incremental step met a degeneracy; re-solve the set exactly."""


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


class SVDDMemory:
    """Exact SVDD memory with incremental add and decremental (exact) removal.

    Parameters
    ----------
    C : float
        Box bound on each coefficient, ``0 < alpha_i <= C``. At least
        ``ceil(1/C)`` tokens carry weight; the problem is feasible from
        ``n·C >= 1`` on (warm-up below, see module docs).
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
        :mod:`svattn.exact.audit`).
    standby : int
        How many reserve tokens nearest the boundary keep a cached kernel
        column, refreshed after adds, so that a removal which brings one of
        them into the margin set does not compute its column (0: none). Costs
        ``standby`` columns of memory and a little ingest time; results are
        unchanged.

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
    ) -> None:
        if isinstance(C, bool) or not isinstance(C, (int, float, np.floating, np.integer)):
            raise TypeError(f"C must be a positive real number, got {type(C).__name__}")
        if not (math.isfinite(C) and C > 0):
            raise ValueError(f"C must be a finite number > 0, got {C!r}")
        check_kernel(kernel)
        if gamma is not None and not (math.isfinite(gamma) and gamma > 0):
            raise ValueError(f"gamma must be None or a finite number > 0, got {gamma!r}")
        if not (math.isfinite(tol) and tol > 0):
            raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
        if isinstance(standby, bool) or not isinstance(standby, (int, np.integer)) or standby < 0:
            raise ValueError(f"standby must be an int >= 0, got {standby!r}")
        self.C = float(C)
        self.kernel = kernel
        self.gamma = None if gamma is None else float(gamma)
        self.tol = float(tol)
        self.standby = int(standby)
        self.warmup_n = warmup_threshold(self.C)
        # health counters (reported by the audit log and benchmarks)
        self.n_refactorizations = 0
        self.n_resolves = 0
        self._n_segment_fallbacks = 0  # removals the segment loop left to the event loop
        self._n_block_passes = 0  # passes over the margin block by removals (segments, jumps)
        self._n_jumps = 0  # removals finished by an active-set step
        self._n_jump_fallbacks = 0  # removals whose steps did not converge (path went on)
        self._dim: int | None = None
        self._vdim: int | None = None
        self._value_is_key = True
        self._alloc(0, 0, 0)
        from svattn.exact.health import HealthMonitor  # persistence / audit: see persist.py

        self._health = HealthMonitor()
        self._audit = None
        if audit_log is not None:
            from svattn.exact.audit import AuditLog

            self._audit = AuditLog.create(audit_log, self)

    # ------------------------------------------------------------------ storage
    def _alloc(self, cap: int, d: int, dv: int) -> None:
        self._cap = cap
        self._X = np.zeros((cap, d))
        self._V = np.zeros((cap, dv))
        self._diag = np.zeros(cap)
        self._slot_id = np.full(cap, -1, dtype=np.int64)
        self._alpha = np.zeros(cap)
        self._g = np.zeros(cap)
        self._state = np.zeros(cap, dtype=np.int8)
        self._col_of_slot = np.full(cap, -1, dtype=np.int64)
        self._token_hash = np.zeros(cap, dtype=object)
        self._free_slots: list[int] = []
        self._hi = 0  # slots [0, hi) have been used
        self._id_to_slot: dict[int, int] = {}
        self._next_id = 0
        self._n = 0
        # kernel cache: one column per margin / error / driven token
        self._ccap = 0
        # column-major: column moves, writes and margin-block products are contiguous
        self._KC = np.zeros((cap, 0), order="F")
        self._xn2 = np.zeros(cap)  # ‖x‖² per slot (rbf columns without re-reading norms)
        self._XC = np.zeros((0, d))
        self._slot_of_col = np.full(0, -1, dtype=np.int64)
        self._chi = 0
        self._ac = np.zeros(0)  # alpha per cached column (0 for free columns)
        # Margin tokens occupy cache columns [0, nS), in the order of Qinv rows
        # 1..nS, so the margin block is one contiguous matrix slice.
        self._nS = 0
        self._Qinv = np.zeros((0, 0))
        self._mu = 0.0
        self._g_valid = True  # g[:hi] is exact (see _fresh_g)
        self._ops_since_exact_g = 0
        # error-column sum (see _compiled.error_sum_sync): per slot, the sum of
        # the error tokens' kernel values; ``_esum_member`` marks whom it sums
        self._esum = np.zeros(cap)
        self._esum_member = np.zeros(cap, dtype=np.bool_)
        self._esum_valid = False
        self._esum_updates = 0  # columns added/subtracted since the last rebuild
        # The margin Gram block as the last margin solve left it (see _margin_gram):
        # valid while ``_kss_for`` is the current Qinv object; zeroed after every
        # operation (``_kss_ext`` rows and columns were written).
        self._kss = np.zeros((0, 0))
        self._kss_for: np.ndarray | None = None
        self._kss_ext = 0
        self._set_hash = 0  # sum of per-token hashes mod 2^256 (a multiset hash)
        self._kkt_after: float | None = None  # see _certificate_facts
        self._facts_after: tuple | None = None  # (sizes, unique, ids, values), idem
        # (Qinv, cond1, inverse residual) a removal measured for its final Qinv
        self._health_after: tuple | None = None
        # standby columns (see _refresh_standby): chosen for the solution as it was
        # when _standby_theta, the largest g among them, was taken
        self._standby_stale = True
        self._standby_theta = math.inf

    def _grow_slots(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = max(need, 2 * self._cap, 16)
        extra = cap - self._cap

        def pad(a: np.ndarray, fill) -> np.ndarray:
            shape = (extra,) + a.shape[1:]
            out = np.concatenate([a, np.full(shape, fill, dtype=a.dtype)])
            _scrub(a)  # the old buffer goes back to the allocator holding no data
            return out

        self._X = pad(self._X, 0.0)
        self._V = pad(self._V, 0.0)
        self._diag = pad(self._diag, 0.0)
        self._slot_id = pad(self._slot_id, -1)
        self._alpha = pad(self._alpha, 0.0)
        self._g = pad(self._g, 0.0)
        self._state = pad(self._state, FREE)
        self._col_of_slot = pad(self._col_of_slot, -1)
        self._token_hash = pad(self._token_hash, 0)
        self._xn2 = pad(self._xn2, 0.0)
        self._esum = pad(self._esum, 0.0)
        self._esum_member = pad(self._esum_member, False)
        KC = np.zeros((cap, self._ccap), order="F")
        KC[: self._cap] = self._KC
        _scrub(self._KC)
        self._KC = KC
        self._cap = cap

    def _grow_cols(self) -> None:
        ccap = max(2 * self._ccap, 8)
        KC = np.zeros((self._cap, ccap), order="F")
        KC[:, : self._ccap] = self._KC
        XC = np.zeros((ccap, self._X.shape[1]))
        XC[: self._ccap] = self._XC
        soc = np.full(ccap, -1, dtype=np.int64)
        soc[: self._ccap] = self._slot_of_col
        ac = np.zeros(ccap)
        ac[: self._ccap] = self._ac
        for old in (self._KC, self._XC, self._ac):
            _scrub(old)
        self._KC, self._XC, self._slot_of_col, self._ac, self._ccap = KC, XC, soc, ac, ccap

    def _alloc_col(self, slot: int) -> int:
        """Cache the kernel column of ``slot`` over every used slot (outside the margin
        block): in a hole, past the used columns, in place of a standby column (the
        compiled loop's order), or in a grown cache."""
        if self._compiled:
            if not _compiled._free_column_available(self._slot_of_col, self._state, self._nS,
                                                    self._chi, self._ccap):
                self._grow_cols()
            self._chi = int(_compiled._alloc_col(
                self._KC, self._XC, self._ac, self._slot_of_col, self._col_of_slot, self._X,
                self._xn2, self._diag, self._alpha, self._state, slot, self._nS, self._chi,
                self._hi, self._gamma_val, self.kernel == "rbf"))
            return int(self._col_of_slot[slot])
        holes = np.flatnonzero(self._slot_of_col[self._nS : self._chi] < 0)
        soc = self._slot_of_col[self._nS : self._chi]
        standby = np.flatnonzero((soc >= 0) & (self._state[soc] == RESERVE))
        if len(holes):
            col = self._nS + int(holes[0])
        elif self._chi < self._ccap or not len(standby):
            if self._chi == self._ccap:
                self._grow_cols()
            col = self._chi
            self._chi += 1
        else:
            col = self._nS + int(standby[0])
            self._col_of_slot[self._slot_of_col[col]] = -1
        x = self._X[slot]
        hi = self._hi
        column = self._KC[:hi, col]  # a contiguous view: fill it in place
        column[:] = self._X[:hi] @ x
        if self.kernel == "rbf":
            column *= -2.0
            column += self._xn2[:hi]
            column += self._xn2[slot]
            np.maximum(column, 0.0, out=column)
            column *= -self._gamma_val
        else:
            column *= self._gamma_val
        np.exp(column, out=column)
        column[slot] = self._diag[slot]
        self._XC[col] = x
        self._slot_of_col[col] = slot
        self._col_of_slot[slot] = col
        self._ac[col] = self._alpha[slot]
        return col

    def _free_col(self, slot: int) -> None:
        col = int(self._col_of_slot[slot])
        if col < 0:
            return
        assert col >= self._nS, "a margin token's column is freed only after contraction"
        self._KC[:, col] = 0.0
        self._XC[col] = 0.0
        self._slot_of_col[col] = -1
        self._col_of_slot[slot] = -1
        self._ac[col] = 0.0
        while self._chi > 0 and self._slot_of_col[self._chi - 1] < 0:
            self._chi -= 1

    def _swap_cols(self, p: int, q: int) -> None:
        """Exchange two cache columns (contents and bookkeeping)."""
        if p == q:
            return
        hi = self._hi
        KC = self._KC
        KC[:hi, [p, q]] = KC[:hi, [q, p]]
        self._XC[[p, q]] = self._XC[[q, p]]
        self._ac[[p, q]] = self._ac[[q, p]]
        soc = self._slot_of_col
        soc[[p, q]] = soc[[q, p]]
        for col in (p, q):
            if soc[col] >= 0:
                self._col_of_slot[soc[col]] = col

    # ---- standby columns
    def _standby_upkeep(self, ids: list[int]) -> None:
        """After an add: refresh the standby columns when the solution moved or a new
        token lies nearer the boundary than the farthest standby token."""
        if not self.standby or self.warm or self._n == 0:
            return
        if not self._standby_stale:
            slots = np.fromiter((self._id_to_slot[t] for t in ids), np.int64, len(ids))
            new = slots[self._state[slots] == RESERVE]
            if not len(new) or self._g[new].min() >= self._standby_theta:
                return
        self._refresh_standby()

    def _refresh_standby(self) -> None:
        """Cache the kernel columns of the ``standby`` reserve tokens nearest the
        boundary (smallest g) and free those of other reserve tokens.

        A removal brings reserve tokens into the margin set, and each needs its
        kernel column: one pass over every key, the largest single cost of a
        removal at n = 4k. The tokens that enter are almost always among the
        nearest few (at 16, nine in ten of the entries in ``bench_exact``'s
        redundant stream), so keeping their columns moves that pass from the
        removal to the adds before it. Columns are exact kernel values like every
        other cached column; a removed token's row is wiped from them as from the
        rest, and eviction (:meth:`_alloc_col`) only ever drops a standby column.
        """
        self._standby_stale = False
        # g as the operations left it (accurate to rounding; a choice of columns
        # needs no exact g). Hysteresis: the columns of the next k nearest stay
        # (ranks near the k-th swap after most operations).
        k = self.standby
        if self._compiled:
            while True:
                chi, theta, short = _compiled.refresh_standby(
                    self._KC, self._XC, self._ac, self._slot_of_col, self._col_of_slot, self._X,
                    self._xn2, self._diag, self._alpha, self._g, self._state, self._nS,
                    self._chi, self._hi, self._gamma_val, self.kernel == "rbf", k)
                self._chi, self._standby_theta = int(chi), float(theta)
                if not short:
                    return
                self._grow_cols()
        near = self._nearest_reserve(2 * k)
        pick = near[:k]
        self._standby_theta = float(self._g[pick[-1]]) if len(near) > k else math.inf
        for col in range(self._nS, self._chi):
            s = int(self._slot_of_col[col])
            if s >= 0 and self._state[s] == RESERVE and s not in near:
                self._free_col(s)
        for s in pick.tolist():
            if self._col_of_slot[s] < 0:
                if self._chi == self._ccap and (self._slot_of_col[self._nS : self._chi] >= 0).all():
                    self._grow_cols()  # never evict a pick
                self._alloc_col(s)

    def _nearest_reserve(self, m: int) -> np.ndarray:
        """The ``m`` reserve slots with the smallest g, ascending (ties: lower slot first)."""
        hi = self._hi
        if self._compiled:
            out = np.empty(m, dtype=np.int64)
            return out[: _compiled.nearest_reserve(self._g, self._state, hi, out)]
        reserve = np.flatnonzero(self._state[:hi] == RESERVE)
        return reserve[np.argsort(self._g[reserve], kind="stable")[:m]]

    def _margin_slots(self) -> np.ndarray:
        return self._slot_of_col[: self._nS]

    def _wipe_slot(self, slot: int) -> None:
        """Forget a token: overwrite every array entry derived from it (its column
        leaves the error sum while it exists)."""
        if self._compiled:
            chi, change = _compiled.wipe_slot_arrays(
                self._X, self._V, self._KC, self._XC, self._ac, self._slot_of_col,
                self._col_of_slot, self._xn2, self._diag, self._alpha, self._g, self._esum,
                self._esum_member, self._state, slot, self._chi, self._hi, self._esum_valid)
            self._chi = int(chi)
        else:  # the reference of the compiled array work
            change = 0
            if self._esum_member[slot]:
                col = int(self._col_of_slot[slot])
                if col >= 0 and self._esum_valid:
                    self._esum[: self._hi] -= self._KC[: self._hi, col]
                    change = 1
                else:
                    change = -1
                self._esum_member[slot] = False
            self._free_col(slot)
            for a in (self._X, self._V, self._KC, self._xn2, self._diag, self._alpha, self._g,
                      self._esum):
                a[slot] = 0.0
            self._state[slot] = FREE
        if change > 0:
            self._esum_updates += 1
        elif change < 0:
            self._esum_valid = False
        self._forget_slot(slot)

    def _forget_slot(self, slot: int) -> None:
        """The bookkeeping half of a wipe (the arrays are wiped already): the token
        leaves the id map, the set hash and the count; its slot becomes free."""
        self._set_hash = (self._set_hash - int(self._token_hash[slot])) % _DIGEST_MOD
        self._token_hash[slot] = 0
        del self._id_to_slot[int(self._slot_id[slot])]
        self._slot_id[slot] = -1
        self._free_slots.append(slot)
        self._n -= 1

    # --------------------------------------------------------------- validation
    @property
    def _gamma_val(self) -> float:
        assert self._dim is not None
        return self.gamma if self.gamma is not None else default_gamma(self.kernel, self._dim)

    def _check_rows(self, keys, values, *, batch: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Validate keys/values without touching state; return float64 2-D arrays."""
        name_k, name_v = ("keys", "values") if batch else ("key", "value")
        k = np.asarray(keys, dtype=np.float64) if _is_numeric(keys) else None
        if k is None:
            raise TypeError(f"{name_k} must be an array of real numbers")
        if batch:
            if k.ndim != 2:
                raise ValueError(f"keys must be 2-D (n, d), got shape {k.shape}")
        else:
            if k.ndim != 1:
                raise ValueError(f"key must be 1-D (d,), got shape {k.shape}")
            k = k[None, :]
        d = k.shape[1]
        if d == 0:
            raise ValueError(f"{name_k} must have dimension d >= 1, got shape {k.shape}")
        if self._dim is not None and d != self._dim:
            raise ValueError(f"{name_k} must have dimension d={self._dim}, got {d}")
        if not np.isfinite(k).all():
            raise ValueError(f"{name_k} must be finite (no NaN or inf)")
        _check_norms(k, name_k)
        v = None
        if values is not None:
            v = np.asarray(values, dtype=np.float64) if _is_numeric(values) else None
            if v is None:
                raise TypeError(f"{name_v} must be an array of real numbers")
            if not batch:
                if v.ndim != 1:
                    raise ValueError(f"value must be 1-D (dv,), got shape {v.shape}")
                v = v[None, :]
            elif v.ndim != 2:
                raise ValueError(f"values must be 2-D (n, dv), got shape {v.shape}")
            if v.shape[0] != k.shape[0]:
                raise ValueError(
                    f"values must have one row per key: {v.shape[0]} values for {k.shape[0]} keys"
                )
            if self._vdim is not None and (self._value_is_key or v.shape[1] != self._vdim):
                if self._value_is_key:
                    raise ValueError(
                        "this memory stores keys as values (the first token came without a "
                        "value); pass value=None"
                    )
                raise ValueError(f"{name_v} must have dimension dv={self._vdim}, got {v.shape[1]}")
            if not np.isfinite(v).all():
                raise ValueError(f"{name_v} must be finite (no NaN or inf)")
        elif self._vdim is not None and not self._value_is_key:
            raise ValueError(f"{name_v} is required: this memory stores values of dim {self._vdim}")
        if self.kernel == "exp":
            self._check_exp_overflow(k)
        return k, v

    def _check_exp_overflow(self, k: np.ndarray) -> None:
        gamma = self.gamma if self.gamma is not None else default_gamma("exp", k.shape[1])
        stored = float(self._xn2[: self._hi].max(initial=0.0))  # free slots hold 0
        top = max(float(np.einsum("ij,ij->i", k, k).max()), stored)
        if gamma * top < _LOG_MAX:
            return  # Cauchy–Schwarz: no product x·y can overflow
        live = self._live_slots() if self._dim is not None else np.zeros(0, dtype=np.int64)
        others = np.concatenate([k, self._X[live]]) if len(live) else k
        logk = gamma * (k @ others.T)
        if float(logk.max()) >= _LOG_MAX:
            raise KernelOverflowError(
                f"exp kernel overflows float64 for this key: gamma·x·y reaches "
                f"{float(logk.max()):.4g} (limit {_LOG_MAX:.1f}); scale the keys or lower gamma"
            )

    # ------------------------------------------------------------------ public
    def add(self, key, value=None) -> int:
        """Add one token; return its id (ids are never reused).

        Parameters
        ----------
        key : array_like, shape (d,)
        value : array_like, shape (dv,), optional
            Defaults to the key itself (then every token must come without a value).

        Examples
        --------
        >>> mem = SVDDMemory(C=0.5)
        >>> mem.add([0.0, 1.0]), mem.add([1.0, 0.0])
        (0, 1)
        """
        k, v = self._check_rows(key, value, batch=False)
        self._audit_ready()
        ids = self._add_rows(k, v)
        self._standby_upkeep(ids)
        self._after_op("add", ids=ids, keys=k, values=v)
        return ids[0]

    def extend(self, keys, values=None) -> list[int]:
        """Add rows in order, exactly as repeated :meth:`add`; all-or-nothing validation.

        Examples
        --------
        >>> import numpy as np
        >>> mem = SVDDMemory(C=0.25)
        >>> mem.extend(np.eye(4))
        [0, 1, 2, 3]
        """
        k, v = self._check_rows(keys, values, batch=True)
        self._audit_ready()
        ids = self._add_rows(k, v)
        self._standby_upkeep(ids)
        self._after_op("extend", ids=ids, keys=k, values=v)
        return ids

    def remove(self, token_id: int) -> DeletionCertificate:
        """Remove a token exactly and return the deletion certificate.

        The state afterwards is the state of never having added the token (up to
        rounding; the certificate says whether the optimum is unique).

        Raises
        ------
        UnknownTokenError
            If the id was never added or is already removed (state unchanged).
        """
        slot = self._slot_for(token_id)
        self._audit_ready()
        before = self._sizes()
        salt = secrets.token_bytes(16)
        commitment = commit_token(salt, self._X[slot], self._V[slot])
        events = self._remove_slot(slot)
        after, kkt, unique, digest = self._certificate_facts()
        cert = DeletionCertificate._issue(
            removed_id=int(token_id),
            commitment=commitment,
            salt=salt.hex(),
            partition_before=before,
            partition_after=after,
            kkt_residual_after=kkt,
            n_events=events,
            unique_optimum=unique,
            state_digest=digest,
            C=self.C,
            kernel=self.kernel,
            gamma=self._gamma_val,
        )
        self._after_op("remove", certificate=cert)
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
        return [self.remove(t) for t in ids]

    def compact(self) -> list[int]:
        """Certified selection: drop every reserve token; return their ids.

        Reserve tokens have alpha = 0 exactly, so the readout is unchanged for
        every query (the KKT residual certifies the partition).
        """
        if self.warm:
            return []
        self._audit_ready()
        dropped = [int(self._slot_id[s]) for s in self._slots_in({RESERVE})]
        for t in dropped:
            self._wipe_slot(self._id_to_slot[t])
        if dropped and not self._nS:
            self._canonical_mu()
        self._after_op("compact", dropped=sorted(dropped))
        return sorted(dropped)

    # ------------------------------------------------- persistence and audit
    def save(self, path: str | os.PathLike[str]) -> str:
        """Save atomically to a safetensors file; see :func:`svattn.exact.persist.save`."""
        from svattn.exact.persist import save

        return save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *,
             audit_log: str | os.PathLike[str] | None = None) -> SVDDMemory:
        """Load and verify a saved memory; see :func:`svattn.exact.persist.load`."""
        from svattn.exact.persist import load

        return load(path, audit_log=audit_log)

    def _audit_ready(self) -> None:
        if self._audit is not None:
            self._audit.ready()

    def _after_op(self, op: str, **info) -> None:
        """Numerical health check, then the audit record (see health.py, audit.py)."""
        events = self._health.check(self)
        self._health_after = None
        self._release_margin_gram()
        if self._audit is not None:
            self._audit.record(self, op, events=events, **info)

    # ------------------------------------------------------------ read access
    def __len__(self) -> int:
        return self._n

    @property
    def warm(self) -> bool:
        """True while ``n·C < 1`` (warm-up convention: uniform alpha)."""
        return self._n < self.warmup_n

    @property
    def dim(self) -> int | None:
        """Key dimension d (None before the first token)."""
        return self._dim

    @property
    def ids(self) -> list[int]:
        """Live token ids in insertion order."""
        return [int(self._slot_id[s]) for s in self._ordered_slots()]

    @property
    def alpha(self) -> np.ndarray:
        """Coefficients aligned with :attr:`ids` (float64 copy)."""
        return self._alpha[self._ordered_slots()].copy()

    @property
    def keys(self) -> np.ndarray:
        """Keys aligned with :attr:`ids`, shape (n, d)."""
        return self._X[self._ordered_slots()].copy()

    @property
    def values(self) -> np.ndarray:
        """Values aligned with :attr:`ids`, shape (n, dv)."""
        slots = self._ordered_slots()
        return (self._X if self._value_is_key else self._V)[slots].copy()

    @property
    def mu(self) -> float:
        """Multiplier of ``sum(alpha) = 1`` (``R² − alpha^T K alpha``)."""
        return float(self._mu)

    def partition(self) -> dict[str, list[int]]:
        """Ids of the margin, error and reserve sets (warm-up: all in margin)."""
        out: dict[str, list[int]] = {"margin": [], "error": [], "reserve": []}
        for s in self._ordered_slots():
            st = int(self._state[s])
            name = "margin" if self.warm else _SET_NAMES[st]
            out[name].append(int(self._slot_id[s]))
        return out

    def support_ids(self) -> list[int]:
        """Ids with alpha > 0 (margin ∪ error): all that the readout uses."""
        return [int(self._slot_id[s]) for s in self._support_slots()]

    def readout(self, queries) -> np.ndarray:
        """``o(q) = softmax_i(log alpha_i + log k(q, x_i)) · V`` over tokens with alpha > 0.

        Parameters
        ----------
        queries : array_like, shape (m, d) or (d,)

        Returns
        -------
        np.ndarray, shape (m, dv) (or (dv,) for a single query)
        """
        q, single = self._check_queries(queries)
        slots = self._support_slots()
        vals = (self._X if self._value_is_key else self._V)[slots]
        out = biased_softmax_readout(
            q, self._X[slots], vals, self._alpha[slots], self.kernel, self._gamma_val
        )
        return out[0] if single else out

    def decision_function(self, x) -> np.ndarray:
        """``R² − ‖phi(x) − a‖²``: positive inside the description (sklearn's sign).

        Equals ``2 sum_i alpha_i k(x, x_i) − k(x, x) + mu``.
        """
        q, single = self._check_queries(x)
        slots = self._support_slots()
        out = decision_values(q, self._X[slots], self._alpha[slots], self._mu, self.kernel,
                              self._gamma_val)
        return out[0] if single else out

    def kkt_residual(self) -> float:
        """Largest violation of the KKT conditions and constraints, with g recomputed
        from the cached kernel columns (not the solver's running updates of g).

        In units of the largest kernel diagonal (1 for rbf). 0 in warm-up, where
        the convention holds exactly.
        """
        if self._n == 0 or self.warm:
            return 0.0
        return self._kkt(self._fresh_g())

    def unique_optimum(self) -> bool:
        """True when the optimum is unique: K is positive definite on the margin
        set together with every token tied at ``g = 0`` (duplicates break this)."""
        if self._n == 0 or self.warm:
            return True
        g = self._fresh_g()
        tie = 1e-9 * self._scale
        if self._compiled:
            tied = _compiled.tied_slots(g, self._state, self._hi, tie)
        else:
            st = self._state[: self._hi]
            tied = np.flatnonzero((np.abs(g) <= tie) & ((st == ERROR) | (st == RESERVE)))
        nS = self._nS
        if len(tied) + nS <= 1:
            return True
        T = np.concatenate([self._margin_slots(), tied])
        if len(tied):
            Kt = gram_matrix(self._X[T], self.kernel, self._gamma_val)
        else:  # the margin block of the cache is K_SS already
            Kt = self._KC[T, :nS]
        # positive definite with smallest eigenvalue above 1e-10 · the largest
        # (<= trace): K_T − 1e-10·trace·I has a Cholesky factor
        if self._compiled:
            return bool(_compiled.positive_definite(Kt, 1e-10))
        Kt = 0.5 * (Kt + Kt.T)
        shift = 1e-10 * float(np.trace(Kt))
        try:
            np.linalg.cholesky(Kt - shift * np.eye(len(T)))
        except np.linalg.LinAlgError:
            return False
        return True

    def margin_system(self) -> MarginSystem:
        """The partition, alpha, mu and the bordered inverse (for implicit gradients)."""
        part = self.partition()
        return MarginSystem(
            margin=[int(self._slot_id[s]) for s in self._margin_slots()] if not self.warm else [],
            error=part["error"],
            reserve=part["reserve"],
            alpha=self.alpha,
            mu=self.mu,
            Qinv=self._Qinv.copy() if (self._nS and not self.warm) else np.zeros((0, 0)),
        )

    def state_digest(self) -> str:
        """SHA-256 over the parameters, the token set and the solved state.

        The token set enters as a multiset hash (sum of per-token SHA-256 mod
        2^256), updated in O(1) per add/remove, so digests stay cheap.
        """
        slots = self._support_slots_by_id()
        return self._digest(self._slot_id[slots], np.append(self._alpha[slots], self._mu))

    def _digest(self, ids: np.ndarray, values: np.ndarray) -> str:
        """:meth:`state_digest` given the support's ids (int64) in id order and
        ``values``: their alphas, then mu."""
        gamma = self._gamma_val if self._dim is not None else float("nan")
        h = hashlib.sha256(f"{_digest_head(self.C, self.kernel, gamma)}{self._n}|".encode())
        h.update(self._set_hash.to_bytes(32, "big"))
        h.update(ids.tobytes())
        h.update(values.tobytes())
        return h.hexdigest()

    def _margin_gram(self) -> np.ndarray:
        """``K_SS`` (margin order): the last margin solve's copy when it is current,
        else gathered from the cache's margin rows (a temporary)."""
        nS = self._nS
        if self._kss_for is self._Qinv and self._kss_ext >= nS:
            return self._kss[:nS, :nS]
        return _compiled.gather_margin_gram(self._KC, self._slot_of_col, nS)

    def _gram_buffer(self) -> np.ndarray:
        """Where margin solves write ``K_SS``: room for every cache column."""
        if self._kss.shape[0] < self._ccap:
            self._release_margin_gram()
            self._kss = np.zeros((self._ccap, self._ccap))
        return self._kss

    def _kept_margin_gram(self, written: int) -> None:
        """A margin solve wrote ``K_SS`` (up to ``written`` rows/columns) for the current Qinv."""
        self._kss_for = self._Qinv
        self._kss_ext = max(self._kss_ext, written)

    def _release_margin_gram(self) -> None:
        """Zero the copy after an operation: kernel values stay only in the cache,
        which removals scrub."""
        if self._kss_ext:
            ext = self._kss_ext
            self._kss[:ext, :ext] = 0.0
        self._kss_for, self._kss_ext = None, 0

    def _certificate_facts(self) -> tuple[dict[str, int], float, bool, str]:
        """Set sizes, KKT residual, uniqueness and digest after an operation.

        Equal to :meth:`_sizes`, :meth:`kkt_residual`, :meth:`unique_optimum` and
        :meth:`state_digest` (the references, and the path without the compiled
        loop): one compiled pass over the slots, and the residual the operation's
        own exact-g check already computed (``_kkt_after``, set only there).
        """
        kkt, self._kkt_after = self._kkt_after, None
        pre, self._facts_after = self._facts_after, None
        if pre is not None:  # the removal's own final pass found them
            sizes, unique, ids, values = pre
            return (sizes, float(kkt), self.unique_optimum() if unique < 0 else bool(unique),
                    self._digest(ids, values))
        if not self._compiled or self._n == 0 or self.warm:
            return self._sizes(), self.kkt_residual(), self.unique_optimum(), self.state_digest()
        g = self._fresh_g()
        nm, ne, nr, unique, ids, values = _compiled.certificate_facts(
            g, self._alpha, self._state, self._slot_id, self._margin_gram(), self._nS,
            self._hi, 1e-9 * self._scale, 1e-10, self._mu)
        sizes = {"margin": int(nm), "error": int(ne), "reserve": int(nr)}
        if kkt is None:
            kkt = self._kkt(g)
        return (sizes, float(kkt), self.unique_optimum() if unique < 0 else bool(unique),
                self._digest(ids, values))

    # ------------------------------------------------------------ internals
    def _slot_for(self, token_id) -> int:
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise TypeError(f"token_id must be an int, got {type(token_id).__name__}")
        if self._n == 0:
            raise UnknownTokenError(f"cannot remove token {token_id}: the memory is empty")
        slot = self._id_to_slot.get(int(token_id))
        if slot is None:
            state = "was removed" if 0 <= token_id < self._next_id else "was never added"
            raise UnknownTokenError(f"token_id {token_id} is not in the memory (it {state})")
        return slot

    def _check_queries(self, queries) -> tuple[np.ndarray, bool]:
        if self._n == 0:
            raise ValueError("the memory is empty: add tokens before reading")
        q = np.asarray(queries, dtype=np.float64) if _is_numeric(queries) else None
        if q is None:
            raise TypeError("queries must be an array of real numbers")
        single = q.ndim == 1
        if single:
            q = q[None, :]
        if q.ndim != 2 or q.shape[1] != self._dim:
            raise ValueError(f"queries must have shape (m, {self._dim}) or ({self._dim},), "
                             f"got {np.shape(queries)}")
        if not np.isfinite(q).all():
            raise ValueError("queries must be finite (no NaN or inf)")
        _check_norms(q, "queries")
        return q, single

    def _live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._state[: self._hi] != FREE)

    def _ordered_slots(self) -> np.ndarray:
        live = self._live_slots()
        return live[np.argsort(self._slot_id[live], kind="stable")]

    def _slots_in(self, states: set[int]) -> np.ndarray:
        st = self._state[: self._hi]
        return np.flatnonzero(np.isin(st, list(states)))

    def _support_slots(self) -> np.ndarray:
        if self.warm:
            return self._live_slots()
        return np.flatnonzero(self._alpha[: self._hi] > 0)

    def _support_slots_by_id(self) -> np.ndarray:
        if self._compiled and not self.warm:
            return _compiled.support_slots_by_id(self._alpha, self._slot_id, self._hi)
        s = self._support_slots()
        return s[np.argsort(self._slot_id[s], kind="stable")]

    def _sizes(self) -> dict[str, int]:
        if self.warm:
            return {"margin": self._n, "error": 0, "reserve": 0}
        if self._compiled:
            nm, ne, nr = _compiled.count_states(self._state, self._hi)
            return {"margin": int(nm), "error": int(ne), "reserve": int(nr)}
        counts = np.bincount(self._state[: self._hi], minlength=DRIVEN + 1)
        return {"margin": int(counts[MARGIN]), "error": int(counts[ERROR]),
                "reserve": int(counts[RESERVE])}

    @property
    def _scale(self) -> float:
        """Largest kernel diagonal of the live tokens (>= 1): the unit of g."""
        if self.kernel == "rbf":  # k(x, x) = 1 for every key
            return 1.0
        return max(1.0, float(self._diag[: self._hi].max(initial=0.0)))

    def _fresh_g(self) -> np.ndarray:
        """g over used slots, recomputed from the cached columns unless the
        last operation already did so (each operation ends with an exact g)."""
        if not self._g_valid:
            self._g[: self._hi] = self._g_exact()
            self._g_valid = True
        return self._g[: self._hi]

    def _g_exact(self) -> np.ndarray:
        """g over all used slots from the cached kernel columns, not from the
        drive's incremental updates.

        The compiled path reads the margin columns and the error-column sum
        (rebuilt from scratch after every 32 column updates, so its rounding stays
        at the level of a direct sum); :meth:`_g_exact_reference` reads every
        cached column.
        """
        if not self._compiled:
            return self._g_exact_reference()
        hi = self._hi
        self._sync_error_sum()
        g = np.empty(hi)
        _compiled.g_from_error_sum(self._KC, self._ac, self._slot_of_col, self._state,
                                   self._esum, self._diag, self._mu, self.C, self._nS,
                                   self._chi, hi, g)
        return g

    def _sync_error_sum(self) -> None:
        """Bring the error-column sum up to the current error set (see
        ``_compiled.error_sum_sync``); rebuilt from scratch every 32 updates."""
        self._error_sum_synced(_compiled.error_sum_sync(
            self._esum, self._esum_member, self._KC, self._slot_of_col, self._col_of_slot,
            self._state, self._nS, self._chi, self._hi, self._error_sum_rebuild_due))

    @property
    def _error_sum_rebuild_due(self) -> bool:
        return not self._esum_valid or self._esum_updates >= 32

    def _error_sum_synced(self, n: int) -> None:
        """Count a sync's column updates (``n``; -1: rebuilt from scratch)."""
        self._esum_valid = True
        self._esum_updates = 0 if n < 0 else self._esum_updates + int(n)

    def _g_exact_reference(self) -> np.ndarray:
        """g over all used slots from every cached column (the reference of :meth:`_g_exact`)."""
        hi, chi = self._hi, self._chi
        g = 2.0 * (self._KC[:hi, :chi] @ self._ac[:chi]) - self._diag[:hi]
        g += self._mu
        return g

    def _kkt(self, g: np.ndarray) -> float:
        if self._compiled:
            return float(_compiled.kkt_residual(g, self._alpha, self._state, self._diag,
                                                self._mu, self.C, self._hi))
        return self._kkt_reference(g)

    def _kkt_reference(self, g: np.ndarray) -> float:
        st = self._state[: self._hi]
        a = self._alpha[: self._hi]  # free slots hold alpha = 0
        viol = max(abs(float(a.sum()) - 1.0), -float(a.min(initial=0.0)),
                   float(a.max(initial=0.0)) - self.C)
        # signed violation per set: |g| on the margin, g on error, −g on reserve
        sign = _KKT_SIGN[st]
        gv = g * sign
        gv[st == MARGIN] = np.abs(g[st == MARGIN])
        # relative to the size of the terms that make up g_i (all kernel values
        # are positive): K_ii + 2 (K alpha)_i + |mu| = 2 K_ii + g_i − mu + |mu|
        d = self._diag[: self._hi]
        size = np.maximum(2.0 * d + g - self._mu + abs(self._mu), 1.0)
        return max(viol, float((gv / size).max(initial=0.0)))

    # ---- add
    def _add_rows(self, k: np.ndarray, v: np.ndarray | None) -> list[int]:
        if self._dim is None:
            self._dim = k.shape[1]
            self._value_is_key = v is None
            self._vdim = k.shape[1] if v is None else v.shape[1]
            self._alloc(0, self._dim, 0 if v is None else self._vdim)
        diag = kernel_diag(k, self.kernel, self._gamma_val)
        out: list[int] = []
        r, m, block = 0, k.shape[0], 16
        while r < m:
            if self._n + 1 <= self.warmup_n:  # warm-up and the threshold solve
                out.append(self._add_one(k[r], None if v is None else v[r], float(diag[r])))
                r += 1
                continue
            # Score a block against the current solution: every row before the
            # first one outside the description joins the reserve set and changes
            # nothing, so those rows are stored at once (the same as adding them
            # one by one); the first outside row is then added on its own.
            end = min(m, r + block)
            rows, g = self._score_rows(k[r:end], diag[r:end])
            # a rounding-level tie, relative to the terms g is made of, as the KKT
            # residual measures it (a tie scaled by the largest diagonal in the
            # memory let an exp-kernel outlier at 1e18 hide rows at g = -1)
            size = np.maximum(2.0 * diag[r:end] + g - self._mu + abs(self._mu), 1.0)
            outside = np.flatnonzero(g < -1e-13 * size)
            stop = end if len(outside) == 0 else r + int(outside[0])
            if stop > r:
                out += self._store(k[r:stop], None if v is None else v[r:stop], diag[r:stop],
                                   rows[: stop - r], g[: stop - r])
            if stop < end:
                j = stop - r
                out.append(self._add_one(k[stop], None if v is None else v[stop],
                                         float(diag[stop]), row=rows[j], g_c=float(g[j])))
                r = stop + 1
                block = max(16, block // 2)
            else:
                r = end
                block = min(1024, 2 * block)
        return out

    def _score_rows(self, xs: np.ndarray, diag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Kernel rows of new keys against the cached columns, and their g."""
        chi = self._chi
        if chi == 0:
            return np.zeros((len(xs), 0)), self._mu - diag
        rows = kernel_matrix(xs, self._XC[:chi], self.kernel, self._gamma_val)
        g = 2.0 * (rows @ self._ac[:chi]) - diag + self._mu
        return rows, g

    def _store(self, xs, vs, diag, rows, g) -> list[int]:
        """Store new tokens as reserve tokens with their kernel rows and g."""
        count = len(xs)
        reuse = [self._free_slots.pop() for _ in range(min(count, len(self._free_slots)))]
        fresh = count - len(reuse)
        self._grow_slots(self._hi + fresh)
        slots = np.array(reuse + list(range(self._hi, self._hi + fresh)), dtype=np.int64)
        self._hi += fresh
        tids = list(range(self._next_id, self._next_id + count))
        self._next_id += count
        self._X[slots] = xs
        self._xn2[slots] = np.einsum("ij,ij->i", xs, xs)
        if vs is not None:
            self._V[slots] = vs
        self._diag[slots] = diag
        self._slot_id[slots] = tids
        for i, (slot, tid) in enumerate(zip(slots.tolist(), tids, strict=True)):
            self._id_to_slot[tid] = slot
            th = int.from_bytes(_token_hash(tid, xs[i], None if vs is None else vs[i]), "big")
            self._token_hash[slot] = th
            self._set_hash = (self._set_hash + th) % _DIGEST_MOD
        self._n += count
        self._alpha[slots] = 0.0
        self._state[slots] = RESERVE
        chi = rows.shape[1]
        if chi:
            self._KC[slots, :chi] = rows
        self._g[slots] = g
        self._esum_rows(slots, rows)
        return tids

    def _esum_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """The error sum on newly stored rows (their kernel rows over the cached columns)."""
        self._esum[slots] = 0.0
        if not self._esum_valid:
            return
        members = np.flatnonzero(self._esum_member[: self._hi])
        cols = self._col_of_slot[members]
        if len(cols) and (cols.min() < 0 or cols.max() >= rows.shape[1]):
            self._esum_valid = False  # a member without a column here: rebuild on use
            return
        if len(cols):
            self._esum[slots] = rows[:, cols].sum(axis=1)

    def _add_one(self, x: np.ndarray, v: np.ndarray | None, diag: float, *,
                 row: np.ndarray | None = None, g_c: float | None = None) -> int:
        """Add a token in warm-up (no ``row``), or one that :meth:`_add_rows` scored
        outside the description (``row``, ``g_c`` < 0): the solver drives it in."""
        self._standby_stale = True  # the solution moves
        if row is not None:
            tid = self._store(x[None, :], None if v is None else v[None, :], np.array([diag]),
                              row[None, :], np.array([g_c]))[0]
            slot = self._id_to_slot[tid]
            self._state[slot] = DRIVEN
            self._alloc_col(slot)
            try:
                self._drive(slot, +1)
                self._finish_op()
            except _NeedResolve:
                self._resolve()
            return tid
        tid = self._store(x[None, :], None if v is None else v[None, :], np.array([diag]),
                          np.zeros((1, 0)), np.zeros(1))[0]
        if self._n < self.warmup_n:
            self._set_uniform()
        else:
            self._resolve(fallback=False)
        return tid

    # ---- remove
    def _remove_slot(self, slot: int) -> int:
        self._kkt_after = None
        self._standby_stale = True  # g moves: the nearest reserve tokens may change
        st = int(self._state[slot])
        if self._n - 1 < self.warmup_n:
            self._wipe_slot(slot)
            self._drop_solution()
            self._set_uniform()
            return 0
        if st == RESERVE:
            self._wipe_slot(slot)
            if not self._nS:
                self._canonical_mu()
            return 0
        fused = self._compiled  # the segment loop contracts a margin token itself
        if st == MARGIN and not fused:
            self._contract(int(self._col_of_slot[slot]))
        self._state[slot] = DRIVEN
        try:
            finished, seed = (self._remove_by_segments(slot, contract=st == MARGIN) if fused
                              else (False, None))
            if finished:
                events = int(seed[_compiled.SEG_EVENTS])
            else:  # the event loop takes it from here (or from the start)
                events = self._drive(slot, -1, seed=seed)
                self._wipe_slot(slot)
                self._finish_op(exact_g=True)
        except _NeedResolve:
            if self._state[slot] != FREE:
                self._wipe_slot(slot)
            self._resolve()
            events = -1
        return events

    # ---- the adiabatic step loop
    # The compiled loop (svattn.exact._compiled) is the default; the numpy loop
    # below is its reference (tests switch with ``mem._compiled = False``).
    _compiled = True

    # Segments a removal takes before the event loop goes on from where they
    # stopped (0: the event loop does the whole removal; tests vary it).
    _max_segments = 1 << 30

    # Active-set steps a removal may try from its first segment's end point
    # (_compiled._try_jumps; 0: the solution path alone; tests vary it).
    _max_jumps = 2

    def _remove_by_segments(self, c: int, *, contract: bool) -> tuple[bool, np.ndarray]:
        """Remove driven token ``c`` with :func:`_compiled.remove_segments` (one pass
        over the margin block per segment, the last one giving the exact g); with
        ``contract``, ``c`` is a margin token that leaves the margin set first.

        Returns ``(finished, out)``: finished, the removal is done (``c`` wiped, KKT
        checked); otherwise the event loop must go on from the state reached.
        ``out`` holds the segments taken and the tokens that last left and entered
        the margin set (the event loop's seed).
        """
        self._g_valid = False
        hi = self._hi
        g_end = np.empty(hi)
        out = np.zeros(_compiled.SEG_OUT, dtype=np.int64)
        out[_compiled.SEG_LAST_LEFT] = out[_compiled.SEG_LAST_ENTERED] = -1
        facts = np.zeros(3)
        sup_ids = np.empty(self._ccap, dtype=np.int64)
        sup_values = np.empty(self._ccap + 1)
        # the error sum is synced first, without c: its share of the end state is 0
        status, nS, chi, mu, Qinv = _compiled.remove_segments(
            self._KC, self._XC, self._ac, self._slot_of_col, self._col_of_slot, self._X,
            self._V, self._xn2, self._diag, self._alpha, self._g, self._state, self._slot_id,
            self._Qinv, self._esum, self._esum_member, self._error_sum_rebuild_due, self._nS,
            self._chi, hi, self._mu, self.C, self._gamma_val, self.kernel == "rbf", c,
            int(self._col_of_slot[c]) if contract else -1, self._max_segments, self._max_jumps,
            self._scale, g_end, out, facts, sup_ids, sup_values, self._gram_buffer())
        self._n_block_passes += int(out[_compiled.SEG_PASSES])
        jumped = int(out[_compiled.SEG_JUMPED])
        self._n_jumps += jumped > 0
        self._n_jump_fallbacks += jumped < 0
        self._nS, self._chi, self._mu, self._Qinv = int(nS), int(chi), float(mu), Qinv
        self._kss_ext = max(self._kss_ext, int(out[_compiled.SEG_GRAM]))
        self._error_sum_synced(int(out[_compiled.SEG_SYNC]))
        self._esum_updates += int(out[_compiled.SEG_ESUM_UPDATES])
        # (g_end holds g values of live tokens; c's own entry was zeroed)
        if status == _compiled.NEED_RESOLVE:
            raise _NeedResolve
        if status == _compiled.FALLBACK:
            self._n_segment_fallbacks += 1
            return False, out
        self._g_valid = True  # g at the end of the last segment is the exact g
        self._ops_since_exact_g = 0
        self._kss_for = self._Qinv  # the last segment solved the final margin set
        # c's arrays are wiped (it left the error sum first: g stays exact)
        self._forget_slot(c)
        kkt = float(facts[_compiled.FACT_KKT])
        if kkt <= 0.1 * self.tol:
            self._kkt_after = kkt
            n = int(out[_compiled.SEG_SUPPORT])
            self._facts_after = (
                {"margin": int(out[_compiled.SEG_MARGIN]), "error": int(out[_compiled.SEG_ERROR]),
                 "reserve": int(out[_compiled.SEG_RESERVE])},
                int(out[_compiled.SEG_UNIQUE]), sup_ids[:n], sup_values[: n + 1])
            self._health_after = (self._Qinv, float(facts[_compiled.FACT_COND]),
                                  float(facts[_compiled.FACT_INV_RES]))
        else:  # the general finish: polish, refactorize, re-solve
            self._finish_op(exact_g=True)
        return True, out

    def _drive(self, c: int, direction: int, seed: np.ndarray | None = None) -> int:
        """Move alpha_c up (+1, until g_c = 0 or alpha_c = C) or down to 0 (−1);
        ``seed`` continues a removal that :meth:`_remove_by_segments` began."""
        if not self._compiled:
            return self._drive_reference(c, direction)
        self._g_valid = False
        hi = self._hi
        k_c, sgn = np.empty(hi), np.empty(hi)  # filled by the first call
        loop = np.array([0, 0, -1, -1], dtype=np.int64)
        done = 0
        if seed is not None:
            done = int(seed[_compiled.SEG_EVENTS])
            loop[_compiled.LAST_LEFT] = seed[_compiled.SEG_LAST_LEFT]
            loop[_compiled.LAST_ENTERED] = seed[_compiled.SEG_LAST_ENTERED]
        try:
            return self._drive_loop(c, direction, k_c, sgn, loop, done)
        finally:  # a removed token's kernel column must not stay in freed memory
            _scrub(k_c)

    def _drive_loop(self, c: int, direction: int, k_c: np.ndarray, sgn: np.ndarray,
                    loop: np.ndarray, done: int) -> int:
        """:meth:`_drive`'s calls into the compiled event loop, until the drive ends."""
        hi = self._hi
        max_events = 20 * self._n + 200
        scale = self._scale
        is_rbf = self.kernel == "rbf"
        gamma = self._gamma_val
        while True:
            status, nS, chi, mu, Qinv = _compiled.drive_events(
                self._KC, self._XC, self._ac, self._slot_of_col, self._col_of_slot, self._X,
                self._xn2, self._diag, self._alpha, self._g, self._state, self._Qinv,
                self._nS, self._chi, hi, self._mu, self.C, gamma, is_rbf, c, direction, k_c,
                sgn, loop, max_events, scale)
            self._nS, self._chi, self._mu, self._Qinv = int(nS), int(chi), float(mu), Qinv
            if status == _compiled.DONE:
                return done + int(loop[_compiled.EVENTS])
            if status == _compiled.NEED_RESOLVE:
                raise _NeedResolve
            if status == _compiled.NEED_COLUMNS:
                self._grow_cols()
                continue
            # EMPTY_MARGIN: only mu moves (rare; the numpy step is fine)
            with np.errstate(divide="ignore", invalid="ignore"):
                finished, who = self._mu_move(c, direction)
            if finished:
                return done + int(loop[_compiled.EVENTS])
            sgn[who] = 0.0
            loop[_compiled.LAST_ENTERED] = who

    def _drive_reference(self, c: int, direction: int) -> int:
        """The numpy reference of :meth:`_drive` (one array call per step)."""
        C = self.C
        s = float(direction)
        rate_tol = 1e-13
        scale = self._scale
        gtol = 1e-13 * scale
        events = zero_steps = 0
        last_left = last_entered = -1
        max_events = 20 * self._n + 200
        self._g_valid = False
        hi = self._hi
        a, g = self._alpha, self._g
        # c's kernel column, contiguous for the whole drive
        k_c = self._KC[:hi, int(self._col_of_slot[c])].copy()
        sk2 = (2.0 * s) * k_c  # direction-signed, for rho below
        try:
            rho = np.empty(hi)
            ratio = np.empty(hi)
            bad = np.empty(hi, dtype=bool)
            ratio_buf = np.empty(hi)
            # +1 on error tokens (they enter the margin when g rises to 0), −1 on
            # reserve tokens (when g falls to 0), 0 elsewhere; kept in step with events
            st0 = self._state[:hi]
            sgn = (st0 == ERROR).astype(np.float64) - (st0 == RESERVE)
            # one errstate for the loop: 0/0 and x/0 in the ratio tests are expected
            with np.errstate(divide="ignore", invalid="ignore"):
                while True:
                    events += 1
                    if events > max_events or zero_steps > 2 * self._nS + 20:
                        raise _NeedResolve
                    nS = self._nS
                    if nS == 0:
                        done, who = self._mu_move(c, direction)
                        if done:
                            return events
                        sgn[who] = 0.0
                        last_entered = who
                        continue
                    S = self._slot_of_col[:nS]
                    u = np.empty(nS + 1)
                    u[0] = 1.0
                    u[1:] = 2.0 * k_c[S]
                    beta = -(self._Qinv @ u)
                    # rho_i = d g_i / dt for every token (0 on the margin), with t = |d alpha_c|:
                    # 2 (K_iS beta_S + k_ic) + beta_mu, times the direction
                    np.add(self._KC[:hi, :nS] @ ((2.0 * s) * beta[1:]), sk2, out=rho)
                    rho += s * beta[0]
                    # --- candidate steps (t >= 0 is |d alpha_c|)
                    if direction > 0:
                        best_t, kind, who = C - a[c], "c_error", -1
                        if rho[c] > rate_tol * scale:
                            t = max(-g[c], 0.0) / rho[c]
                            if t <= best_t:
                                best_t, kind = t, "c_margin"
                    else:
                        best_t, kind, who = a[c], "c_out", -1
                    # a margin coefficient moving down reaches 0, one moving up reaches C
                    r = beta[1:] * s
                    aS = a[S]
                    down = r < 0
                    t_m = np.where(down, aS, C - aS)
                    np.maximum(t_m, 0.0, out=t_m)
                    absr = np.abs(r)
                    t_m /= absr
                    t_m[absr <= rate_tol] = np.inf
                    if last_entered >= 0:  # no zero-length exit for the token that just entered
                        p = int(self._col_of_slot[last_entered])
                        if 0 <= p < nS and t_m[p] == 0.0:
                            t_m[p] = np.inf
                    j = int(np.argmin(t_m))
                    if t_m[j] < best_t:
                        best_t, who = float(t_m[j]), int(S[j])
                        kind = "m_reserve" if down[j] else "m_error"
                    # an error token moves towards g = 0 when rho > 0, a reserve one when
                    # rho < 0; it gets there at t = −g/rho, i.e. the largest ratio g/rho <= 0
                    rho[S] = 0.0
                    np.divide(g[:hi], rho, out=ratio)
                    np.multiply(rho, sgn, out=ratio_buf)
                    np.less_equal(ratio_buf, gtol, out=bad)
                    ratio[bad] = -np.inf
                    if last_left >= 0 and ratio[last_left] >= 0.0:
                        ratio[last_left] = -np.inf
                    i = int(np.argmax(ratio))
                    t_i = max(-float(ratio[i]), 0.0)
                    if t_i < best_t:
                        best_t, kind, who = t_i, "enter", i
                    if not math.isfinite(best_t):
                        raise _NeedResolve
                    t = best_t
                    zero_steps = zero_steps + 1 if t == 0.0 else 0
                    # --- move everything linearly
                    a[c] += s * t
                    a[S] += r * t
                    self._ac[:nS] = a[S]
                    self._mu += beta[0] * s * t
                    rho *= t
                    g[:hi] += rho
                    last_left = last_entered = -1
                    # --- apply the event
                    if kind == "c_margin":
                        g[c] = 0.0
                        self._state[c] = MARGIN
                        self._ac[self._col_of_slot[c]] = a[c]
                        self._expand(c)
                        return events
                    if kind == "c_error":
                        a[c] = C
                        self._state[c] = ERROR
                        return events
                    if kind == "c_out":
                        a[c] = 0.0
                        return events
                    if kind == "m_reserve":
                        a[who] = 0.0
                        self._contract(int(self._col_of_slot[who]))
                        self._state[who] = RESERVE
                        sgn[who] = -1.0
                        self._free_col(who)
                        last_left = who
                    elif kind == "m_error":
                        a[who] = C
                        self._contract(int(self._col_of_slot[who]))
                        self._state[who] = ERROR
                        self._ac[self._col_of_slot[who]] = C
                        sgn[who] = 1.0
                        last_left = who
                    else:  # an error or reserve token reaches g = 0 and joins the margin
                        g[who] = 0.0
                        if self._col_of_slot[who] < 0:  # a standby token has its column
                            self._alloc_col(who)
                        self._state[who] = MARGIN
                        self._expand(who)
                        sgn[who] = 0.0
                        last_entered = who
        finally:  # a removed token's kernel column must not stay in freed memory
            _scrub(k_c)
            _scrub(sk2)

    def _mu_move(self, c: int, direction: int) -> tuple[bool, int]:
        """Empty margin set: only mu moves. Return (drive done, token that joined)."""
        hi = self._hi
        st = self._state[:hi]
        g = self._g[:hi]
        if direction > 0:
            errs = np.flatnonzero(st == ERROR)
            t_c = max(-g[c], 0.0)
            t_e, who = math.inf, -1
            if len(errs):
                k = int(np.argmax(g[errs]))
                who, t_e = int(errs[k]), max(-float(g[errs[k]]), 0.0)
            if t_c <= t_e:
                self._mu += t_c
                g += t_c
                g[c] = 0.0
                if self._alpha[c] > 0:
                    self._state[c] = MARGIN
                    self._expand(c)
                else:
                    self._state[c] = RESERVE
                    self._free_col(c)
                return True, c
            self._mu += t_e
            g += t_e
        else:
            res = np.flatnonzero(st == RESERVE)
            if len(res) == 0:
                raise _NeedResolve
            k = int(np.argmin(g[res]))
            who, t = int(res[k]), max(float(g[res[k]]), 0.0)
            self._mu -= t
            g -= t
            if self._col_of_slot[who] < 0:
                self._alloc_col(who)
        g[who] = 0.0
        self._state[who] = MARGIN
        self._expand(who)
        return False, who

    def _sync_ac(self) -> None:
        """Copy alpha of every cached token into the per-column array."""
        soc = self._slot_of_col[: self._chi]
        self._ac[: self._chi] = np.where(soc >= 0, self._alpha[soc], 0.0)

    # ---- bordered inverse (margin tokens are cache columns [0, nS))
    def _expand(self, k: int) -> None:
        """Add token ``k`` (which has a cache column) to the margin set."""
        nS = self._nS
        col_k = int(self._col_of_slot[k])
        if nS == 0:
            self._Qinv = np.array([[-2.0 * self._diag[k], 1.0], [1.0, 0.0]])
        else:
            u = np.empty(nS + 1)
            u[0] = 1.0
            u[1:] = 2.0 * self._KC[self._slot_of_col[:nS], col_k]
            w = self._Qinv @ u
            schur = 2.0 * self._diag[k] - float(u @ w)
            if schur <= 1e-10 * self._scale:
                # a (near) copy of margin keys: Q would be singular. Neither jitter
                # (another problem) nor skipping (a corrupt inverse): re-solve.
                raise _NeedResolve
            Qn = np.empty((nS + 2, nS + 2))
            Qn[: nS + 1, : nS + 1] = self._Qinv + np.outer(w, w) / schur
            Qn[: nS + 1, nS + 1] = -w / schur
            Qn[nS + 1, : nS + 1] = -w / schur
            Qn[nS + 1, nS + 1] = 1.0 / schur
            self._Qinv = Qn
        self._swap_cols(col_k, nS)
        self._nS = nS + 1

    def _contract(self, p: int) -> None:
        """Remove the margin token in column ``p`` from the margin set (keeps its column)."""
        if self._compiled:
            nS, self._Qinv = _compiled.contract_margin(
                self._Qinv, self._KC, self._XC, self._ac, self._slot_of_col, self._col_of_slot,
                p, self._nS, self._hi)
            self._nS = int(nS)
            return
        last = self._nS - 1
        if last == 0:
            self._nS = 0
            self._Qinv = np.zeros((0, 0))
            return
        if p != last:  # move it to the end of the block, permuting Qinv alike
            self._swap_cols(p, last)
            perm = np.arange(last + 2)
            perm[[p + 1, last + 1]] = perm[[last + 1, p + 1]]
            self._Qinv = self._Qinv[np.ix_(perm, perm)]
        Q = self._Qinv
        piv = Q[last + 1, last + 1]
        self._Qinv = Q[: last + 1, : last + 1] - np.outer(Q[: last + 1, last + 1],
                                                          Q[last + 1, : last + 1]) / piv
        self._nS = last

    def _refactorize(self, *, count: bool = True) -> None:
        nS = self._nS
        if nS == 0:
            self._Qinv = np.zeros((0, 0))
            return
        S = self._slot_of_col[:nS]
        Q = np.zeros((nS + 1, nS + 1))
        Q[0, 1:] = 1.0
        Q[1:, 0] = 1.0
        KSS = self._KC[S, :nS]
        Q[1:, 1:] = KSS + KSS.T
        self._Qinv = np.linalg.inv(Q)
        self.n_refactorizations += int(count)

    # ---- finishing an operation exactly
    def _polish(self, *, refresh_g: bool = True) -> None:
        """Re-solve alpha_S and mu on the current partition with the kept inverse.

        A margin coefficient that lands on a bound (within 1e-13·C: a tie of the
        two conditions) is moved to that bound's set, so the partition is the
        one read off alpha, and the system re-solved.
        """
        if self._solve_margin(refresh_g) == 0:
            return
        for _ in range(self._nS):
            S = self._slot_of_col[: self._nS]
            aS = self._alpha[S]
            at_bound = np.flatnonzero(np.minimum(np.abs(aS - self.C), np.abs(aS)) <= 1e-13 * self.C)
            if len(at_bound) == 0:
                break
            for p in at_bound[::-1]:  # descending: contracting p only moves the last column
                slot = int(S[p])
                up = self._alpha[slot] > 0.5 * self.C
                self._contract(int(p))
                self._state[slot] = ERROR if up else RESERVE
                self._alpha[slot] = self.C if up else 0.0
                if not up:
                    self._free_col(slot)
            self._solve_margin(refresh_g)

    def _solve_margin(self, refresh_g: bool = True) -> int | None:
        """Solve alpha_S, mu on the partition; return how many margin coefficients
        sit on a bound (None when not counted: the caller checks)."""
        nS = self._nS
        at_bound = None
        if self._compiled and nS:
            self._sync_error_sum()
            mu, at_bound = _compiled.solve_margin(
                self._KC, self._Qinv, self._slot_of_col, self._col_of_slot, self._state,
                self._diag, self._alpha, self._ac, self._esum, nS, self._chi, self.C,
                self._gram_buffer())
            self._kept_margin_gram(nS)
            self._mu = float(mu)
            self._after_margin_solve(refresh_g)
            return int(at_bound)
        soc = self._slot_of_col[nS : self._chi]  # error tokens all have cached columns
        E = soc[soc >= 0]
        E = E[self._state[E] == ERROR]
        self._alpha[E] = self.C
        if nS:
            S = self._slot_of_col[:nS]
            rhs = np.empty(nS + 1)
            rhs[0] = 1.0 - self.C * len(E)
            rhs[1:] = self._diag[S]
            if len(E):
                e = np.zeros(self._chi)
                e[self._col_of_slot[E]] = 2.0 * self.C
                rhs[1:] -= self._KC[S, : self._chi] @ e
            KSS = self._KC[S, :nS]
            x = self._Qinv @ rhs
            for _ in range(2):  # iterative refinement
                res = rhs.copy()
                res[0] -= x[1:].sum()
                res[1:] -= x[0] + 2.0 * (KSS @ x[1:])
                x += self._Qinv @ res
            self._mu = float(x[0])
            self._alpha[S] = x[1:]
        self._sync_ac()
        self._after_margin_solve(refresh_g)
        return at_bound

    def _after_margin_solve(self, refresh_g: bool) -> None:
        if not self._nS:
            self._canonical_mu()
        elif refresh_g:
            self._g[: self._hi] = self._g_exact()
            self._g_valid = True
        else:  # g keeps the drive's linear updates; the polish moved alpha by ~1e-16
            self._g_valid = False

    def _canonical_mu(self) -> None:
        E = self._slots_in({ERROR})
        if len(E) == 0:
            return
        grad = 2.0 * (self._KC[E, : self._chi] @ self._ac[: self._chi]) - self._diag[E]
        self._mu = mu_for_empty_margin(grad)
        self._g[: self._hi] = self._g_exact()
        self._g_valid = True

    def _finish_op(self, *, exact_g: bool = False) -> None:
        # g is recomputed from the cached columns every 32 operations, on
        # ``exact_g`` (a removal: its certificate reports the residual of the exact
        # g) and before any decision below; in between the drive's own linear
        # updates are accurate to rounding, which the KKT check on them would expose.
        self._ops_since_exact_g += 1
        refresh = exact_g or self._ops_since_exact_g >= 32
        self._polish(refresh_g=refresh)
        if refresh:
            self._ops_since_exact_g = 0
        kkt = self._kkt(self._g[: self._hi])
        if kkt <= 0.1 * self.tol:
            # the certificate of a removal reports this residual (g is exact here)
            self._kkt_after = kkt if self._g_valid else None
            return
        self._fresh_g()
        self._ops_since_exact_g = 0
        if self._kkt(self._g[: self._hi]) <= 0.1 * self.tol:
            return
        self._refactorize()
        self._polish()
        if self._kkt(self._g[: self._hi]) <= 0.1 * self.tol:
            return
        self._resolve()

    def _drop_solution(self) -> None:
        self._esum_valid = False
        self._nS = 0
        self._Qinv = np.zeros((0, 0))
        for s in self._slot_of_col[: self._chi].tolist():  # standby columns too
            if s >= 0:
                self._free_col(s)

    def _set_uniform(self) -> None:
        self._esum_valid = False
        live = self._live_slots()
        self._alpha[: self._hi] = 0.0
        if len(live):
            self._alpha[live] = 1.0 / len(live)
            self._state[live] = RESERVE
        self._mu = 0.0
        self._g[: self._hi] = 0.0
        self._g_valid = True

    def _resolve(self, *, fallback: bool = True) -> None:
        """Exact batch solve of the live set; rebuild caches and the inverse.

        Keys that the kernel cannot tell apart (``k(x,x) + k(y,y) − 2k(x,y)``
        below 1e-13 of ``k(x,x) + k(y,y)``) are solved as one token with bound ``m·C``
        and the weight is spread back in id order: the first members at C,
        one remainder, the rest 0. Copies are interchangeable, so this is an
        optimum, and it keeps the margin set free of copies (Q invertible).
        """
        self.n_resolves += int(fallback)
        self._drop_solution()
        live = self._ordered_slots()
        for s in live:
            self._free_col(int(s))
        K = gram_matrix(self._X[live], self.kernel, self._gamma_val)
        diag = self._diag[live]
        dist = diag[:, None] + diag[None, :] - 2.0 * K
        # indistinguishable at each pair's own scale (a huge exp-kernel diagonal
        # elsewhere must not merge ordinary keys)
        same = dist <= 1e-13 * (diag[:, None] + diag[None, :])
        group = np.full(len(live), -1)
        reps = []
        for i in range(len(live)):
            if group[i] < 0:
                members = np.flatnonzero(same[i] & (group < 0))
                group[members] = len(reps)
                reps.append(i)
        reps_a = np.asarray(reps)
        sizes = np.bincount(group, minlength=len(reps))
        sol = batch_solve(K[np.ix_(reps_a, reps_a)], diag[reps_a], self.C * sizes,
                          tol=0.01 * self.tol)
        alpha = np.zeros(len(live))
        for gi, w in enumerate(sol.alpha):
            members = np.flatnonzero(group == gi)
            for m in members:  # fill in id order
                if w <= 1e-13 * self.C:
                    break
                take = self.C if w >= self.C * (1 - 1e-13) else w
                alpha[m] = take
                w -= take
        self._alpha[: self._hi] = 0.0
        self._alpha[live] = alpha
        self._state[live] = RESERVE
        margin = (alpha > 0) & (alpha < self.C)
        for s in live[margin]:  # margin first: they fill columns [0, nS)
            self._state[s] = MARGIN
            self._alloc_col(int(s))
            self._nS += 1
        for s in live[alpha >= self.C]:
            self._state[s] = ERROR
            self._alloc_col(int(s))
        self._mu = sol.mu
        self._refactorize(count=False)
        self._sync_ac()
        if not self._nS:
            self._canonical_mu()
        self._g[: self._hi] = self._g_exact()
        self._g_valid = True
        if self._nS and self._kkt(self._g[: self._hi]) > 0.1 * self.tol:
            self._polish()


_MAX_NORM2 = 1e300  # ‖x‖² bound: sums of three such terms stay finite in float64


@functools.lru_cache(maxsize=64)
def _digest_head(C: float, kernel: str, gamma: float) -> str:
    """The parameters' part of the state digest (formatted once per parameter set)."""
    return f"svattn-svdd-v1|{C!r}|{kernel}|{gamma!r}|"


def _check_norms(x: np.ndarray, name: str) -> None:
    """Refuse rows whose squared norm would overflow the kernel arithmetic."""
    with np.errstate(over="ignore"):
        big = float(np.max(np.einsum("ij,ij->i", x, x), initial=0.0))
    if not big <= _MAX_NORM2:
        raise ValueError(f"{name} are too large: ‖x‖² reaches {big:.3g}, above {_MAX_NORM2:.0e} "
                         "(float64 kernel arithmetic would overflow); rescale the data")


def _scrub(a: np.ndarray) -> None:
    """Zero a buffer that is about to be dropped, so freed memory keeps no key data."""
    if a.dtype != object:
        a.fill(0)


def _is_numeric(x) -> bool:
    try:
        arr = np.asarray(x)
    except Exception:
        return False
    return arr.dtype.kind in "biuf"


def _token_hash(tid: int, x: np.ndarray, v: np.ndarray | None) -> bytes:
    h = hashlib.sha256(int(tid).to_bytes(8, "big", signed=False))
    h.update(np.ascontiguousarray(x, dtype=np.float64).tobytes())
    if v is not None:
        h.update(np.ascontiguousarray(v, dtype=np.float64).tobytes())
    return h.digest()


__all__: Sequence[str] = ["SVDDMemory", "MarginSystem", "UnknownTokenError"]
