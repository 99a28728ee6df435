"""``sample_weight`` of :class:`~svattn.estimators.SVDD`: a weight is a per-sample box.

With weights ``w_i >= 0`` the SVDD dual becomes

    min  αᵀKα − diag(K)ᵀα   s.t.  Σα = 1,  0 <= α_i <= C_i = w_i · C_

with ``C_`` the box of a unit weight: ``C`` when given, or ``1 / (ν Σw)`` with ``nu``
(libsvm's one-class SVM with ``sample_weight``: ``β_i <= w_i``, ``Σβ = ν Σw``, and
``α = β C_``). Identical rows matter only through the sum of their α, so an integer
weight ``k`` equals ``k`` copies of the row, and a weight 0 (``α_i = 0`` forced) equals
leaving the row out: the model is the same function of the data either way.

Two regimes (:class:`~svattn.estimators.SVDD` picks one per state):

* **uniform**: every row held carries the same weight ``w`` (``None`` is ``w = 1``). The
  exact incremental core (:class:`svattn.exact.SVDDMemory`) then solves the problem
  with its one box ``w · C_``: ``partial_fit`` and ``forget`` are incremental, with its
  certificates, audit log and erasure receipts.
* **weighted**: the weights differ (a weight 0 among positive ones included).
  :class:`WeightedMemory` holds the rows, their weights and the exact optimum of the
  per-sample-box dual; every change re-solves it (warm-started from the previous
  partition, else libsvm's one-class SVM with ``sample_weight`` for rbf, finished
  exactly and checked against the KKT conditions, else the reference solver
  :func:`svattn.exact.oracle.solve_svdd` with per-token boxes). Exact, but no
  incremental speed-up: each ``partial_fit`` or ``forget`` costs a fresh solve of the
  rows held (at best one bordered solve of the margin set).

A row of weight 0 is held (it has an id, is forgotten by it, counts in ``n_samples_``)
and never influences the model (``α = 0`` always, never a support vector).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import warnings
from pathlib import Path

import numpy as np

from svattn.exact.core.conventions import FEASIBILITY_SLACK
from svattn.exact.core.kernels import gram_matrix
from svattn.exact.oracle import kkt_residual, solve_svdd
from svattn.exact.records import fileformat

__all__ = ["WeightedMemory", "check_weights", "uniform_weight", "weight_digest",
           "weighted_variance"]

_FORMAT = "svattn-weighted-state-v1"


def check_weights(sample_weight, n: int, *, allow_all_zero: bool = False) -> np.ndarray | None:
    """``sample_weight`` for ``n`` rows as float64 (None stays None).

    Raises
    ------
    ValueError
        Not one finite number >= 0 per row (each fault named, with ``sample_weight``),
        or every weight 0 (unless ``allow_all_zero``: a ``partial_fit`` may add rows that
        carry none).
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, (str, bytes)):
        raise ValueError(f"sample_weight must be a 1-D array of numbers, got {sample_weight!r:.40}")
    if isinstance(sample_weight, numbers.Number) and not isinstance(sample_weight, bool):
        w = np.full(n, float(sample_weight))  # a scalar: every row (scikit-learn's rule)
    else:
        try:
            w = np.array(np.asarray(sample_weight), dtype=np.float64)  # a copy: never written
        except (TypeError, ValueError):
            raise ValueError("sample_weight must be a 1-D array of numbers, got "
                             f"{type(sample_weight).__name__}") from None
    if w.ndim != 1 or w.shape[0] != n:
        raise ValueError(f"sample_weight must be 1-D with one weight per row of X: {n} rows, "
                         f"shape {w.shape}")
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        raise ValueError(f"sample_weight must be finite: rows {bad[:5].tolist()} are "
                         f"{w[bad[:5]].tolist()}")
    neg = np.flatnonzero(w < 0)
    if neg.size:
        raise ValueError(f"sample_weight must be >= 0 (a weight is a box C_i = w_i·C): rows "
                         f"{neg[:5].tolist()} are {w[neg[:5]].tolist()}")
    if not allow_all_zero and not np.any(w > 0):
        raise ValueError("sample_weight: every weight is zero; at least one sample must "
                         "carry a non-zero weight")
    return w


def uniform_weight(w: np.ndarray | None) -> float | None:
    """The one weight every row carries (1.0 for None), or None when they differ (a
    zero among positive weights included)."""
    if w is None:
        return 1.0
    first = float(w[0])
    return first if first > 0 and bool(np.all(w == first)) else None


def weighted_variance(X: np.ndarray, w: np.ndarray) -> float:
    """``X.var()`` with row ``i`` counted ``w_i`` times (``gamma="scale"``): the variance
    of ``np.repeat(X, w, axis=0)`` for integer ``w``."""
    share = w / w.sum()
    mean = float(share @ X.mean(axis=1))
    return float(share @ ((X - mean) ** 2).mean(axis=1))


def weight_digest(w) -> str:
    """SHA-256 (hex) of the weights as little-endian float64, in row order: what a
    receipt declares, recomputable from the weight vector alone."""
    return hashlib.sha256(np.ascontiguousarray(w, dtype="<f8").tobytes()).hexdigest()


def _mu_interval(g: np.ndarray, alpha: np.ndarray, box: np.ndarray) -> tuple[float, float]:
    """The optimal values of ``mu`` (``f_i = g_i + mu``: ``>= 0`` at 0, ``<= 0`` at the box)."""
    free = (alpha > 0) & (alpha < box)
    if free.any():
        mu = float(np.median(-g[free]))
        return mu, mu
    low = float(np.max(-g[alpha <= 0], initial=-math.inf))
    return low, float(np.min(-g[alpha >= box], initial=math.inf))


def _bordered(K, diag, box, S, E):
    """``α`` with ``α_E = C_E``, ``α_R = 0`` and the margin set ``S`` solved exactly."""
    alpha = np.zeros(len(box))
    alpha[E] = box[E]
    m = S.size
    M = np.zeros((m + 1, m + 1))
    M[:m, :m] = 2.0 * K[np.ix_(S, S)]
    M[:m, m] = M[m, :m] = 1.0
    rhs = np.append(diag[S] - 2.0 * K[np.ix_(S, E)] @ box[E], 1.0 - box[E].sum())
    x = np.linalg.lstsq(M, rhs, rcond=None)[0]
    x = x + np.linalg.lstsq(M, rhs - M @ x, rcond=None)[0]  # one step of refinement
    alpha[S] = x[:m]
    return alpha, float(x[m])


def _finish(K: np.ndarray, box: np.ndarray, guess: np.ndarray, tol: float):
    """The exact optimum from a guess of it (a partition to start from), or None when a
    few exact solves with violators moved do not reach the KKT residual ``tol``."""
    diag = np.diag(K)
    scale = 1e-9 * box
    state = np.where(guess <= scale, 0, np.where(guess >= box - scale, 2, 1))
    for _ in range(6):
        S, E = np.flatnonzero(state == 1), np.flatnonzero(state == 2)
        if S.size == 0 and abs(1.0 - box[E].sum()) > 1e-12:
            return None
        alpha, mu = _bordered(K, diag, box, S, E)
        if S.size == 0:
            mu = float(np.min(diag[E] - 2.0 * K[E] @ alpha))
        g = 2.0 * K @ alpha - diag + mu
        low, high = S[alpha[S] < 0], S[alpha[S] > box[S]]
        R = np.flatnonzero(state == 0)
        e_bad, r_bad = E[g[E] > tol], R[g[R] < -tol]
        if not (low.size or high.size or e_bad.size or r_bad.size):
            if kkt_residual(K, alpha, mu, box) <= tol:
                return alpha, mu
            return None
        state[low], state[high], state[e_bad], state[r_bad] = 0, 2, 1, 1
    return None


def solve_weighted(X: np.ndarray, box: np.ndarray, kernel: str, gamma: float, tol: float,
                   guess: np.ndarray | None = None, K: np.ndarray | None = None
                   ) -> tuple[np.ndarray, str]:
    """The exact optimum of the per-sample-box dual on the rows ``X`` (every ``box > 0``;
    ``K`` their Gram matrix when computed already) and how it was reached: ``"warm"``
    (from ``guess``), ``"libsvm+exact"`` (rbf: libsvm's one-class SVM with
    ``sample_weight`` as the start) or ``"reference"``
    (:func:`svattn.exact.oracle.solve_svdd`)."""
    K = gram_matrix(X, kernel, gamma) if K is None else K
    if box.sum() < 1.0 - FEASIBILITY_SLACK:  # infeasible: the oracle's convention
        return solve_svdd(K, box), "reference"
    if guess is not None:
        done = _finish(K, box, guess, tol)
        if done is not None:
            return done[0], "warm"
    if kernel == "rbf" and len(X) > 1:
        import sklearn.svm

        unit, nu = float(box.max()), 1.0 / float(box.sum())  # libsvm: β <= w, Σβ = ν Σw
        if 0.0 < nu <= 1.0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                svm = sklearn.svm.OneClassSVM(kernel="rbf", gamma=gamma, nu=nu, tol=1e-7,
                                              shrinking=False, cache_size=500)
                svm.fit(X, sample_weight=box / unit)
            start = np.zeros(len(X))
            start[svm.support_] = svm.dual_coef_.ravel() * unit
            done = _finish(K, box, start, tol)
            if done is not None:
                return done[0], "libsvm+exact"
    return solve_svdd(K, box, tol=min(tol, 1e-12)), "reference"


class WeightedMemory:
    """The rows, weights and exact optimum of a model under non-uniform weights.

    It offers the part of :class:`svattn.exact.SVDDMemory`'s interface the estimator
    reads (``ids``, ``keys``, ``view.support()``, ``view.mu_interval()``, ...); every
    change re-solves (module docstring). Tokens are positions, as in the core.

    Parameters
    ----------
    unit_C : float
        The box of a unit weight (``C_``).
    kernel, gamma, tol
        As in :class:`~svattn.estimators.SVDD`.
    """

    audit_log = None
    commit_key_id = None

    def __init__(self, unit_C: float, kernel: str, gamma: float, tol: float) -> None:
        self.unit_C, self.kernel, self.gamma_value, self.tol = unit_C, kernel, gamma, tol
        self.tokens = np.zeros(0, dtype=np.int64)
        self.keys = np.zeros((0, 0))
        self.weights = np.zeros(0)
        self.alpha = np.zeros(0)
        self.mu = (0.0, 0.0)
        self.next_id = 0
        self.ingest_path = "reference"

    def __getstate__(self) -> dict:
        return {**vars(self), "digest": self.state_digest()}

    def __setstate__(self, state: dict) -> None:
        """Unpickle, refusing arrays whose digest is not the one pickled or whose alpha
        is not the optimum of its rows and weights (as the core's pickles are checked)."""
        state = dict(state)
        digest = state.pop("digest", None)
        vars(self).update(state)
        if digest != self.state_digest():
            raise ValueError("pickled WeightedMemory: its arrays do not match their digest")
        if self.kkt_residual() > max(1e-8, 10 * self.tol):
            raise ValueError("pickled WeightedMemory: alpha is not the optimum of its rows")

    # ------------------------------------------------------- the core's interface
    view = property(lambda self: self, doc="Itself (the core's ``view`` reads).")
    ids = property(lambda self: [int(t) for t in self.tokens], doc="Tokens held, in order.")
    dim = property(lambda self: self.keys.shape[1] if self.keys.size else None)
    C = property(lambda self: self.unit_C, doc="The box of a unit weight.")

    def __len__(self) -> int:
        return int(self.tokens.size)

    def holds(self, token: int) -> bool:
        """Whether the row ``token`` is held."""
        return bool(np.any(self.tokens == int(token)))

    def n_tagged(self, subject) -> int:
        return 0  # a weighted model keeps no subjects

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens, keys, alpha)`` of the rows with ``alpha > 0``, in token order."""
        on = self.alpha > 0
        return self.tokens[on].copy(), self.keys[on].copy(), self.alpha[on].copy()

    def mu_interval(self) -> tuple[float, float]:
        """The optimal values of ``mu`` (one point unless the margin set is empty)."""
        return self.mu

    def close_audit_log(self) -> None:
        """Nothing to close: a weighted model keeps no audit log."""

    @classmethod
    def from_rows(cls, unit_C: float, kernel: str, gamma: float, tol: float, tokens, keys,
                  weights, alpha, next_id: int) -> WeightedMemory:
        """A memory holding these rows at this optimum (a uniform model's, taken over by
        a ``partial_fit`` of other weights; the next change re-solves)."""
        mem = cls(unit_C, kernel, gamma, tol)
        mem.tokens = np.asarray(tokens, dtype=np.int64)
        mem.keys, mem.weights = np.array(keys, dtype=np.float64), np.array(weights, dtype=float)
        mem.alpha, mem.next_id = np.array(alpha, dtype=np.float64), int(next_id)
        return mem

    # ------------------------------------------------------------- changes
    def boxes(self) -> np.ndarray:
        """``C_i = w_i · C_`` of every row held."""
        return self.weights * self.unit_C

    def extend(self, X: np.ndarray, w: np.ndarray) -> list[int]:
        """Add rows with their weights, re-solve; return their tokens. All or nothing."""
        start = self.next_id
        tokens = np.arange(start, start + len(X), dtype=np.int64)
        keys = X.copy() if not self.keys.size else np.concatenate([self.keys, X])
        self._resolve(np.concatenate([self.tokens, tokens]), keys,
                      np.concatenate([self.weights, w]),
                      np.concatenate([self.alpha, np.zeros(len(X))]))
        self.next_id = start + len(X)
        return tokens.tolist()

    def remove_many(self, tokens) -> list[int]:
        """Remove the rows ``tokens`` (held, checked by the caller), re-solve."""
        keep = ~np.isin(self.tokens, np.asarray(list(tokens), dtype=np.int64))
        self._resolve(self.tokens[keep], self.keys[keep], self.weights[keep], self.alpha[keep])
        return [int(t) for t in tokens]

    def _resolve(self, tokens, keys, weights, guess) -> None:
        """Solve for these rows; the state changes only when the solve succeeded."""
        on = weights > 0
        alpha, mu, path = np.zeros(len(tokens)), (0.0, 0.0), self.ingest_path
        if on.any():
            box = weights[on] * self.unit_C
            warm = guess[on] if guess[on].sum() > 0 else None
            K = gram_matrix(keys[on], self.kernel, self.gamma_value)
            a, path = solve_weighted(keys[on], box, self.kernel, self.gamma_value, self.tol,
                                     warm, K)
            alpha[on] = a
            g = 2.0 * K @ a - np.diag(K)
            mu = _mu_interval(g, a, box) if box.sum() >= 1 - FEASIBILITY_SLACK else (0.0, 0.0)
        self.tokens, self.keys, self.weights = tokens, keys, weights
        self.alpha, self.mu, self.ingest_path = alpha, mu, path

    # ------------------------------------------------------------- records
    def kkt_residual(self) -> float:
        """The KKT residual of the rows that carry weight (0 with none)."""
        on = self.weights > 0
        if not on.any() or self.boxes()[on].sum() < 1 - FEASIBILITY_SLACK:
            return 0.0
        K = gram_matrix(self.keys[on], self.kernel, self.gamma_value)
        return kkt_residual(K, self.alpha[on], self.mu[1] if math.isfinite(self.mu[1])
                            else self.mu[0], self.boxes()[on])

    def state_digest(self) -> str:
        """SHA-256 over the parameters, tokens, rows, weights and ``alpha``."""
        h = hashlib.sha256(f"{_FORMAT}|{self.kernel}|{self.gamma_value!r}|"
                           f"{self.unit_C!r}|".encode())
        for arr in (self.tokens.astype("<i8"), self.keys.astype("<f8"),
                    self.weights.astype("<f8"), self.alpha.astype("<f8")):
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------- saving
    def save(self, path: str | os.PathLike[str], *, before_commit=None) -> str:
        """Write the state (safetensors: tokens, keys, weights, alpha; no pickle)
        atomically; return its SHA-256. ``before_commit(sha256)`` runs before the rename."""
        from safetensors.numpy import save as st_save

        data = st_save({"tokens": self.tokens.astype(np.int64),
                        "keys": np.ascontiguousarray(self.keys, dtype=np.float64),
                        "weights": self.weights.astype(np.float64),
                        "alpha": self.alpha.astype(np.float64),
                        "mu": np.array(self.mu, dtype=np.float64)},
                       metadata={"format": _FORMAT, "kernel": self.kernel,
                                 "gamma": repr(self.gamma_value), "unit_C": repr(self.unit_C),
                                 "tol": repr(self.tol), "next_id": str(self.next_id),
                                 "ingest_path": self.ingest_path,
                                 "state_digest": self.state_digest()})
        digest = fileformat.sha256_hex(data)
        fileformat.write_atomic(Path(path), data, before_rename=None if before_commit is None
                                else (lambda: before_commit(digest)))
        return digest

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WeightedMemory:
        """Read a state :meth:`save` wrote; ``ValueError`` when it is not one, or when
        its digest or its optimum (KKT residual) does not hold."""
        from safetensors import safe_open

        where = str(path)
        try:
            with safe_open(where, framework="numpy") as f:
                meta = f.metadata() or {}
                t = {k: f.get_tensor(k) for k in f.keys()}
            if meta.get("format") != _FORMAT:
                raise ValueError("not a weighted state")
            mem = cls(float(meta["unit_C"]), meta["kernel"], float(meta["gamma"]),
                      float(meta["tol"]))
            mem.tokens, mem.keys, mem.weights = t["tokens"], t["keys"], t["weights"]
            mem.alpha, mem.mu = t["alpha"], (float(t["mu"][0]), float(t["mu"][1]))
            mem.next_id, mem.ingest_path = int(meta["next_id"]), meta["ingest_path"]
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: not a weighted SVDD state ({exc})") from None
        if mem.state_digest() != meta.get("state_digest"):
            raise ValueError(f"{where}: the weighted state's digest does not match its arrays")
        if mem.kkt_residual() > max(1e-8, 10 * mem.tol):
            raise ValueError(f"{where}: alpha is not the optimum of its rows and weights")
        return mem

    @staticmethod
    def is_weighted_file(path) -> bool:
        """Whether ``path`` is a state :meth:`save` wrote (not the core's)."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                return (f.metadata() or {}).get("format") == _FORMAT
        except Exception:  # noqa: BLE001 (any unreadable file is not one)
            return False
