"""The SVDD ranking of one attention head's keys: the support first, the reserve last.

For keys ``x_1..x_n`` of one head the SVDD dual (docs/design.md §1, rbf kernel)

    minimize  αᵀKα − diag(K)ᵀα   subject to  Σα = 1,  0 <= α_i <= C,   C = 1 / (ν·n)

is solved exactly (:class:`svattn.SVDD`: libsvm's warm start and an exact float64
finish). The keys are then ordered lexicographically by

1. membership of the support (``α > 0``) — the support is ranked above every reserve key;
2. ``α`` (error keys at the box ``C`` before margin keys);
3. outlyingness ``−(Kα)_i``: with ``g_i = 2(Kα)_i − 1 + μ = R² − ‖φ(x_i) − a‖²`` (rbf,
   ``K_ii = 1``) a smaller ``(Kα)_i`` is a key further from the description's centre
   ``a``. It breaks the ties among the keys at the box and orders the reserve, whose
   ``α`` are all exactly 0;
4. position (the stable sort's last resort: equal keys).

The score of a key is its rank (0 for the first to evict, ``n − 1`` for the last), so
no two keys of a head tie and a top-k keeps exactly the k best of this order.

On a softmax model this is a ranking, not a certificate: reserve keys carry zero weight
in the SV readout ``Σ α_i k(q, x_i) v_i / Σ α_i k(q, x_i)``, but the model reads its
cache through softmax attention, where every key has weight ``> 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["HeadRanking", "rank_head", "rank_head_reference", "svdd_box"]


@dataclass(frozen=True)
class HeadRanking:
    """The SVDD order of one head's ``n`` keys.

    Attributes
    ----------
    score : ndarray of float64, shape (n,)
        The rank of each key (``0 .. n − 1``, higher = keep).
    support : ndarray of bool, shape (n,)
        ``α > 0``: the keys the SV readout reads.
    alpha : ndarray of float64, shape (n,)
        The SVDD coefficients (exactly 0 on the reserve).
    C, gamma : float
        The box bound and the rbf bandwidth used.
    """

    score: np.ndarray
    support: np.ndarray
    alpha: np.ndarray
    C: float
    gamma: float


def svdd_box(n: int, nu: float) -> float:
    """The box bound ``C = 1 / (ν·n)`` for ``n`` keys (at least ``ν·n`` carry weight).

    Raises
    ------
    ValueError
        When ``nu`` is not in (0, 1] or ``n < 1``.
    """
    if not (isinstance(nu, (int, float)) and 0.0 < float(nu) <= 1.0):
        raise ValueError(f"nu must be a number in (0, 1], got {nu!r}")
    if n < 1:
        raise ValueError(f"a head needs at least one key, got n={n}")
    return 1.0 / (float(nu) * n)


def _gamma(X: np.ndarray, gamma: float | None) -> float:
    """``gamma`` as given, else scikit-learn's ``"scale"``: 1 / (d · var(X)) (1 at var 0)."""
    if gamma is not None:
        if not (isinstance(gamma, (int, float)) and np.isfinite(gamma) and gamma > 0):
            raise ValueError(f"gamma must be a finite number > 0 or None, got {gamma!r}")
        return float(gamma)
    var = float(X.var())
    return 1.0 / (X.shape[1] * var) if var > 0 else 1.0


def _order(support: np.ndarray, alpha: np.ndarray, k_alpha: np.ndarray) -> np.ndarray:
    """Ranks from the lexicographic order (support, α, −Kα, position)."""
    n = len(alpha)
    # np.lexsort sorts by the last key first; ascending, so the kept-last come first
    order = np.lexsort((-np.arange(n), -k_alpha, alpha, support))
    score = np.empty(n)
    score[order] = np.arange(n, dtype=np.float64)
    return score


def _check_keys(X: object) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"keys must have shape (n_tokens, head_dim) with both >= 1, "
                         f"got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("keys must be finite")
    return X


def rank_head(X, *, nu: float, gamma: float | None = None) -> HeadRanking:
    """The SVDD order of one head's keys (fast path: :class:`svattn.SVDD`).

    Parameters
    ----------
    X : array-like, shape (n_tokens, head_dim)
        The keys (as the cache holds them: after the rotary embedding).
    nu : float in (0, 1]
        Sets the box ``C = 1 / (ν·n)``: at least ``ν·n`` keys are in the support.
    gamma : float, optional
        The rbf bandwidth; default ``1 / (head_dim · var(X))``.

    Returns
    -------
    HeadRanking
    """
    from svattn.estimators import SVDD  # scikit-learn's import on first use

    X = _check_keys(X)
    C = svdd_box(len(X), nu)
    g = _gamma(X, gamma)
    n = len(X)
    if C >= 1.0:  # one key carries everything (n·ν <= 1): the box never binds
        C = 1.0
    model = SVDD(C=C, kernel="rbf", gamma=g).fit(X)
    alpha = np.zeros(n)
    alpha[model.support_] = model.dual_coef_[0] * model.C_
    # score_samples = Σ (α_j / C) k(x_j, x) for rbf: (Kα)_i up to the factor 1/C
    k_alpha = model.score_samples(X)
    support = alpha > 0
    return HeadRanking(_order(support, alpha, k_alpha), support, alpha, C, g)


def rank_head_reference(X, *, nu: float, gamma: float | None = None) -> HeadRanking:
    """The same order from the independent oracle (slow, obviously correct).

    The full Gram matrix, :func:`svattn.exact.solve_svdd` (an interior-point QP and an
    exact active-set polish) and ``Kα`` as one matrix product: O(n²) memory, for tests.
    """
    from svattn.exact import kernel_matrix, solve_svdd

    X = _check_keys(X)
    C = min(svdd_box(len(X), nu), 1.0)
    g = _gamma(X, gamma)
    K = kernel_matrix(X, X, "rbf", g)
    alpha = solve_svdd(K, C)
    support = alpha > 0
    return HeadRanking(_order(support, alpha, (K @ alpha) / C), support, alpha, C, g)
