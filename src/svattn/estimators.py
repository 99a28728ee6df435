"""``SVDD``: the one-class SVM that can forget, as a scikit-learn estimator.

:class:`SVDD` wraps the exact incremental/decremental solver
(:class:`svattn.exact.SVDDMemory`) behind scikit-learn's estimator contract:
``fit``, ``partial_fit`` (exact incremental learning), ``forget`` (exact
decremental removal, also reachable as ``unfit``, the name proposed for
unlearning in scikit-learn's issue #28753), ``decision_function``,
``score_samples`` and ``predict`` (+1 inside, -1 outside).

**The same numbers as** :class:`sklearn.svm.OneClassSVM` where the problems
coincide. With the rbf kernel (``k(x, x) = 1``) the SVDD dual

    min  αᵀKα − diag(K)ᵀα   s.t.  Σα = 1,  0 <= α <= C

is libsvm's one-class dual ``min ½ βᵀKβ, Σβ = νn, 0 <= β <= 1`` with
``β = α / C`` and ``C = 1 / (ν n)``. Scaling the SVDD decision function
``f(x) = 2 Σ α_i k(x, x_i) − k(x, x) + μ`` by ``1 / (2C)`` gives libsvm's
``Σ β_i k(x, x_i) − ρ``, so this estimator reports

* ``dual_coef_ = α / C`` (libsvm's β, in [0, 1]),
* ``decision_function(x) = f(x) / (2C)``,
* ``offset_ = (1 − μ) / (2C)`` (libsvm's ρ) and
  ``score_samples(x) = decision_function(x) + offset_``,

where, when every support vector sits at the bound (an empty margin set, e.g. ν·n an
integer), μ is not unique: the core keeps the largest optimal value (its convention:
certificates and digests are over it), and the estimator reports the middle of the
interval of optimal values, as libsvm chooses ρ (``svattn.exact.operations.solver.mu_interval``),

which for rbf equal ``OneClassSVM``'s attributes of the same names (to the
precision libsvm reaches: it caches the kernel in float32). For kernels with a
non-constant diagonal (``kernel="exp"``) the SVDD is not the one-class SVM;
the same formulas define the attributes, and ``score_samples`` then carries
``−(k(x, x) − 1) / (2C)`` so that ``decision = score − offset`` still holds.

**What stays fixed on a stream.** scikit-learn ties C to n through ν
(``C = 1/(νn)``), so each refit changes the problem. A model that learns and
forgets exactly must keep one problem: ``fit`` maps ``nu`` to ``C_ = 1/(ν n)``
with its n (or takes ``C`` as given), and ``partial_fit`` and ``forget`` keep
``C_`` and ``gamma_`` fixed. Then after ``forget`` the model *equals* a fresh
``SVDD(C=model.C_, gamma=model.gamma_).fit(remaining rows)``, and ``nu_``
(``1 / (C_ n)``, the fraction bound ν of the rows now held) drifts with n.

Sample indices: every row ever passed to ``fit`` / ``partial_fit`` gets the
next index (0, 1, ...; ``fit`` starts again at 0); ``support_`` and
``forget(indices=...)`` use them, and forgotten indices are never reused.

Examples
--------
Novelty detection of abnormal ICU hours, then a patient withdraws consent:

>>> import numpy as np
>>> from svattn import SVDD
>>> from svattn.data.icu import default_slice_path, load_mimic3_vitals
>>> icu = load_mimic3_vitals(default_slice_path()).standardised()
>>> model = SVDD(nu=0.05).fit(icu.keys)
>>> outlier = model.predict(icu.keys) == -1
>>> bool(outlier[icu.critical].mean() > 3 * outlier[~icu.critical].mean())
True
>>> stay = icu.stays()[3]
>>> rows = np.flatnonzero(icu.stay_id == stay)
>>> receipt = model.forget(indices=rows)
>>> keep = np.setdiff1d(np.arange(len(icu.keys)), rows)
>>> fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(icu.keys[keep])
>>> probes = icu.keys[::7]
>>> bool(np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max() < 1e-9)
True
>>> print(receipt.summary())  # doctest: +ELLIPSIS
forgot ... samples exactly (... certificates, all KKT <= 1e-10); state digest ...
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from svattn.exact import DeletionCertificate, SVDDMemory
from svattn.exact.core.kernels import get_kernel, kernel_names
from svattn.exact.records.receipts import LOG, RESOLVE, SIGNATURE, STATE, HasVerdict, Verdict, judge


@dataclass(frozen=True)
class ForgetReceipt:
    """What :meth:`SVDD.forget` did: the samples removed and one certificate each.

    Attributes
    ----------
    indices : tuple of int
        Sample indices removed, in the order removed.
    certificates : tuple of DeletionCertificate
        The exact-removal certificate of each (``svattn.exact.verify_deletion``
        checks one against the model's ``memory_`` right after its removal; the
        last one against the model as it is now).
    state_digest : str
        The model's state digest after the last removal.
    n_samples : int
        Samples the model holds afterwards.
    """

    # What binds each field (svattn.exact.records.receipts): the estimator keeps no audit log
    # and signs nothing, so which samples went and their certificates are its own word
    # (verify_forget_receipt reports them unchecked); the model binds the rest.
    CHECKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "indices": (LOG, SIGNATURE),
        "certificates": (LOG, SIGNATURE),
        "state_digest": (STATE,),
        "n_samples": (STATE,),
    }
    CLAIMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "exact optimum of the remaining tokens": (RESOLVE,)}

    indices: tuple[int, ...]
    certificates: tuple[DeletionCertificate, ...]
    state_digest: str
    n_samples: int

    def summary(self) -> str:
        """One line for people."""
        worst = max((c.kkt_residual_after for c in self.certificates), default=0.0)
        bound = "<= 1e-10" if worst <= 1e-10 else f"max {worst:.1e}"
        return (f"forgot {len(self.indices)} samples exactly ({len(self.certificates)} "
                f"certificates, all KKT {bound}); state digest {self.state_digest[:16]}…, "
                f"{self.n_samples} samples left")


def _finite(x) -> bool:
    """``math.isfinite``; False (not OverflowError) for an int no float holds."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


class SVDD(OutlierMixin, BaseEstimator):
    """Support vector data description that learns and forgets exactly.

    Parameters
    ----------
    nu : float in (0, 1], optional
        As in :class:`~sklearn.svm.OneClassSVM`: an upper bound on the fraction of
        training errors and a lower bound on the fraction of support vectors, at
        ``fit``. Sets ``C_ = 1 / (nu · n_samples)``. Default 0.5 when ``C`` is not
        given either.
    C : float, optional
        The box bound ``0 <= α_i <= C`` of the SVDD dual, given directly (then
        ``nu`` must be None). At least ``ceil(1/C)`` samples carry weight; with
        fewer samples the model is uniform (see :mod:`svattn.exact.core.conventions`).
        Above 1 the box never binds: the solver solves the C = 1 problem (its
        ``memory_.C``), and ``C_`` keeps the value given as the attributes' scale.
    kernel : {"rbf", "exp"}
        ``rbf``: exp(−gamma‖x − y‖²); ``exp``: exp(gamma x·y).
    gamma : {"scale", "auto"} or float
        ``"scale"``: 1 / (n_features · X.var()) of the ``fit`` data (1 when the
        variance is 0), ``"auto"``: 1 / n_features, as in scikit-learn. Fixed at
        ``fit`` (``gamma_``) for every later ``partial_fit`` and ``forget``.
    tol : float
        KKT tolerance of the exact solver (units of the largest k(x, x)); not
        libsvm's stopping tolerance: the solution is exact to rounding.
    standby : int
        Kernel columns the solver keeps for reserve samples near the boundary
        (speed only; see :class:`svattn.exact.SVDDMemory`).

    Attributes
    ----------
    memory_ : SVDDMemory
        The exact solver state (its certificates and audit tools apply).
    C_, gamma_ : float
        The box bound and bandwidth in use (fixed from ``fit`` on); the solver's box
        is ``min(C_, 1)`` (a larger one never binds).
    nu_ : float
        ``1 / (C_ · n)`` for the n samples held now.
    support_ : ndarray of int64, shape (n_SV,)
        Sample indices of the support vectors (alpha > 0).
    support_vectors_ : ndarray, shape (n_SV, n_features)
    dual_coef_ : ndarray, shape (1, n_SV)
        ``alpha / C_`` (libsvm's coefficients for rbf).
    offset_ : float
        ``(1 − mu) / (2 C_)``; ``decision_function = score_samples − offset_``. With
        every support vector at the bound, ``mu`` is the middle of the optimal
        interval (libsvm's choice of ``rho``), not ``memory_.mu``, its largest value.
    n_support_ : ndarray of int32, shape (1,)
    n_samples_ : int
        Samples held now.
    n_features_in_ : int
    fit_path_ : str
        How the last ``fit`` / ``partial_fit`` solved its rows: ``"libsvm+exact"``
        (rbf, a block much larger than the model: libsvm's one-class SVM as a warm
        start, then an exact float64 active-set finish) or ``"incremental"`` (the
        exact solver adding rows one by one). Both reach the same optimum.
    feature_names_in_ : ndarray of str
        Only when fitted on data with string column names (a DataFrame).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(200, 2))
    >>> model = SVDD(nu=0.1, gamma=0.5).fit(X)
    >>> model.predict([[0.0, 0.0], [6.0, 6.0]])
    array([ 1, -1])
    >>> model.partial_fit(X[:5] + 0.01).n_samples_
    205
    >>> model.forget(indices=[0, 1]).n_samples
    203
    """

    def __init__(self, *, nu: float | None = None, C: float | None = None, kernel: str = "rbf",
                 gamma: str | float = "scale", tol: float = 1e-10, standby: int = 16) -> None:
        self.nu = nu
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.tol = tol
        self.standby = standby

    # ---------------------------------------------------------------- params
    def _box(self, n: int) -> float:
        if self.nu is not None and self.C is not None:
            raise ValueError("give nu or C, not both (nu sets C = 1 / (nu · n_samples))")
        if self.C is not None:
            if isinstance(self.C, bool) or not isinstance(self.C, numbers.Real) \
                    or not (_finite(self.C) and self.C > 0):
                raise ValueError(f"C must be a finite number > 0, got {self.C!r:.40}")
            return float(self.C)
        nu = 0.5 if self.nu is None else self.nu
        if isinstance(nu, bool) or not isinstance(nu, numbers.Real) or not 0 < nu <= 1:
            raise ValueError(f"nu must be in (0, 1], got {nu!r}")
        return 1.0 / (float(nu) * n)

    def _gamma(self, X: np.ndarray) -> float:
        if isinstance(self.gamma, str):
            if self.gamma == "scale":
                var = float(X.var())
                return 1.0 / (X.shape[1] * var) if var > 0 else 1.0
            if self.gamma == "auto":
                return 1.0 / X.shape[1]
            raise ValueError(f"gamma must be 'scale', 'auto' or a float > 0, got {self.gamma!r}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, numbers.Real) \
                or not (_finite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be 'scale', 'auto' or a float > 0, got "
                             f"{self.gamma!r:.40}")
        return float(self.gamma)

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None) -> SVDD:
        """Fit on ``X`` (n_samples, n_features) from scratch; ``y`` is ignored.

        Returns
        -------
        self
        """
        if self.kernel not in kernel_names():
            raise ValueError(f"kernel must be one of {sorted(kernel_names())}, got {self.kernel!r}")
        X = validate_data(self, X, dtype=np.float64, order="C", ensure_min_samples=1)
        C, gamma = self._box(X.shape[0]), self._gamma(X)
        memory = SVDDMemory(C, self.kernel, gamma, tol=self.tol, standby=self.standby)
        memory.extend(X)
        self.memory_, self.C_, self.gamma_ = memory, C, gamma
        self.fit_path_ = memory.ingest_path
        self._refresh()
        return self

    def partial_fit(self, X, y=None) -> SVDD:
        """Add the rows of ``X`` exactly (the model equals a ``fit`` on every row held,
        with ``C_`` and ``gamma_`` kept); the first call is :meth:`fit`.

        Returns
        -------
        self
        """
        if not hasattr(self, "memory_"):
            return self.fit(X)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False, ensure_min_samples=1)
        self.memory_.extend(X)
        self.fit_path_ = self.memory_.ingest_path
        self._refresh()
        return self

    def forget(self, X=None, *, indices=None) -> ForgetReceipt:
        """Remove samples exactly, as if they had never been seen.

        Give the rows themselves (``X``: every held sample equal to a row of ``X``,
        all its copies, is removed) or their sample ``indices``. Nothing changes
        when any of them is not held. ``unfit`` is the same method.

        Returns
        -------
        ForgetReceipt
            The indices removed, one deletion certificate each, the digest after.

        Raises
        ------
        ValueError
            Neither or both of ``X`` and ``indices``; a row that matches no held
            sample; an index never given or already forgotten; a repeated index.
        NotFittedError
            Before ``fit``.
        """
        if "memory_" not in vars(self):  # (check_is_fitted's tag lookup was a tenth of a
            check_is_fitted(self, "memory_")  # small-support forget: only when unfitted)
        if (X is None) == (indices is None):
            raise ValueError("forget takes the rows X or their sample indices, exactly one")
        if X is not None:
            X = validate_data(self, X, dtype=np.float64, order="C", reset=False,
                              ensure_min_samples=1)
            ids = self._matching_ids(X, self.memory_.ids)
        else:
            ids = self._checked_indices(indices, self.memory_.view)
        certs = self.memory_.remove_many(ids)
        self._refresh()
        # the last certificate's digest is the state's after it (each removal's own)
        return ForgetReceipt(indices=tuple(ids), certificates=tuple(certs),
                             state_digest=certs[-1].state_digest, n_samples=len(self.memory_))

    unfit = forget

    def _matching_ids(self, X: np.ndarray, held: list[int]) -> list[int]:
        # rows by their bytes with -0.0 written as 0.0 (+ 0.0), as the core's
        # commitments and copy lists take them: equal values, one record
        keys = self.memory_.keys + 0.0
        by_row: dict[bytes, list[int]] = {}
        for tid, row in zip(held, keys, strict=True):
            by_row.setdefault(row.tobytes(), []).append(tid)
        ids: list[int] = []
        asked: set[bytes] = set()
        for r, row in enumerate(np.ascontiguousarray(X) + 0.0):
            data = row.tobytes()
            if data in asked:
                continue  # a repeated row: its samples are already listed
            found = by_row.pop(data, None)
            if found is None:
                raise ValueError(f"X row {r} matches no sample the model holds")
            asked.add(data)
            ids += found
        return ids

    def _checked_indices(self, indices, held) -> list[int]:
        arr = np.asarray(indices)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise ValueError(f"indices must be a non-empty 1-D sequence of ints, got {indices!r}")
        ids = [int(i) for i in arr]
        if len(set(ids)) != len(ids):
            raise ValueError("indices lists a sample twice")
        missing = [i for i in ids if not held.holds(i)]
        if missing:
            raise ValueError(f"indices {missing[:5]} are not held (never given, or forgotten)")
        return ids

    # ------------------------------------------------------------- predict
    def _refresh(self) -> None:
        """The fitted attributes from the memory's view (after every change): the support
        only, in sample-index order, so a change costs O(support), not O(n)."""
        mem = self.memory_
        view = mem.view
        ids, keys, alpha = view.support()
        C = self.C_
        self.support_ = ids
        self.support_vectors_ = keys
        self.dual_coef_ = (alpha / C)[None, :]
        low, high = view.mu_interval()  # one point unless the margin set is empty
        mu = 0.5 * (low + high) if math.isfinite(low) else high
        self.offset_ = (1.0 - mu) / (2.0 * C)
        self.n_support_ = np.array([len(ids)], dtype=np.int32)
        self.n_samples_ = len(mem)
        self.nu_ = 1.0 / (C * len(mem)) if len(mem) else math.inf

    def score_samples(self, X) -> np.ndarray:
        """``Σ dual_coef_ · k(sv, x) − (k(x, x) − 1) / (2 C_)`` (for rbf OneClassSVM's
        raw score ``Σ β k(sv, x)``); ``decision_function = score_samples − offset_``.

        Each row's value is computed alone (no BLAS blocking over the batch), so a
        sample scores the same in any batch and ``predict`` of a subset is the
        subset of ``predict``: points on the boundary sit at rounding distance from
        0, and a batch-dependent rounding would flip their side.
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        S, coef, g = self.support_vectors_, self.dual_coef_[0], self.gamma_
        kern = get_kernel(self.kernel)
        dots = np.einsum("ik,jk->ij", X, S)  # per entry, one fixed sum (no BLAS)
        xx = np.einsum("ij,ij->i", X, X)
        ss = np.einsum("ij,ij->i", S, S)
        logk = kern.log_from_dots(dots, xx[:, None], ss[None, :], g)  # (n, |sv|)
        if kern.unit_diagonal:
            return np.einsum("ij,j->i", np.exp(logk), coef)
        logd = kern.log_diag(xx, g)
        for top in (logk.max(initial=0.0), logd.max(initial=0.0)):
            kern.check_overflow(float(top), "log k for these samples",
                                "scale the data or lower gamma")
        return np.einsum("ij,j->i", np.exp(logk), coef) - (np.exp(logd) - 1.0) / (2.0 * self.C_)

    def decision_function(self, X) -> np.ndarray:
        """``score_samples(X) − offset_`` = ``f(x) / (2 C_)``, with the SVDD's
        ``f(x) = R² − ‖φ(x) − a‖²``: positive inside (OneClassSVM's sign and scale)."""
        return self.score_samples(X) - self.offset_

    def predict(self, X) -> np.ndarray:
        """+1 for inliers (``decision_function >= 0``), −1 for outliers."""
        return np.where(self.decision_function(X) >= 0, 1, -1)


@dataclass(frozen=True)
class ForgetReceiptVerification(HasVerdict):
    """Result of :func:`verify_forget_receipt`: ``ok`` (nothing failed), the failures,
    and the :class:`~svattn.exact.records.receipts.Verdict` on the receipt's fields."""

    ok: bool
    reasons: tuple[str, ...]
    verdict: Verdict


def verify_forget_receipt(model: SVDD, receipt: ForgetReceipt, *, retrain: bool = True,
                          tol: float = 1e-8) -> ForgetReceiptVerification:
    """Check :meth:`SVDD.forget`'s receipt against the model right after the forget.

    The indices are the certificates' removed ids, in order, and none is held; every
    certificate is well-formed and consistent, of the model's parameters; the last
    passes :func:`svattn.exact.auditor.verify.verify_deletion` (with ``retrain``, a re-solve
    from scratch); the digest and sample count are the model's. The estimator keeps no
    log and signs nothing: ``indices`` and ``certificates`` stay unchecked (what they
    say could be any other samples' removals), so the verdict is at best UNCHECKED.
    """
    from svattn.exact.auditor.verify import verify_deletion

    check_is_fitted(model)
    mem = model.memory_
    reasons: list[str] = []
    certs = list(receipt.certificates)
    if not all(isinstance(c, DeletionCertificate) for c in certs):
        reasons.append("certificates: not DeletionCertificate objects")
        certs = []
    if list(receipt.indices) != [c.removed_id for c in certs]:
        reasons.append("indices: they are not the certificates' removed ids, in order")
    held = [i for i in receipt.indices if mem.view.holds(i)]
    if held:
        reasons.append(f"indices: {held[:5]} are still held")
    for k, c in enumerate(certs[:-1]):
        errs = c.consistency_errors()
        if (c.C, c.kernel, c.gamma) != (mem.C, mem.kernel, mem.gamma_value):
            errs.append("C, kernel, gamma: not the model's")
        reasons += [f"certificates[{k}]: {e}" for e in errs]
    if certs:
        last = verify_deletion(mem, certs[-1], retrain, tol=tol)
        reasons += [f"certificates[{len(certs) - 1}]: {r}" for r in last.reasons]
    if receipt.state_digest != mem.state_digest():
        reasons.append("state_digest differs from the model's")
    if receipt.n_samples != len(mem):
        reasons.append(f"n_samples: the receipt says {receipt.n_samples}, the model holds "
                       f"{len(mem)}")
    ran = {STATE} | ({RESOLVE} if retrain and certs else set())
    return ForgetReceiptVerification(ok=not reasons, reasons=tuple(reasons),
                                     verdict=judge(receipt, ran, reasons))


__all__ = ["SVDD", "ForgetReceipt", "ForgetReceiptVerification", "verify_forget_receipt"]
