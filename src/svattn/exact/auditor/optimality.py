"""The auditor's proof that a state is the optimum of its tokens, from the keys alone.

The SVDD dual (``docs/design.md`` §1) is a convex QP. A point that is feasible
(``0 <= alpha <= C``, ``sum(alpha) = 1``) and satisfies the KKT conditions with a
multiplier ``mu`` is an optimum: for a convex problem with linear constraints the KKT
conditions are sufficient. So a state is the retrain's optimum when

* its ``alpha`` is feasible,
* every token's ``g_i = 2 (K alpha)_i − K_ii + mu`` has the sign its set requires
  (``g >= 0`` where ``alpha_i < C``, ``g <= 0`` where ``alpha_i > 0``), to the KKT
  residual's tolerance on the §1 scale, and
* (for ``alpha`` itself, not only the decision function) the optimum is unique: ``K`` is
  positive definite on the margin set together with every token tied at ``g = 0``.

:func:`check_optimality` reads all three off the keys, ``alpha`` and ``mu``, computing
``K`` itself: ``g`` from the support's kernel columns, recomputed from the keys in
blocks of rows (:func:`blocked_gradient`: one pass, O(n·|S|·d) time, O(block·|S|)
memory; never the n×n matrix, never a cache of the memory), and the uniqueness test a
Cholesky factor of ``K_TT − 1e-10·trace·I`` (:func:`uniqueness`). Nothing here imports
the solver: the inputs are plain arrays. :func:`dense_gradient` is the slow reference
(the whole Gram matrix, :func:`svattn.exact.core.kernels.gram_matrix`) that
``tests/exact/test_optimality.py`` holds the blocked pass to.

Why every optimum shares ``K alpha``: the objective is convex quadratic, so on the
optimal set ``K alpha`` is constant; with a non-empty margin set ``mu`` is fixed by
``g_S = 0``, so the decision function ``f = g`` is unique even when ``alpha`` is not.
Any other optimum ``alpha'`` keeps ``alpha'_i = alpha_i`` wherever ``g_i != 0``
(complementary slackness) and satisfies ``(alpha' − alpha)ᵀ K (alpha' − alpha) = 0``,
so with ``K_TT`` positive definite on the tokens ``T`` where ``g = 0`` it equals
``alpha``. With an empty margin set ``mu`` is a convention (§3: the largest optimal
value, or the smallest where the largest leaves a reserve token outside), checked as
one of the two ends of the optimal interval.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from svattn.exact.core.conventions import FEASIBILITY_SLACK, is_feasible
from svattn.exact.core.kernels import get_kernel, gram_matrix, kernel_matrix

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as a check advances (tokens or columns)."""

# A token is tied with the margin (its g could be 0 at another optimum) at
# |g| <= TIE · scale; K on the margin and tied tokens is positive definite when
# K_TT − PD_SHIFT · trace · I has a Cholesky factor (the memory's thresholds, §3).
TIE = 1e-9
PD_SHIFT = 1e-10
# Rows per block of the gradient pass: BLOCK_ENTRIES kernel values at a time (32 MB of
# float64; the kernel's temporaries take about twice that).
BLOCK_ENTRIES = 1 << 22
# The smallest C a state may name: ceil(1/C) tokens are the warm-up threshold, and below
# 2**-53 that count is not an integer float64 can hold (no memory reaches it).
C_MIN = 2.0 ** -53


def parameter_errors(C: object, n: int, warm: bool) -> list[str]:
    """Why ``C`` (with ``n`` tokens, in warm-up or not) cannot describe a state any memory
    builds (empty: sane). These make the input malformed, not the proof false.

    Examples
    --------
    >>> parameter_errors(0.1, 20, False), parameter_errors(1e-300, 4, True)[0][:40]
    ([], 'C: 1e-300 is below 2**-53 (the smallest ')
    """
    try:
        finite = not isinstance(C, bool) and math.isfinite(float(C))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # not a number, or an int no float holds
        finite = False
    if not finite:
        return [f"C: {C!r:.40} is not a finite number"]
    C = float(C)  # type: ignore[arg-type]
    if C <= 0:
        return [f"C: {C!r} must be > 0 (the box 0 <= alpha <= C holds no point)"]
    if C > 1:
        return [f"C: {C!r} is above 1 (a memory caps C at 1: the box never binds above it)"]
    if C < C_MIN:
        return [f"C: {C!r} is below 2**-53 (the smallest C whose warm-up threshold "
                "ceil(1/C) a float64 counts exactly): no memory reaches a solved state, and "
                "the state is not one a memory writes"]
    if not warm and n > 0 and not is_feasible(n, float(C)):
        return [f"C: the state claims a solved optimum, but n·C = {n * C:.6g} < 1: the "
                f"problem with {n} tokens has no feasible point (it would be in warm-up)"]
    return []


@dataclass(frozen=True)
class OptimalityReport:
    """What :func:`check_optimality` found: ``ok`` when the state is a proven optimum of
    its tokens (every failed condition named in ``reasons``).

    Attributes
    ----------
    n, n_support : int
        Tokens, and tokens with ``alpha > 0`` (the kernel columns the pass computed).
    kkt_residual : float
        The §1 residual: the largest of the primal violations (``|sum(alpha) − 1|``,
        ``−min alpha``, ``max alpha − C``) and every token's signed violation of its
        KKT condition divided by ``max(K_ii + 2 (K alpha)_i + |mu|, 1)``.
    worst_token : int or None
        Position of the token with the largest dual violation.
    unique : bool
        ``K`` is positive definite on the margin set and the tied tokens
        (``uniqueness`` says why not).
    n_tied : int
        Tokens at ``alpha`` 0 or C with ``|g| <= 1e-9 · scale``.
    mu_rule : str
        How ``mu`` was fixed: ``"margin"`` (by ``g_S = 0``), ``"largest"`` /
        ``"smallest"`` (an empty margin set: §3's convention), ``"warm-up"`` (``0``),
        ``"empty"`` (no tokens: ``0``), or ``"none"`` (no convention fits).
    seconds : float
        Wall time of the checks.
    """

    n: int
    n_support: int
    kkt_residual: float
    worst_token: int | None
    unique: bool
    uniqueness: str
    n_tied: int
    mu_rule: str
    warm: bool
    seconds: float
    tol: float
    reasons: tuple[str, ...] = ()
    g: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Every condition holds: the state is an optimum of its tokens."""
        return not self.reasons

    def summary(self) -> str:
        """One line for people."""
        if self.n == 0:
            return "no tokens: the retrain of nothing is the empty state (mu = 0)"
        if self.warm:
            return (f"warm-up (n·C < 1): alpha = 1/{self.n} on every token and mu = 0, as a "
                    "retrain sets them")
        return (f"KKT residual {self.kkt_residual:.1e} over {self.n:,} tokens "
                f"({self.n_support:,} kernel columns), optimum "
                f"{'unique' if self.unique else 'NOT unique'} ({self.uniqueness}), "
                f"mu: {self.mu_rule}, {self.seconds:.2f} s")


def blocked_gradient(keys: np.ndarray, alpha: np.ndarray, mu: float, kernel: str,
                     gamma: float, *, block_entries: int = BLOCK_ENTRIES,
                     progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every token's ``g_i = 2 (K alpha)_i − K_ii + mu`` and the size of its terms
    ``K_ii + 2 (K alpha)_i + |mu|``, from the keys: the support's kernel columns
    recomputed a block of rows at a time (O(n·|S|·d) time, O(block·|S|) memory).

    Parameters
    ----------
    keys : array, shape (n, d)
    alpha : array, shape (n,)
    mu, kernel, gamma
        The multiplier and the kernel (:func:`svattn.exact.core.kernels.kernel_matrix`).
    block_entries : int
        Kernel values per block (rows per block: this over ``|S|``).
    progress : callable, optional
        ``progress("KKT", rows done, n)`` after each block.

    Examples
    --------
    >>> x = np.array([[0.0], [1.0], [3.0]])
    >>> g, size = blocked_gradient(x, np.array([0.5, 0.5, 0.0]), 0.1, "rbf", 1.0)
    >>> bool(np.allclose(g, dense_gradient(x, np.array([0.5, 0.5, 0.0]), 0.1, "rbf", 1.0)[0]))
    True
    """
    keys = np.ascontiguousarray(keys, dtype=np.float64)
    n = len(keys)
    support = np.flatnonzero(alpha > 0)
    xs, a_s = keys[support], alpha[support]
    diag = get_kernel(kernel).diag(keys, gamma) if n else np.zeros(0)
    ka = np.empty(n)
    rows = max(1, block_entries // max(1, len(support)))
    for lo in range(0, n, rows):
        hi = min(n, lo + rows)
        ka[lo:hi] = kernel_matrix(keys[lo:hi], xs, kernel, gamma) @ a_s
        if progress is not None:
            progress("KKT", hi, n)
    g = 2.0 * ka - diag + mu
    return g, diag + 2.0 * ka + abs(mu)


def dense_gradient(keys: np.ndarray, alpha: np.ndarray, mu: float, kernel: str,
                   gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`blocked_gradient` the obvious way: the whole n×n Gram matrix (the slow
    reference, for small n)."""
    K = gram_matrix(np.asarray(keys, dtype=np.float64), kernel, gamma)
    ka = K @ alpha
    d = np.diag(K)
    return 2.0 * ka - d + mu, d + 2.0 * ka + abs(mu)


def kkt_violations(alpha: np.ndarray, C: float, g: np.ndarray, size: np.ndarray
                   ) -> tuple[float, np.ndarray]:
    """The primal violation and each token's relative dual violation: ``alpha_i > 0``
    needs ``g_i <= 0``, ``alpha_i < C`` needs ``g_i >= 0`` (both: ``g_i = 0``), each
    divided by ``max(size_i, 1)`` (§1). The partition is read off ``alpha`` alone."""
    primal = max(abs(float(alpha.sum()) - 1.0), float(np.max(-alpha, initial=0.0)),
                 float(np.max(alpha - C, initial=0.0)))
    up = np.where(alpha > 0, np.maximum(g, 0.0), 0.0)  # weight that should leave
    down = np.where(alpha < C, np.maximum(-g, 0.0), 0.0)  # weight that should come
    return primal, np.maximum(up, down) / np.maximum(size, 1.0)


def uniqueness(keys: np.ndarray, alpha: np.ndarray, C: float, g: np.ndarray, scale: float,
               kernel: str, gamma: float, *, progress: Progress | None = None
               ) -> tuple[bool, str, int]:
    """Whether the optimum is unique, why (a phrase), and how many tokens are tied.

    ``T`` is the margin set (``0 < alpha < C``) with every token at 0 or C whose
    ``|g| <= 1e-9 · scale``; ``alpha`` is unique when ``K_TT`` is positive definite,
    tested as a Cholesky factor of ``K_TT − 1e-10 · trace(K_TT) · I`` with ``K_TT``
    computed from the keys. Two bitwise-equal keys in ``T`` make it singular.
    """
    margin = (alpha > 0) & (alpha < C)
    tied = ~margin & (np.abs(g) <= TIE * scale)
    T = np.flatnonzero(margin | tied)
    n_tied = int(tied.sum())
    if len(T) <= 1:
        return True, f"|T| = {len(T)}", n_tied
    xt = np.ascontiguousarray(keys[T])
    rows = xt.view(np.dtype((np.void, xt.dtype.itemsize * xt.shape[1]))).ravel()
    if len(np.unique(rows)) < len(rows):
        return False, f"two equal keys among the {len(T)} margin and tied tokens", n_tied
    if progress is not None:
        progress("uniqueness", 0, len(T))
    K = gram_matrix(xt, kernel, gamma)
    shift = PD_SHIFT * float(np.trace(K))
    K[np.diag_indices_from(K)] -= shift
    try:
        np.linalg.cholesky(K)
    except np.linalg.LinAlgError:
        return False, (f"K on the {len(T)} margin and tied tokens is not positive definite "
                       f"(no Cholesky factor of K_TT − {PD_SHIFT:.0e}·trace·I)"), n_tied
    finally:
        if progress is not None:
            progress("uniqueness", len(T), len(T))
    return True, f"Cholesky of K_TT − {PD_SHIFT:.0e}·trace·I, |T| = {len(T)}", n_tied


def _mu_rule(alpha: np.ndarray, C: float, g: np.ndarray, mu: float, size: np.ndarray,
             tol: float) -> str:
    """How ``mu`` is fixed (see :class:`OptimalityReport`); with an empty margin set the
    optimal interval is ``[mu − min_R g, mu − max_E g]`` and §3 takes an end of it."""
    if ((alpha > 0) & (alpha < C)).any():
        return "margin"
    err, res = alpha >= C, alpha <= 0
    top = mu - float(g[err].max()) if err.any() else math.inf  # largest mu: max g_E = 0
    low = mu - float(g[res].min()) if res.any() else -math.inf  # smallest: min g_R = 0
    unit = float(np.max(np.maximum(size, 1.0)))
    if math.isfinite(top) and abs(mu - top) <= tol * unit:
        return "largest"
    if math.isfinite(low) and abs(mu - low) <= tol * unit:
        return "smallest"
    return "none"


def check_optimality(keys: np.ndarray, alpha: np.ndarray, mu: float, C: float, kernel: str,
                     gamma: float, *, warm: bool, tol: float = 1e-8,
                     block_entries: int = BLOCK_ENTRIES, progress: Progress | None = None,
                     keep_g: bool = False) -> OptimalityReport:
    """Prove (or refute) that ``(alpha, mu)`` is the optimum a retrain of ``keys`` finds.

    Parameters
    ----------
    keys, alpha, mu
        The state's tokens (any order), coefficients aligned with them, and multiplier.
    C, kernel, gamma
        The problem (``C`` sane: :func:`parameter_errors` empty).
    warm : bool
        The state says it is in warm-up (``n·C < 1``): then the retrain's state is the
        convention, ``alpha = 1/n`` (to rounding) and ``mu = 0``.
    tol : float
        Bound on the KKT residual (§1 scale).
    progress : callable, optional
        ``progress(stage, done, total)`` as the pass advances.
    keep_g : bool
        Keep the recomputed ``g`` in the report (tests).

    Returns
    -------
    OptimalityReport
        ``ok`` when feasibility, the KKT conditions and ``mu``'s convention hold; the
        uniqueness test's result is ``unique`` (not a failure: a non-unique optimum is
        still an optimum, and its decision function is still unique).

    Examples
    --------
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.2)
    >>> _ = mem.extend(np.random.default_rng(0).normal(size=(50, 3)))
    >>> rep = check_optimality(mem.keys, mem.alpha, mem.mu, mem.C, mem.kernel,
    ...                        mem.gamma_value, warm=mem.warm)
    >>> rep.ok, rep.unique, rep.kkt_residual < 1e-12
    (True, True, True)
    >>> bad = mem.alpha; bad[np.flatnonzero(bad > 0)[:2]] += [1e-6, -1e-6]
    >>> check_optimality(mem.keys, bad, mem.mu, mem.C, mem.kernel, mem.gamma_value,
    ...                  warm=False).ok
    False
    """
    start = time.perf_counter()
    keys = np.asarray(keys, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    n = len(alpha)
    reasons: list[str] = []

    def report(**kw) -> OptimalityReport:
        base = dict(n=n, n_support=int((alpha > 0).sum()), kkt_residual=0.0, worst_token=None,
                    unique=True, uniqueness="", n_tied=0, mu_rule="none", warm=warm, tol=tol,
                    seconds=time.perf_counter() - start, reasons=tuple(reasons))
        return OptimalityReport(**{**base, **kw})

    if not math.isfinite(mu) or not np.isfinite(alpha).all():
        reasons.append("alpha and mu must be finite numbers")
        return report(kkt_residual=math.inf)
    if n == 0:  # a retrain of no tokens: no coefficients, and mu is the empty state's 0
        if mu != 0.0:
            reasons.append(f"mu: the state holds no tokens but mu = {mu!r} (an empty "
                           "memory's is 0)")
        return report(uniqueness="no tokens", mu_rule="empty")
    feasible = is_feasible(n, C)
    if warm or not feasible:
        if feasible:
            reasons.append(f"the state is in warm-up, but n·C = {n * C:.6g} >= 1 "
                           f"(within {FEASIBILITY_SLACK:g}): a retrain solves the problem")
        off = float(np.max(np.abs(alpha - 1.0 / n)))
        if not off <= 4 * np.finfo(np.float64).eps / n:  # set exactly, as 1.0 / n
            reasons.append(f"alpha: in warm-up every token carries 1/{n}; the state is "
                           f"{off:.2e} from it")
        if mu != 0.0:
            reasons.append(f"mu: in warm-up mu is 0, the state's is {mu!r}")
        return report(kkt_residual=off, uniqueness="warm-up convention", mu_rule="warm-up")
    g, size = blocked_gradient(keys, alpha, mu, kernel, gamma, block_entries=block_entries,
                               progress=progress)
    primal, dual = kkt_violations(alpha, C, g, size)
    worst = int(np.argmax(dual))
    kkt = max(primal, float(dual[worst]))
    if not primal <= tol:
        reasons.append(f"alpha is not feasible: |sum(alpha) − 1|, −min alpha or "
                       f"max alpha − C reaches {primal:.2e} (above {tol:.0e})")
    if not float(dual[worst]) <= tol:
        reasons.append(f"KKT residual {kkt:.2e} above {tol:.0e}, recomputed from the keys "
                       f"(worst at token position {worst}: alpha {alpha[worst]:.6g}, "
                       f"g {g[worst]:.3e})")
    rule = _mu_rule(alpha, C, g, mu, size, tol)
    if rule == "none":
        reasons.append("mu: the margin set is empty and mu is neither end of its optimal "
                       "interval (docs/design.md §3's convention)")
    scale = max(1.0, float(get_kernel(kernel).diag(keys, gamma).max()))  # as the memory's
    unique, why, n_tied = uniqueness(keys, alpha, C, g, scale, kernel, gamma, progress=progress)
    return report(kkt_residual=kkt, worst_token=worst, unique=unique, uniqueness=why,
                  n_tied=n_tied, mu_rule=rule, g=g if keep_g else None)


__all__ = ["OptimalityReport", "Progress", "blocked_gradient", "check_optimality",
           "dense_gradient", "kkt_violations", "parameter_errors", "uniqueness"]
