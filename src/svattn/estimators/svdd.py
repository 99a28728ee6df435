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
interval of optimal values, as libsvm chooses ρ (``svattn.exact.operations.scoring.mu_interval``),

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
``SVDD(C=model.C_, gamma=model.gamma_).fit(remaining rows)`` (every receipt says
so in ``refit_with``), and ``nu_`` (``1 / (C_ n)``, the fraction bound ν of the rows
now held) drifts with n.

**Which row is which** (:mod:`svattn.estimators.rows`). Every row has an id: ``ids=``
given to ``fit`` / ``partial_fit``, else a DataFrame's index labels, else its running
position (0, 1, ... over every row given since ``fit``, continuing across
``partial_fit``; ``support_`` holds these positions, as scikit-learn's sample
indices). ``forget(ids=...)`` removes rows by id, ``forget(subject=...)`` every row of
a data subject (``subjects=`` at fit), ``forget(X)`` rows by their values;
``forget(indices=...)`` takes positions and is refused once an id is not its row's
position (a shuffled DataFrame): it would remove other rows.

**Derived, not copied.** The support's attributes (``support_``,
``support_vectors_``, ``dual_coef_``, ``offset_``, ...) are read from the exact
memory, computed once per state of it: a forget or a partial fit changes the memory
alone, so no attribute, prediction or pickle can show a row the memory no longer
holds, whatever fails after the core's change.

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
>>> receipt = model.forget(ids=rows)
>>> keep = np.setdiff1d(np.arange(len(icu.keys)), rows)
>>> fresh = SVDD(**receipt.refit_with).fit(icu.keys[keep])
>>> probes = icu.keys[::7]
>>> bool(np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max() < 1e-9)
True
>>> print(receipt.summary())  # doctest: +ELLIPSIS
forgot ... samples exactly (ids ...; ... certificates, all KKT <= 1e-10; unsigned); ...
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

# sklearn.svm: the fit's batch path (libsvm's warm start) uses it; imported with the
# estimator, a fresh process's first fit does not pay its import (0.1-0.3 s)
import numpy as np
import sklearn.svm  # noqa: F401
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from svattn.estimators import saved
from svattn.estimators.box import InfeasibleBoxWarning, box_of, warn_if_uniform
from svattn.estimators.receipt import ForgetReceipt
from svattn.estimators.rows import (
    RowLedger,
    frame_labels,
    id_list,
    matching_tokens,
    subject_tags,
)
from svattn.estimators.weighted import (
    WeightedMemory,
    check_weights,
    uniform_weight,
    weight_digest,
    weighted_variance,
)
from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import get_kernel, kernel_names
from svattn.exact.records.signing import sign
from svattn.exact.records.signing import signing_key as as_signing_key


def _finite(x) -> bool:
    """``math.isfinite``; False (not OverflowError) for an int no float holds."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


@dataclass(frozen=True)
class SupportAttributes:
    """The support's attributes of one state of the memory (see :class:`SVDD`)."""

    positions: np.ndarray
    vectors: np.ndarray
    dual_coef: np.ndarray
    offset: float


def support_attributes(memory: SVDDMemory, C: float) -> SupportAttributes:
    """The support in position order, ``alpha / C`` and the offset (libsvm's ρ) of
    ``memory`` as it is: O(|support|), not O(n)."""
    view = memory.view
    ids, keys, alpha = view.support()
    low, high = view.mu_interval()  # one point unless the margin set is empty
    mu = 0.5 * (low + high) if math.isfinite(low) else high
    return SupportAttributes(ids, keys, (alpha / C)[None, :], (1.0 - mu) / (2.0 * C))


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
        ``nu`` must be None). At least ``ceil(1/C)`` samples carry weight (``C = 1/k``
        lets ``k`` carry all of it); with fewer the model is uniform, not fitted to the
        samples (:class:`~svattn.estimators.box.InfeasibleBoxWarning`).
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
    signing_key : str, path or Ed25519PrivateKey, optional
        The controller's key (``svattn keygen`` writes one; give the path of its
        ``.key`` file): every receipt, certificate and erasure receipt is then signed,
        and ``subjects=`` are kept as hashes keyed by it. Read at ``fit``; never saved
        or pickled (a pickle keeps a path, drops a key object); :meth:`load` takes it
        again.
    audit_log : str or path, optional
        A new (or empty) file: ``fit`` starts the exact memory's hash-chained audit log
        there (:mod:`svattn.exact.records.audit`), which then records every row added
        (its commitment, never its values) and every removal. ``fit`` refuses a file
        that has records: each fit is a new chain, so a refit, a ``clone`` of this model
        or a grid search cannot write into one log (use a log for the model you deploy;
        :meth:`load` continues a saved model's log).

    Attributes
    ----------
    memory_ : SVDDMemory or WeightedMemory
        The exact solver state (its certificates and audit tools apply); under unequal
        sample weights a :class:`~svattn.estimators.weighted.WeightedMemory` (rows,
        weights and the exact per-sample-box optimum, re-solved on each change).
    C_, gamma_ : float
        The box bound and bandwidth in use (fixed from ``fit`` on); the solver's box
        is ``min(C_, 1)`` (a larger one never binds).
    nu_ : float
        ``1 / (C_ · Σw)`` for the samples held now (``Σw = n`` without weights).
    weights_ : ndarray of float, shape (n_samples_,)
        The ``sample_weight`` of every row held (1 where none was given); row ``i``'s
        box is ``weights_[i] · C_``.
    ids_ : ndarray, shape (n_samples_,)
        The id of every row held, in the order given (int64 when every id is an int,
        else object): ``ids=``, a DataFrame's index labels, or positions.
    support_ : ndarray of int64, shape (n_SV,)
        Positions (sample indices) of the support vectors (alpha > 0).
    support_ids_ : ndarray, shape (n_SV,)
        Their ids.
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
        exact solver adding rows one by one). Both reach the same optimum. Under unequal
        sample weights: ``"warm"`` (from the previous partition), ``"libsvm+exact"``
        or ``"reference"`` (:func:`svattn.exact.oracle.solve_svdd` with per-sample boxes).
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
    >>> model.forget(ids=[0, 1]).n_samples
    203
    """

    def __init__(self, *, nu: float | None = None, C: float | None = None, kernel: str = "rbf",
                 gamma: str | float = "scale", tol: float = 1e-10, standby: int = 16,
                 signing_key=None, audit_log: str | os.PathLike[str] | None = None) -> None:
        self.nu = nu
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.tol = tol
        self.standby = standby
        self.signing_key = signing_key
        self.audit_log = audit_log

    # ---------------------------------------------------------------- params
    def _gamma(self, X: np.ndarray, w: np.ndarray | None = None) -> float:
        if isinstance(self.gamma, str):
            if self.gamma == "scale":  # weighted (non-uniform w): rows counted w_i times
                var = float(X.var()) if w is None else weighted_variance(X, w)
                return 1.0 / (X.shape[1] * var) if var > 0 else 1.0
            if self.gamma == "auto":
                return 1.0 / X.shape[1]
            raise ValueError(f"gamma must be 'scale', 'auto' or a float > 0, got {self.gamma!r}")
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, numbers.Real) \
                or not (_finite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be 'scale', 'auto' or a float > 0, got "
                             f"{self.gamma!r:.40}")
        return float(self.gamma)

    def _key(self):
        """The controller's private key (``signing_key``, read now), or None."""
        if self.signing_key is None:
            return None
        try:
            return as_signing_key(self.signing_key)
        except (TypeError, ValueError, FileNotFoundError) as exc:
            raise type(exc)(f"signing_key: {exc}") from None

    def _new_log(self) -> Path | None:
        """``audit_log`` as a path a fit may start a chain in (new or empty)."""
        if self.audit_log is None:
            return None
        if not isinstance(self.audit_log, (str, os.PathLike)):
            raise TypeError(f"audit_log must be a file path, got {type(self.audit_log).__name__}")
        path = Path(self.audit_log)
        if path.is_dir():
            raise ValueError(f"audit_log {path} is a directory; give a file path")
        if path.exists() and path.stat().st_size > 0:
            raise ValueError(
                f"audit_log {path} already has records: every fit starts a new chain, so a "
                "refit, a clone of a fitted model or a search cannot write into another "
                "fit's log; give a new file (SVDD.load(MODEL, audit_log=...) continues a "
                "saved model's log)")
        return path

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, sample_weight=None, *, ids=None, subjects=None) -> SVDD:
        """Fit on ``X`` (n_samples, n_features) from scratch; ``y`` is ignored.

        Parameters
        ----------
        X : array-like or DataFrame, shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or float, optional
            A weight ``w_i >= 0`` per row: row ``i``'s box is ``C_i = w_i · C_``, with
            ``C_ = C`` given or ``1 / (nu · Σw)`` (libsvm's rule). A weight 0 equals
            leaving the row out (it is held, has an id, never influences the model); an
            integer weight ``k`` equals ``k`` copies of the row. Equal weights keep the
            incremental solver (box ``w · C_``); unequal ones (a 0 among positive ones
            included) solve the weighted dual exactly, and each later ``partial_fit`` /
            ``forget`` re-solves it (no incremental speed-up; no ``audit_log`` or
            ``subjects``). ``gamma="scale"`` then uses the weighted variance. See
            :mod:`svattn.estimators.weighted` and docs/usage.md.
        ids : sequence of int or str, optional
            One id per row (default: a DataFrame's index labels, else the positions
            0 .. n − 1). Each row is forgotten by its id (:meth:`forget`).
        subjects : sequence of str or None, optional
            The data subject of each row (None: no subject); ``forget(subject=...)``
            removes all of a subject's rows. Kept as keyed hashes: needs
            ``signing_key``.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Bad parameters or data; ``sample_weight`` of another length or shape, with a
            negative, NaN or infinite weight, all zero, or unequal with ``audit_log`` or
            ``subjects`` (the model is then unchanged).
        """
        if self.kernel not in kernel_names():
            raise ValueError(f"kernel must be one of {sorted(kernel_names())}, got {self.kernel!r}")
        labels = frame_labels(X)
        X = validate_data(self, X, dtype=np.float64, order="C", ensure_min_samples=1)
        w = check_weights(sample_weight, len(X))
        unit = uniform_weight(w)
        total = len(X) * unit if unit is not None else float(w.sum())
        C, gamma = box_of(self.nu, self.C, total), self._gamma(X, None if unit else w)
        if unit is None:
            self._refuse_weighted(subjects)
        ledger = RowLedger()
        row_ids, positional = ledger.new_ids(ids, labels, 0, len(X), lambda t: False)
        key = self._key()
        tags = subject_tags(subjects, len(X), key)
        log = None if unit is None else self._new_log()
        created = log is not None and not log.exists()
        if unit is None:
            memory = WeightedMemory(C, self.kernel, gamma, self.tol)
            tokens = memory.extend(X, w)
        else:
            memory = SVDDMemory(C * unit, self.kernel, gamma, tol=self.tol,
                                standby=self.standby, signing_key=key, audit_log=log)
        try:
            if unit is not None:
                tokens = memory.extend(X, tags=tags)
        except BaseException:
            memory.close_audit_log()
            if created:  # the chain this fit started: nothing of it stays
                log.unlink(missing_ok=True)
            elif log is not None:  # an empty file given: empty again
                os.truncate(log, 0)
            raise
        ledger.add(tokens, row_ids)
        ledger.positional = positional
        old = vars(self).get("memory_")
        self.memory_, self.C_, self.gamma_ = memory, C, gamma
        self._ledger, self._signing_key, self._support = ledger, key, {}
        self._unit_weight = unit
        self._tagged = tags is not None and any(t is not None for t in tags)
        self.fit_path_ = memory.ingest_path
        vars(self).pop("_detached", None)  # a fresh fit holds what its parameters give
        if old is not None:
            old.close_audit_log()  # its chain ends with this model's previous fit
        self._support_attributes()  # computed with the fit (predict changes nothing)
        self._warn_box("fit")
        return self

    def _refuse_weighted(self, subjects) -> None:
        """Unequal weights need the weighted solver, which keeps no audit log or subjects."""
        for what, given in (("audit_log", self.audit_log is not None),
                            ("subjects", subjects is not None)):
            if given:
                raise ValueError(
                    f"sample_weight with unequal weights (or a zero among positive ones) is "
                    f"solved by the weighted exact solver, which keeps no {what}: the exact "
                    f"core's audit log and subject erasure hold one box for every row. Give "
                    f"equal weights, or fit without {what}")

    def _warn_box(self, after: str) -> None:
        """:class:`InfeasibleBoxWarning` when the rows held cannot fill their boxes."""
        memory = self.memory_
        if not isinstance(memory, WeightedMemory):
            warn_if_uniform(self.C_ * self._unit(), len(memory), after, stacklevel=4)
        elif len(memory) and not memory.boxes().sum():
            warnings.warn(f"SVDD after {after}: no row held carries a non-zero sample_weight: "
                          "the model has no support (every sample an outlier) until one "
                          "does", InfeasibleBoxWarning, stacklevel=4)
        elif 0 < memory.boxes().sum() < 1.0 - 1e-12:
            warnings.warn(
                f"SVDD after {after}: the boxes C_i = w_i·C_ of the rows held sum to "
                f"{memory.boxes().sum():.3g} < 1: no solution keeps every weight within its "
                "box; the model is alpha_i = C_i / ΣC (not fitted to the rows' shape) until "
                "they sum to 1 (raise C or the weights)", InfeasibleBoxWarning, stacklevel=4)

    def _unit(self) -> float:
        """The weight every row carries in the uniform regime (1.0: none given)."""
        unit = vars(self).get("_unit_weight", 1.0)
        return 1.0 if unit is None else unit

    def partial_fit(self, X, y=None, sample_weight=None, *, ids=None, subjects=None) -> SVDD:
        """Add the rows of ``X`` exactly (the model equals a ``fit`` on every row held,
        with ``C_`` and ``gamma_`` kept); the first call is :meth:`fit`.

        ``ids`` and ``subjects`` as in :meth:`fit`; without ``ids`` (and not a
        DataFrame) the rows get the next positions, which only a model whose ids are
        positions accepts. All or nothing: on any error the model is unchanged.

        Parameters
        ----------
        X : array-like or DataFrame, shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or float, optional
            The new rows' weights (None: 1 each), boxes ``w_i · C_`` with ``C_`` kept
            from ``fit`` (as in :meth:`fit`; zeros allowed here). Rows of the weight the
            model's rows all carry are added incrementally; other weights move the model
            to the weighted solver, which re-solves every row held on each change
            (refused for a model with ``audit_log`` or subjects).
        ids, subjects
            As in :meth:`fit`.

        Returns
        -------
        self
        """
        if "memory_" not in vars(self):
            return self.fit(X, sample_weight=sample_weight, ids=ids, subjects=subjects)
        labels = frame_labels(X)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False, ensure_min_samples=1)
        w = check_weights(sample_weight, len(X), allow_all_zero=True)
        memory, ledger = self.memory_, self._ledger
        weighted = isinstance(memory, WeightedMemory)
        if not weighted and uniform_weight(w) != self._unit():
            self._refuse_weighted(subjects)
            # subjects held (a loaded model: it may hold some when fitted under a key)
            if vars(self).get("_tagged", memory.view.commit_key_id is not None):
                self._refuse_weighted(subjects=True)
            weighted = True
        elif weighted:
            self._refuse_weighted(subjects)
        view = memory.view
        start = view.next_id
        row_ids, positional = ledger.new_ids(ids, labels, start, len(X), view.holds)
        tags = subject_tags(subjects, len(X), vars(self).get("_signing_key"))
        tokens = list(range(start, start + len(X)))  # the core's next ids, in order
        ledger.add(tokens, row_ids)  # (a name of a token not held is never read as held)
        try:
            if weighted:
                memory = self._as_weighted()
                added = memory.extend(X, np.ones(len(X)) if w is None else w)
            else:
                added = memory.extend(X, tags=tags)
            if added != tokens:
                raise RuntimeError(f"the memory gave the rows ids {added[:3]}…, not the next "
                                   f"positions {tokens[:3]}…")
        except BaseException:
            ledger.drop(tokens)
            raise
        ledger.positional = positional
        if tags is not None and any(t is not None for t in tags):
            self._tagged = True
        if memory is not self.memory_:  # taken over by the weighted solver
            self.memory_, self._unit_weight, self._support = memory, None, {}
        self.fit_path_ = memory.ingest_path
        self._warn_detached("these rows are not in the original's audit log")
        self._warn_box("partial_fit")
        return self

    def _as_weighted(self) -> WeightedMemory:
        """The memory under the weighted solver: itself, or a uniform model's rows (each of
        weight ``_unit()``) at their optimum, in a new :class:`WeightedMemory`."""
        memory = self.memory_
        if isinstance(memory, WeightedMemory):
            return memory
        unit = self._unit()
        ids = memory.ids
        alpha, at = np.zeros(len(ids)), {t: i for i, t in enumerate(ids)}
        support, _, a = memory.view.support()
        alpha[[at[int(t)] for t in support]] = a
        return WeightedMemory.from_rows(self.C_, memory.kernel, self.gamma_, self.tol, ids,
                                        memory.keys, np.full(len(ids), unit), alpha,
                                        memory.view.next_id)

    # --------------------------------------------------------------- forget
    def forget(self, X=None, *, ids=None, indices=None, subject=None) -> ForgetReceipt:
        """Remove rows exactly, as if they had never been seen; all or nothing.

        Give exactly one of

        * ``ids``: the rows' ids (``ids=`` at fit, a DataFrame's index labels, or
          positions),
        * ``subject``: every row of this data subject (``subjects=`` at fit), one
          receipt for the request,
        * ``X``: the rows themselves (every held row equal to a row of ``X``, all its
          copies),
        * ``indices``: positions (sample indices): only for a model whose ids are its
          positions; one fitted with other ids refuses them (they would name other rows).

        ``unfit`` is the same method.

        Returns
        -------
        ForgetReceipt
            The ids and positions removed (the subject), the core's certificates (for a
            subject its erasure receipt), the digest after, the refit recipe; signed
            when the model holds ``signing_key``. Its removals are in the model's audit
            log when it keeps one.

        Raises
        ------
        ValueError
            Not exactly one of the four; an id or position not held (never given, or
            forgotten already), given twice, or of the wrong type; a row that matches no
            held sample; a subject with no row held; positions on a model addressed by
            id. Nothing changes.
        NotFittedError
            Before ``fit``.
        """
        if "memory_" not in vars(self):  # (check_is_fitted's tag lookup was a tenth of a
            check_is_fitted(self, "memory_")  # small-support forget: only when unfitted)
        given = [name for name, v in (("X", X), ("ids", ids), ("indices", indices),
                                      ("subject", subject)) if v is not None]
        if len(given) != 1:
            raise ValueError("forget takes exactly one of X (the rows), ids=, subject= or "
                             f"indices= (positions), got {given or 'none'}")
        memory, ledger = self.memory_, self._ledger
        if subject is not None:
            return self._forget_subject(subject)
        if X is not None:
            X = validate_data(self, X, dtype=np.float64, order="C", reset=False,
                              ensure_min_samples=1)
            tokens = matching_tokens(X, memory.ids, memory.keys)
        elif indices is not None:
            if not ledger.positional:
                raise ValueError(
                    "forget(indices=...) takes positions, and this model's rows are "
                    "addressed by id (a DataFrame's index labels or ids= that are not the "
                    "rows' positions): a position would name another row. Give "
                    "forget(ids=...) with the rows' ids (e.g. the index labels)")
            tokens = self._checked_indices(indices)
        else:
            tokens = ledger.tokens(id_list(ids, "ids"), memory.view.holds)
        removed = ledger.ids_of(tokens)
        if isinstance(memory, WeightedMemory):
            return self._forget_weighted(memory, removed, tokens)
        certs = memory.remove_many(tokens)  # the change: atomic in the core
        ledger.drop(tokens)
        self._support.clear()  # the support before it holds the forgotten rows' values
        # the last certificate's digest is the state's after it (each removal's own)
        unit = self._unit()
        return self._issued(ForgetReceipt(
            ids=tuple(removed), positions=tuple(tokens), subject=None,
            certificates=tuple(certs), erasure=None, state_digest=certs[-1].state_digest,
            n_samples=len(memory), refit_with=self._recipe(),
            weights=None if unit == 1.0 else {"uniform": unit}))

    def _forget_weighted(self, memory: WeightedMemory, removed: list, tokens: list[int]
                         ) -> ForgetReceipt:
        """Remove rows under the weighted solver: re-solve the rows left (exact; the
        receipt declares the weights removed and those left, by digest)."""
        at = {int(t): i for i, t in enumerate(memory.tokens)}
        gone = [float(memory.weights[at[t]]) for t in tokens]
        memory.remove_many(tokens)  # the change: the state moves only once solved
        self._ledger.drop(tokens)
        self._support.clear()
        return self._issued(ForgetReceipt(
            ids=tuple(removed), positions=tuple(tokens), subject=None, certificates=(),
            erasure=None, state_digest=memory.state_digest(), n_samples=len(memory),
            refit_with=self._recipe(), weights=weight_record(memory, gone)))

    unfit = forget

    def _forget_subject(self, subject) -> ForgetReceipt:
        if not (isinstance(subject, str) and subject):
            raise TypeError(f"subject must be a non-empty str, got {subject!r:.40}")
        if isinstance(self.memory_, WeightedMemory):
            raise ValueError("forget(subject=...): this model is under unequal sample "
                             "weights and keeps no subjects; forget the rows by ids=")
        if vars(self).get("_signing_key") is None:
            raise ValueError("forget(subject=...): this model holds no key, so it keeps no "
                             "subjects (they are kept as keyed hashes: fit with "
                             "SVDD(signing_key=...) and subjects=; a pickled model holds no "
                             "key: SVDD.load(MODEL, signing_key=...))")
        memory = self.memory_
        if memory.view.n_tagged(subject) == 0:
            raise ValueError(f"subject {subject!r}: the model holds no row of this subject "
                             "(never given, or forgotten already)")
        erasure = memory.erase(subject)  # the change: atomic in the core, one receipt
        removed = self._ledger.ids_of(erasure.erased_ids)
        self._ledger.drop(erasure.erased_ids)
        self._support.clear()  # the support before it holds the erased rows' values
        return self._issued(ForgetReceipt(
            ids=tuple(removed), positions=tuple(erasure.erased_ids), subject=subject,
            certificates=(), erasure=erasure, state_digest=erasure.state_digest,
            n_samples=len(memory), refit_with=self._recipe()))

    def _issued(self, receipt: ForgetReceipt) -> ForgetReceipt:
        key = vars(self).get("_signing_key")
        self._warn_detached("this receipt is unsigned and the removal unlogged")
        self._warn_box("forget")
        if key is None and self.memory_.view.commit_key_id is not None and not vars(
                self).get("_detached"):
            warnings.warn("this model was fitted under the controller's key and is held "
                          "without it: this receipt is unsigned (SVDD.load(folder, "
                          "signing_key=...) signs)", UserWarning, stacklevel=3)
        return receipt if key is None else sign(receipt, key)

    def _warn_detached(self, consequence: str) -> None:
        """Warn when this model is a pickled (or copied) one whose key or log stayed with
        the original: a copy never holds them, and its changes are not the original's."""
        lost = sorted(set(vars(self).get("_detached", ())))
        if lost:
            warnings.warn(f"this model is a pickled or copied SVDD, and a copy holds no "
                          f"{' and no '.join(lost)}: {consequence} (SVDD.save and "
                          "SVDD.load(folder, signing_key=..., audit_log=...) carry a model "
                          "on with them)", UserWarning, stacklevel=3)

    def refit_recipe(self) -> dict:
        """The parameters of the fresh fit this model equals on the rows it holds:
        ``SVDD(**model.refit_recipe()).fit(rows)`` (``C`` is ``C_``, not ``nu``: the
        box ``nu`` sets moves with n)."""
        check_is_fitted(self, "memory_")
        return self._recipe()

    def _recipe(self) -> dict:
        return {"C": float(self.C_), "gamma": float(self.gamma_), "kernel": self.memory_.kernel}

    def _checked_indices(self, indices) -> list[int]:
        arr = np.asarray(indices)
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise ValueError(f"indices must be a non-empty 1-D sequence of ints, got {indices!r}")
        tokens = [int(i) for i in arr]
        if len(set(tokens)) != len(tokens):
            raise ValueError("indices lists a sample twice")
        missing = [i for i in tokens if not self.memory_.view.holds(i)]
        if missing:
            raise ValueError(f"indices {missing[:5]} are not held (never given, or forgotten)")
        return tokens

    # ------------------------------------------------- derived attributes
    def _support_attributes(self) -> SupportAttributes:
        """The support's attributes of the memory as it is now (one computation per
        state: keyed by the next position and the count, which every add and every
        removal changes)."""
        memory = self.memory_
        state = (memory.view.next_id, len(memory))
        held = self._support.get("attributes")
        if held is not None and held[0] == state:
            return held[1]
        attrs = support_attributes(memory, self.C_)
        self._support["attributes"] = (state, attrs)
        return attrs

    support_ = property(lambda self: self._support_attributes().positions,
                        doc="Positions (sample indices) of the support vectors.")
    support_vectors_ = property(lambda self: self._support_attributes().vectors,
                                doc="The support vectors, shape (n_SV, n_features).")
    dual_coef_ = property(lambda self: self._support_attributes().dual_coef,
                          doc="``alpha / C_`` of the support vectors, shape (1, n_SV).")
    offset_ = property(lambda self: self._support_attributes().offset,
                       doc="``(1 − mu) / (2 C_)`` (libsvm's rho).")

    @property
    def n_support_(self) -> np.ndarray:
        """The number of support vectors, shape (1,)."""
        return np.array([len(self.support_)], dtype=np.int32)

    @property
    def n_samples_(self) -> int:
        """Samples held now."""
        return len(self.memory_)

    @property
    def nu_(self) -> float:
        """``1 / (C_ · Σw)`` for the samples held now (``Σw = n`` without weights)."""
        total = float(self.weights_.sum())
        return 1.0 / (self.C_ * total) if total else math.inf

    @property
    def weights_(self) -> np.ndarray:
        """The ``sample_weight`` of every row held (aligned with ``ids_``; 1 when none
        was given): row ``i``'s box is ``weights_[i] · C_``."""
        memory = self.memory_
        if isinstance(memory, WeightedMemory):
            return memory.weights.copy()
        return np.full(len(memory), self._unit())

    @property
    def ids_(self) -> np.ndarray:
        """The ids of the rows held, in the order given."""
        return self._ledger.as_array(self.memory_.ids)

    @property
    def support_ids_(self) -> np.ndarray:
        """The ids of the support vectors (aligned with ``support_``)."""
        return self._ledger.as_array(self.support_)

    # ------------------------------------------------------------- predict
    def score_samples(self, X) -> np.ndarray:
        """``Σ dual_coef_ · k(sv, x) − (k(x, x) − 1) / (2 C_)`` (for rbf OneClassSVM's
        raw score ``Σ β k(sv, x)``); ``decision_function = score_samples − offset_``.

        Each row's value is computed alone (no BLAS blocking over the batch), so a
        sample scores the same in any batch and ``predict`` of a subset is the
        subset of ``predict``: points on the boundary sit at rounding distance from
        0, and a batch-dependent rounding would flip their side. A score within
        ``1e-11 · (|score| + |offset_|)`` of ``offset_`` is returned as ``offset_``: the
        sample is on the boundary (a margin support vector, ``f = 0`` in exact
        arithmetic), its decision exactly 0 and inside, so no last bit of a sum decides
        its side (nor whether a weight ``k`` and ``k`` copies of a row predict alike).
        """
        scores = self._raw_scores(X)
        offset = self._support_attributes().offset
        scores[np.abs(scores - offset) <= 1e-11 * (np.abs(scores) + abs(offset))] = offset
        return scores

    def _raw_scores(self, X) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        attrs = self._support_attributes()
        S, coef, g = attrs.vectors, attrs.dual_coef[0], self.gamma_
        kern = get_kernel(self.memory_.kernel)
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
        ``f(x) = R² − ‖φ(x) − a‖²``: positive inside (OneClassSVM's sign and scale).

        A sample on the boundary to rounding gets exactly 0 (:meth:`score_samples`)."""
        scores = self.score_samples(X)
        return scores - self._support_attributes().offset

    def predict(self, X) -> np.ndarray:
        """+1 for inliers (``decision_function >= 0``: on the boundary counts as
        inside), −1 for outliers."""
        return np.where(self.decision_function(X) >= 0, 1, -1)

    # ------------------------------------------------------- pickle, save
    def __getstate__(self) -> dict:
        # the controller's private key never enters a pickle (a path to it may); the
        # memory drops its own keys and log (SVDDMemory.__getstate__)
        state = dict(super().__getstate__())  # (object.__getstate__ is the live __dict__)
        if "memory_" in state:  # what the copy will not have, said when it forgets
            state["_detached"] = tuple(what for what, held in (
                ("signing key", state.get("_signing_key") is not None),
                ("audit log", self.audit_log is not None)) if held) + tuple(
                vars(self).get("_detached", ()))
        state.pop("_signing_key", None)
        if "_support" in state:  # rebuilt from the memory on first use: a cache of an
            state["_support"] = {}  # earlier state holds rows forgotten since
        if state.get("signing_key") is not None and not isinstance(
                state["signing_key"], (str, os.PathLike)):
            state["signing_key"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "memory_" in vars(self) and "_ledger" not in vars(self):
            # a model pickled before rows had ids: its ids are its positions, and its
            # support attributes (stored then) are derived now
            ledger = RowLedger()
            ledger.add(self.memory_.ids, self.memory_.ids)
            for name in ("support_", "support_vectors_", "dual_coef_", "offset_",
                         "n_support_", "n_samples_", "nu_"):
                vars(self).pop(name, None)
            self._ledger, self._support = ledger, {}

    def save(self, path: str | os.PathLike[str]) -> str:
        """Save the fitted model to the folder ``path``; return its state file's SHA-256.

        The folder holds ``memory.safetensors`` (the exact memory,
        :meth:`SVDDMemory.save`: written atomically, verified on load, and recorded in
        the model's audit log) and ``estimator.json`` (the parameters, ``C_``,
        ``gamma_``, the rows' ids and the state file's SHA-256), saved atomically across
        the two: killed anywhere, the folder loads to the model before or after
        (:mod:`svattn.estimators.saved`). **It holds the
        remaining rows themselves, and their ids: personal data**, to be kept as the
        training data is. It never holds the signing key. No pickle: an auditor loads
        it (:meth:`load`, ``svattn verify-forget-receipt``) without running code from it.
        """
        check_is_fitted(self, "memory_")
        folder = saved.model_folder(path)
        memory = self.memory_
        names = vars(self).get("feature_names_in_")
        fields = {
            "params": {k: v for k, v in self.get_params().items()
                       if k not in ("signing_key", "audit_log")},
            "C_": self.C_, "gamma_": self.gamma_, "fit_path_": self.fit_path_,
            "n_features_in_": self.n_features_in_,
            "feature_names_in_": None if names is None else [str(n) for n in names],
            "rows": self._ledger.to_dict(memory.ids),
            "state_digest": memory.state_digest(),
            "sample_weight": {"weighted": True} if isinstance(memory, WeightedMemory)
            else {"uniform": self._unit()},
        }
        return saved.save_model(folder, memory, fields)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, signing_key=None,
             audit_log: str | os.PathLike[str] | None = None) -> SVDD:
        """Load a model :meth:`save` wrote, checking its state file (digest, optimum,
        SHA-256 against ``estimator.json``, the rows' ids against its tokens).

        Parameters
        ----------
        path : path-like
            The folder.
        signing_key : str, path or Ed25519PrivateKey, optional
            The controller's key: later receipts are signed, subjects can be forgotten
            (it must be the key the model was fitted with).
        audit_log : path-like, optional
            The model's audit log, continued (it must end at this saved state).

        Raises
        ------
        FileNotFoundError
            No such folder or file in it.
        ValueError
            A malformed or inconsistent model (``StateFileError`` for the state file).
        """
        meta, where, state_path = saved.read_model_file(path)
        try:
            model = cls(**meta["params"], signing_key=signing_key, audit_log=audit_log)
        except TypeError as exc:
            raise ValueError(f"{where}: params: {exc}") from None
        key = model._key()
        saved.check_state_file(meta, state_path, where)
        weights = meta.get("sample_weight", {"uniform": 1.0})
        if "weighted" in weights:
            if audit_log is not None:
                raise ValueError(f"{where}: a model under unequal sample weights keeps no "
                                 "audit log (load it without audit_log=)")
            memory = WeightedMemory.load(state_path)
        else:
            memory = SVDDMemory.load(state_path, audit_log=audit_log, signing_key=key)
        try:
            ledger = RowLedger.from_dict(meta["rows"], memory.ids, where)
            saved.check_against_memory(meta, memory, where)
        except BaseException:
            memory.close_audit_log()
            raise
        model.memory_, model.C_, model.gamma_ = memory, float(meta["C_"]), float(meta["gamma_"])
        model.fit_path_ = meta["fit_path_"]
        model._unit_weight = weights.get("uniform")
        model.n_features_in_ = meta["n_features_in_"]
        if meta["feature_names_in_"] is not None:
            model.feature_names_in_ = np.array(meta["feature_names_in_"], dtype=object)
        model._ledger, model._signing_key, model._support = ledger, key, {}
        model._support_attributes()
        return model


def weight_record(memory: WeightedMemory, removed: list[float]) -> dict:
    """What a forget under unequal weights declares of them: the weights of the rows
    removed, and of the rows left their SHA-256 (``weight_digest``, in the order of
    ``ids_``), count and sum; the KKT residual of the re-solve."""
    return {"removed": removed, "sha256": weight_digest(memory.weights),
            "n": len(memory), "sum": float(memory.weights.sum()),
            "kkt_residual_after": float(memory.kkt_residual())}


__all__ = ["SVDD", "SupportAttributes", "support_attributes", "weight_record"]
